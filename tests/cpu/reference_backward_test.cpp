// The fp64 backward reference (cpu_reference_backward) against the forward reference itself: each
// gradient entry is the derivative of L = Σ dO ∘ O, which a central difference of the forward
// measures to about 1e-8 here. Shapes: GQA (two query heads per KV head, so dK and dV are sums),
// N_q != N_kv, causal in both alignments (bottom-right with N_q > N_kv leaves rows that see no
// key: their dQ must be exactly 0 and nothing may be NaN), and strided (B, N, H, D) layouts. And
// Part VI's score modifications, alone and together with causal masks and windows: softcap (its
// derivative in dQ and dK), ALiBi per head and per (batch, head), and sinks (their own gradient,
// checked the same way, and rows that see no key but their sink).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include "reference/cpu_reference.h"

namespace fa {
namespace {

struct Problem {
  AttentionParams p;
  std::vector<float> q, k, v, d_o;
  std::vector<float> alibi_slopes, sinks;  // host copies, used when p sets the pointers
  ReferenceScoreMods mods() const {
    return {p.alibi_slopes ? alibi_slopes.data() : nullptr, p.sinks ? sinks.data() : nullptr};
  }
};

// Part VI's score modifications on a problem (the pointers are stand-ins: the reference reads the
// host copies). slopes_per_batch: (B, H_q) slopes instead of (H_q).
void add_softcap(Problem& x, float cap) {
  x.p.softcap = cap;
}
void add_alibi(Problem& x, bool slopes_per_batch) {
  const int64_t n = slopes_per_batch ? x.p.batch * x.p.heads_q : x.p.heads_q;
  x.alibi_slopes.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) x.alibi_slopes[size_t(i)] = 0.05f * float(i + 1);
  x.p.alibi_slopes = x.alibi_slopes.data();
  x.p.alibi_slopes_stride_batch = slopes_per_batch ? x.p.heads_q : 0;
}
void add_sinks(Problem& x) {
  x.sinks.resize(size_t(x.p.heads_q));
  for (int64_t h = 0; h < x.p.heads_q; ++h) x.sinks[size_t(h)] = 0.5f * float(h) - 0.8f;
  x.p.sinks = x.sinks.data();
}

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
  const ReferenceOutput r = cpu_reference(p, x.q.data(), x.k.data(), x.v.data(), x.mods());
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

// Every element of Q, K and V (B·N·H·D of each), and each sink: the analytic gradient against the
// numeric one.
void check_all(const Problem& x, const std::string& what) {
  const AttentionParams& p = x.p;
  const ReferenceGradients g = cpu_reference_backward(p, x.q.data(), x.k.data(), x.v.data(), x.d_o.data(), x.mods());
  ASSERT_EQ(g.dsinks.size(), p.sinks ? size_t(p.heads_q) : size_t(0)) << what;
  for (int64_t h = 0; h < int64_t(g.dsinks.size()); ++h) {
    const double analytic = g.dsinks[size_t(h)];
    ASSERT_TRUE(std::isfinite(analytic)) << what << " dsink h" << h;
    EXPECT_LT(std::abs(analytic - numeric(x, &Problem::sinks, size_t(h))), 1e-6 * std::max(1.0, std::abs(analytic)))
        << what << " dsink h" << h << ": analytic " << analytic;
  }
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

// ---- Part VI's score modifications ------------------------------------------------------------

// Softcap 2 on scores of unit variance times 0.7·√8: many land in tanh's bend, where its derivative
// is far from 1, so a backward without it fails here.
TEST(CpuReferenceBackward, SoftcapMatchesCentralDifferences) {
  Problem x = make(5, 7, true, CausalAlign::bottom_right, 11);
  add_softcap(x, 2.0f);
  check_all(x, "softcap");
}

TEST(CpuReferenceBackward, AlibiPerHeadMatchesCentralDifferences) {
  Problem x = make(7, 5, false, CausalAlign::top_left, 12);
  add_alibi(x, /*slopes_per_batch=*/false);
  check_all(x, "alibi per head");
}

TEST(CpuReferenceBackward, AlibiPerBatchAndHeadMatchesCentralDifferences) {
  Problem x = make(5, 7, true, CausalAlign::top_left, 13);
  add_alibi(x, /*slopes_per_batch=*/true);
  check_all(x, "alibi per batch and head");
}

TEST(CpuReferenceBackward, SinksMatchCentralDifferences) {
  Problem x = make(5, 7, false, CausalAlign::top_left, 14);
  add_sinks(x);
  check_all(x, "sinks");
}

// All three at once, under a causal mask and a window, in the alignment that leaves rows with no
// key (N_q > N_kv, bottom-right): those rows have their sink alone.
TEST(CpuReferenceBackward, AllScoreModsWithAWindowMatchCentralDifferences) {
  Problem x = make(7, 4, true, CausalAlign::bottom_right, 15);
  x.p.window_left = 2;
  add_softcap(x, 3.0f);
  add_alibi(x, /*slopes_per_batch=*/true);
  add_sinks(x);
  check_all(x, "softcap + alibi + sinks + window");
}

// A row that sees no key but has a sink: O = 0, LSE = the sink, dQ = 0 and no sink gradient from it
// (D = 0); without the sink the same row has LSE = −inf.
TEST(CpuReferenceBackward, RowsThatSeeNoKeyHaveTheirSinkAlone) {
  Problem x = make(7, 4, true, CausalAlign::bottom_right, 16);
  add_sinks(x);
  const AttentionParams& p = x.p;
  const ReferenceOutput r = cpu_reference(p, x.q.data(), x.k.data(), x.v.data(), x.mods());
  const ReferenceGradients g = cpu_reference_backward(p, x.q.data(), x.k.data(), x.v.data(), x.d_o.data(), x.mods());
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q - p.seqlen_kv; ++i) {
        const int64_t row = (b * p.heads_q + h) * p.seqlen_q + i;
        EXPECT_EQ(r.lse[size_t(row)], double(x.sinks[size_t(h)])) << "b" << b << " h" << h << " row " << i;
        EXPECT_EQ(g.delta[size_t(row)], 0.0);
        for (int64_t d = 0; d < p.head_dim; ++d) {
          EXPECT_EQ(r.o[size_t(row * p.head_dim + d)], 0.0);
          EXPECT_EQ(g.dq[size_t(row * p.head_dim + d)], 0.0);
        }
      }
}

// Each modification at its neutral setting is the plain attention, and a sink at −60 (e^−60 next to
// a row's terms) changes nothing measurable; a huge cap leaves the scores: bitwise where the
// operation is exact, to 1e-12 where tanh rounds.
TEST(CpuReferenceBackward, NeutralScoreModsAreThePlainAttention) {
  const Problem plain = make(6, 9, true, CausalAlign::top_left, 17);
  const ReferenceOutput want = cpu_reference(plain.p, plain.q.data(), plain.k.data(), plain.v.data());
  Problem zero_slopes = plain, low_sinks = plain, huge_cap = plain;
  add_alibi(zero_slopes, false);
  for (float& s : zero_slopes.alibi_slopes) s = 0.0f;
  add_sinks(low_sinks);
  for (float& s : low_sinks.sinks) s = -60.0f;
  add_softcap(huge_cap, 1e9f);
  for (const Problem* x : {&zero_slopes, &low_sinks, &huge_cap}) {
    const ReferenceOutput got = cpu_reference(x->p, x->q.data(), x->k.data(), x->v.data(), x->mods());
    for (size_t i = 0; i < want.o.size(); ++i) ASSERT_NEAR(got.o[i], want.o[i], 1e-12) << i;
    for (size_t i = 0; i < want.lse.size(); ++i) ASSERT_NEAR(got.lse[i], want.lse[i], 1e-12) << i;
  }
}

// ALiBi's bias is −slope·|i + N_kv − N_q − j| whatever causal_align says (flash-attn's): one query row
// against two keys, the scores equal, so O's weights are the bias's alone.
TEST(CpuReferenceBackward, AlibiIsAlignedBottomRight) {
  Problem x = make(1, 2, false, CausalAlign::top_left, 18);
  x.p.batch = x.p.heads_q = x.p.heads_kv = 1;
  x.p.head_dim = 1;
  x.p.q_stride = x.p.o_stride = Strides{1, 1, 1, 1};
  x.p.k_stride = x.p.v_stride = Strides{2, 2, 1, 1};
  x.q = {0.0f};  // every score 0
  x.k = {1.0f, 2.0f};
  x.v = {1.0f, 0.0f};  // O = the weight of key 0
  add_alibi(x, false);
  x.alibi_slopes = {1.0f};
  // Row 0 sits at the diagonal's key 1 (0 + 2 − 1): key 0 is one step away, weight e^−1 / (1 + e^−1).
  const ReferenceOutput r = cpu_reference(x.p, x.q.data(), x.k.data(), x.v.data(), x.mods());
  EXPECT_NEAR(r.o[0], std::exp(-1.0) / (1.0 + std::exp(-1.0)), 1e-12);
}

// A problem whose pointers are set without the host copies is refused, not run without them.
TEST(CpuReferenceBackward, ScoreModArraysAreRequired) {
  Problem x = make(3, 3, false, CausalAlign::top_left, 19);
  add_sinks(x);
  EXPECT_THROW(cpu_reference(x.p, x.q.data(), x.k.data(), x.v.data()), std::invalid_argument);
}

}  // namespace
}  // namespace fa
