// The fp64 CPU reference is the ground truth of the course, so it is checked against numbers
// worked out by hand and against the textbook softmax formula written independently.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "reference/cpu_reference.h"

namespace fa {
namespace {

AttentionParams tiny(int64_t nq, int64_t nkv, int64_t d) {
  AttentionParams p;
  p.batch = p.heads_q = p.heads_kv = 1;
  p.seqlen_q = nq;
  p.seqlen_kv = nkv;
  p.head_dim = d;
  set_bhnd_strides(p);
  return p;
}

TEST(CpuReference, HandComputedTwoByTwo) {
  // D = 1, scale = 1: s = q·k. q = [1, 2], k = [0, 1], v = [10, 20].
  // Row 0: s = [0, 1] -> p = [1, e]/(1+e) -> o = (10 + 20e)/(1+e); lse = log(1 + e).
  // Row 1: s = [0, 2] -> o = (10 + 20e²)/(1+e²); lse = log(1 + e²).
  AttentionParams p = tiny(2, 2, 1);
  p.softmax_scale = 1.0f;
  std::vector<float> q{1, 2}, k{0, 1}, v{10, 20};
  ReferenceOutput r = cpu_reference(p, q.data(), k.data(), v.data());
  const double e = std::exp(1.0), e2 = std::exp(2.0);
  EXPECT_NEAR(r.o[0], (10 + 20 * e) / (1 + e), 1e-12);
  EXPECT_NEAR(r.o[1], (10 + 20 * e2) / (1 + e2), 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(1 + e), 1e-12);
  EXPECT_NEAR(r.lse[1], std::log(1 + e2), 1e-12);
}

TEST(CpuReference, HandComputedCausalTopLeftAndBottomRight) {
  AttentionParams p = tiny(2, 3, 1);
  p.softmax_scale = 1.0f;
  p.causal = true;
  std::vector<float> q{1, 1}, k{0, 0, 0}, v{1, 2, 3};
  // Top-left: row 0 sees key 0, row 1 sees keys 0..1 (equal scores -> mean of V).
  ReferenceOutput tl = cpu_reference(p, q.data(), k.data(), v.data());
  EXPECT_NEAR(tl.o[0], 1.0, 1e-12);
  EXPECT_NEAR(tl.o[1], 1.5, 1e-12);
  EXPECT_NEAR(tl.lse[1], std::log(2.0), 1e-12);
  // Bottom-right (offset N_kv - N_q = 1): row 0 sees keys 0..1, row 1 sees all three.
  p.causal_align = CausalAlign::bottom_right;
  ReferenceOutput br = cpu_reference(p, q.data(), k.data(), v.data());
  EXPECT_NEAR(br.o[0], 1.5, 1e-12);
  EXPECT_NEAR(br.o[1], 2.0, 1e-12);
}

// A sliding window by hand: equal scores, so each row's O is the mean of the V rows it sees. N_q = 3,
// N_kv = 5, bottom-right (offset 2): row i's diagonal is key i + 2. Window (1, 0): keys i + 1 .. i + 2;
// (0, 1): i + 2 .. i + 3 (clipped at key 4); (-1, 0) is causal; (2, -1) with causal: i .. i + 2; and a
// window left of every key ((0, 0) with top-left offset and N_kv = 1 past row 0) sees nothing.
TEST(CpuReference, HandComputedSlidingWindow) {
  AttentionParams p = tiny(3, 5, 1);
  p.softmax_scale = 1.0f;
  p.causal_align = CausalAlign::bottom_right;
  std::vector<float> q{1, 1, 1}, k{0, 0, 0, 0, 0}, v{1, 2, 3, 4, 5};
  auto o_of = [&](int64_t left, int64_t right, bool causal) {
    p.window_left = left;
    p.window_right = right;
    p.causal = causal;
    return cpu_reference(p, q.data(), k.data(), v.data());
  };
  const ReferenceOutput a = o_of(1, 0, false);  // keys {i+1, i+2}: values i+2, i+3
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(a.o[i], i + 2.5, 1e-12) << "row " << i;
  EXPECT_NEAR(a.lse[0], std::log(2.0), 1e-12);
  const ReferenceOutput b = o_of(0, 1, false);  // keys {i+2, i+3} ∩ [0, 5)
  EXPECT_NEAR(b.o[0], 3.5, 1e-12);
  EXPECT_NEAR(b.o[1], 4.5, 1e-12);
  EXPECT_NEAR(b.o[2], 5.0, 1e-12);  // key 5 does not exist
  const ReferenceOutput c = o_of(-1, 0, false), causal = o_of(-1, -1, true);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(c.o[i], causal.o[i], 1e-12) << "(-1, 0) is causal, row " << i;
  const ReferenceOutput d = o_of(2, -1, true);  // keys i .. i + 2
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(d.o[i], i + 2.0, 1e-12) << "row " << i;
  AttentionParams t = tiny(3, 1, 1);  // top-left, one key: window (0, 0) lets row 0 alone see it
  t.window_left = t.window_right = 0;
  std::vector<float> q3{1, 1, 1}, k1{0}, v1{7};
  const ReferenceOutput e = cpu_reference(t, q3.data(), k1.data(), v1.data());
  EXPECT_NEAR(e.o[0], 7.0, 1e-12);
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(e.o[i], 0.0) << "row " << i << " sees no key";
    EXPECT_EQ(e.lse[i], -std::numeric_limits<double>::infinity()) << "row " << i;
  }
}

TEST(CpuReference, RowWithNoVisibleKeyIsZeroWithMinusInfLse) {
  AttentionParams p = tiny(3, 1, 2);  // bottom-right with N_q > N_kv: rows 0 and 1 see nothing
  p.causal = true;
  p.causal_align = CausalAlign::bottom_right;
  std::vector<float> q(6, 1.f), k{1, 1}, v{5, 7};
  ReferenceOutput r = cpu_reference(p, q.data(), k.data(), v.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.o[size_t(i)], 0.0);
  EXPECT_EQ(r.lse[0], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(r.lse[1], -std::numeric_limits<double>::infinity());
  EXPECT_NEAR(r.o[4], 5.0, 1e-12);
  EXPECT_NEAR(r.o[5], 7.0, 1e-12);
}

// The textbook formula, written independently: P = exp(S) / sum(exp(S)) without the max trick
// (safe here: small random inputs), O = P·V, with GQA, strides in BNHD order and N_q != N_kv.
TEST(CpuReference, MatchesPlainSoftmaxFormula) {
  const int64_t B = 2, Hq = 4, Hkv = 2, Nq = 5, Nkv = 7, D = 3;
  AttentionParams p;
  p.batch = B;
  p.heads_q = Hq;
  p.heads_kv = Hkv;
  p.seqlen_q = Nq;
  p.seqlen_kv = Nkv;
  p.head_dim = D;
  p.q_stride = bnhd_strides(Hq, Nq, D);
  p.k_stride = bnhd_strides(Hkv, Nkv, D);
  p.v_stride = bnhd_strides(Hkv, Nkv, D);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> q(size_t(B * Hq * Nq * D)), k(size_t(B * Hkv * Nkv * D)), v(k.size());
  for (auto* t : {&q, &k, &v})
    for (auto& x : *t) x = nd(rng);
  ReferenceOutput r = cpu_reference(p, q.data(), k.data(), v.data());
  const double scale = double(float(1.0 / std::sqrt(double(D))));  // the API scale is an fp32 value
  auto at = [&](const std::vector<float>& t, const Strides& s, int64_t b, int64_t h, int64_t n, int64_t d) {
    return double(t[size_t(b * s.batch + h * s.head + n * s.seq + d)]);
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t hk = h / (Hq / Hkv);
        std::vector<double> e(static_cast<size_t>(Nkv));
        double sum = 0;
        for (int64_t j = 0; j < Nkv; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += at(q, p.q_stride, b, h, i, d) * at(k, p.k_stride, b, hk, j, d);
          e[size_t(j)] = std::exp(scale * s);
          sum += e[size_t(j)];
        }
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < Nkv; ++j) o += e[size_t(j)] / sum * at(v, p.v_stride, b, hk, j, d);
          EXPECT_NEAR(r.o[size_t(((b * Hq + h) * Nq + i) * D + d)], o, 1e-12);
        }
        EXPECT_NEAR(r.lse[size_t((b * Hq + h) * Nq + i)], std::log(sum), 1e-12);
      }
}

}  // namespace
}  // namespace fa
