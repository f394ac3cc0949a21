// The fp64 backward reference (cpu_reference_backward) against the forward reference itself: each
// gradient entry is the derivative of L = Σ dO ∘ O, which a central difference of the forward
// measures to about 1e-8 here. Shapes: GQA (two query heads per KV head, so dK and dV are sums),
// N_q != N_kv, causal in both alignments (bottom-right with N_q > N_kv leaves rows that see no
// key: their dQ must be exactly 0 and nothing may be NaN), and strided (B, N, H, D) layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "reference/cpu_reference.h"

namespace fa {
namespace {

struct Problem {
  AttentionParams p;
  std::vector<float> q, k, v, d_o;
};

// (B, N, H, D) storage: the layout flash-attn takes, so every stride differs from a packed BHND's.
Problem make(int64_t nq, int64_t nkv, bool causal, CausalAlign align, unsigned seed) {
  Problem x;
  AttentionParams& p = x.p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = nq;
  p.seqlen_kv = nkv;
  p.head_dim = 8;
  p.causal = causal;
  p.causal_align = align;
  p.softmax_scale = 0.7f;
  auto bnhd = [&](Strides& s, int64_t n, int64_t h) {
    s.dim = 1;
    s.head = p.head_dim;
    s.seq = h * p.head_dim;
    s.batch = n * h * p.head_dim;
  };
  bnhd(p.q_stride, nq, p.heads_q);
  bnhd(p.k_stride, nkv, p.heads_kv);
  bnhd(p.v_stride, nkv, p.heads_kv);
  bnhd(p.o_stride, nq, p.heads_q);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& t, int64_t n, int64_t h) {
    t.resize(size_t(p.batch * n * h * p.head_dim));
    for (float& e : t) e = normal(rng);
  };
  fill(x.q, nq, p.heads_q);
  fill(x.k, nkv, p.heads_kv);
  fill(x.v, nkv, p.heads_kv);
  fill(x.d_o, nq, p.heads_q);
  return x;
}

// L = Σ dO ∘ O over every output element (O contiguous BHND in the reference's output).
double loss(const Problem& x) {
  const AttentionParams& p = x.p;
  const ReferenceOutput r = cpu_reference(p, x.q.data(), x.k.data(), x.v.data());
  double l = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i)
        for (int64_t d = 0; d < p.head_dim; ++d)
          l += double(x.d_o[size_t(b * p.o_stride.batch + h * p.o_stride.head + i * p.o_stride.seq + d)]) *
               r.o[size_t(((b * p.heads_q + h) * p.seqlen_q + i) * p.head_dim + d)];
  return l;
}

// dL/dt[at] by a central difference. The step is what float can represent: the perturbed input is
// rounded to float, and the true step is measured after rounding.
double numeric(Problem x, std::vector<float> Problem::*t, size_t at) {
  const float base = (x.*t)[at];
  const float up = base + 1e-4f, down = base - 1e-4f;
  (x.*t)[at] = up;
  const double l_up = loss(x);
  (x.*t)[at] = down;
  const double l_down = loss(x);
  return (l_up - l_down) / (double(up) - double(down));
}

// Every element of Q, K and V (B·N·H·D of each): the analytic gradient against the numeric one.
void check_all(const Problem& x, const std::string& what) {
  const AttentionParams& p = x.p;
  const ReferenceGradients g = cpu_reference_backward(p, x.q.data(), x.k.data(), x.v.data(), x.d_o.data());
  const int64_t D = p.head_dim;
  struct Tensor {
    const char* name;
    std::vector<float> Problem::*t;
    const std::vector<double>* grad;
    Strides stride;
    int64_t n, h;
  };
  for (const Tensor& t : {Tensor{"dQ", &Problem::q, &g.dq, p.q_stride, p.seqlen_q, p.heads_q},
                          Tensor{"dK", &Problem::k, &g.dk, p.k_stride, p.seqlen_kv, p.heads_kv},
                          Tensor{"dV", &Problem::v, &g.dv, p.v_stride, p.seqlen_kv, p.heads_kv}}) {
    double worst = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < t.h; ++h)
        for (int64_t i = 0; i < t.n; ++i)
          for (int64_t d = 0; d < D; ++d) {
            const size_t at = size_t(b * t.stride.batch + h * t.stride.head + i * t.stride.seq + d);
            const double analytic = (*t.grad)[size_t(((b * t.h + h) * t.n + i) * D + d)];
            ASSERT_TRUE(std::isfinite(analytic)) << what << " " << t.name << " at b" << b << " h" << h << " n" << i;
            const double err = std::abs(analytic - numeric(x, t.t, at));
            worst = std::max(worst, err);
            ASSERT_LT(err, 1e-6 * std::max(1.0, std::abs(analytic)))
                << what << " " << t.name << " at b" << b << " h" << h << " n" << i << " d" << d << ": analytic "
                << analytic;
          }
    std::ostringstream worst_text;
    worst_text << std::scientific << worst;
    ::testing::Test::RecordProperty(what + "_" + t.name + "_worst", worst_text.str());
  }
}

TEST(CpuReferenceBackward, MatchesCentralDifferencesNonCausal) {
  check_all(make(5, 7, false, CausalAlign::top_left, 1), "non-causal");
}

TEST(CpuReferenceBackward, MatchesCentralDifferencesCausalTopLeft) {
  check_all(make(7, 5, true, CausalAlign::top_left, 2), "causal top-left");
}

TEST(CpuReferenceBackward, MatchesCentralDifferencesCausalBottomRight) {
  check_all(make(5, 7, true, CausalAlign::bottom_right, 3), "causal bottom-right");
}

// Bottom-right with N_q > N_kv: the first N_q − N_kv rows see no key. Their dQ is exactly 0 (no
// gradient flows through a row whose output is the constant 0), D is 0, and nothing is NaN.
TEST(CpuReferenceBackward, RowsThatSeeNoKeyGetZeroGradients) {
  const Problem x = make(7, 4, true, CausalAlign::bottom_right, 4);
  check_all(x, "fully masked rows");
  const AttentionParams& p = x.p;
  const ReferenceGradients g = cpu_reference_backward(p, x.q.data(), x.k.data(), x.v.data(), x.d_o.data());
  for (int64_t bh = 0; bh < p.batch * p.heads_q; ++bh)
    for (int64_t i = 0; i < p.seqlen_q - p.seqlen_kv; ++i) {
      EXPECT_EQ(g.delta[size_t(bh * p.seqlen_q + i)], 0.0);
      for (int64_t d = 0; d < p.head_dim; ++d) EXPECT_EQ(g.dq[size_t((bh * p.seqlen_q + i) * p.head_dim + d)], 0.0);
    }
}

// D_i = rowsum(dO ∘ O), with O from the forward reference.
TEST(CpuReferenceBackward, DeltaIsRowsumOfDoTimesO) {
  const Problem x = make(6, 9, true, CausalAlign::top_left, 5);
  const AttentionParams& p = x.p;
  const ReferenceOutput r = cpu_reference(p, x.q.data(), x.k.data(), x.v.data());
  const ReferenceGradients g = cpu_reference_backward(p, x.q.data(), x.k.data(), x.v.data(), x.d_o.data());
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        double want = 0;
        for (int64_t d = 0; d < p.head_dim; ++d)
          want += double(x.d_o[size_t(b * p.o_stride.batch + h * p.o_stride.head + i * p.o_stride.seq + d)]) *
                  r.o[size_t(((b * p.heads_q + h) * p.seqlen_q + i) * p.head_dim + d)];
        EXPECT_NEAR(g.delta[size_t((b * p.heads_q + h) * p.seqlen_q + i)], want, 1e-12);
      }
}

}  // namespace
}  // namespace fa
