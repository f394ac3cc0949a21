// The production kernels' score modifications in their scalar form (kernels/score_mod.h): what
// the tile functions apply per element, in the kernels' raw score units, against the formulas of
// include/fa/params.h that the fp64 reference applies. The device runs the same code with the
// special-function unit's exp2 in place of std::exp2 (its tanh: 1 − 2/(e^(2x) + 1)).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/score_mod.h"

namespace fa::kernels {
namespace {

constexpr double kLog2e = 1.4426950408889634;

// The mods of a call with this scale, cap, slope and (N_q, N_kv).
ScoreMods mods_of(float scale, float softcap, float slope, int64_t n_q, int64_t n_kv) {
  AttentionParams p;
  p.head_dim = 64;
  p.softmax_scale = scale;
  p.softcap = softcap;
  p.seqlen_q = n_q;
  p.seqlen_kv = n_kv;
  const ScoreModArgs a = score_mod_args(p);
  return ScoreMods{a, slope * a.inv_scale};
}

// The scaled score params.h defines: softcap·tanh(scale·s / softcap), then − slope·|i + N_kv − N_q − j|.
double modified(double s, double scale, double softcap, double slope, int64_t i, int64_t j, int64_t n_q, int64_t n_kv) {
  double x = scale * s;
  if (softcap > 0) x = softcap * std::tanh(x / softcap);
  return x - slope * std::fabs(double(i + n_kv - n_q - j));
}

TEST(ScoreMods, ScoreIsTheScaledFormulaInRawUnits) {
  std::mt19937 rng(7);
  std::normal_distribution<float> score(0.0f, 40.0f);
  std::uniform_int_distribution<int> pos(0, 3000);
  int checked = 0;
  for (float scale : {0.125f, 0.3f, 1.0f})
    for (float cap : {0.0f, 5.0f, 30.0f, 50.0f})
      for (float slope : {0.0f, 0.0625f, 0.5f}) {
        const int64_t n_q = 1013, n_kv = 1531;
        const ScoreMods m = mods_of(scale, cap, slope, n_q, n_kv);
        for (int k = 0; k < 200; ++k) {
          const float s = score(rng);
          const int i = pos(rng) % int(n_q), j = pos(rng) % int(n_kv);
          const double want = modified(s, scale, cap, slope, i, j, n_q, n_kv);
          const double got = double(scale) * double(m.score(s, i, j));  // raw units back to scaled
          EXPECT_NEAR(got, want, 1e-5 * (1.0 + std::fabs(want)))
              << "scale " << scale << " cap " << cap << " slope " << slope << " s " << s << " (" << i << ", " << j
              << ")";
          ++checked;
        }
      }
  EXPECT_EQ(checked, 3 * 4 * 3 * 200);
}

// The cap sits on the scaled score: applied to the raw score and scaled after, it differs (the
// case a test with the default scale near 1/sqrt(D) and small scores could miss).
TEST(ScoreMods, CapIsInsideTheScale) {
  const float scale = 0.3f, cap = 5.0f, s = 20.0f;
  const ScoreMods m = mods_of(scale, cap, 0.0f, 10, 10);
  const double inside = cap * std::tanh(scale * s / cap), after = scale * cap * std::tanh(s / cap);
  EXPECT_NEAR(scale * m.score(s, 0, 0), inside, 1e-5);
  EXPECT_GT(std::fabs(inside - after), 0.5);
}

// The backward reads t = tanh(scale·s / cap) back from P = 2^(c·s′ − lse₂) and the column's lse₂.
TEST(ScoreMods, DsFactorIsTheCapsDerivativeReadBackFromP) {
  std::mt19937 rng(11);
  std::normal_distribution<float> score(0.0f, 30.0f);
  std::uniform_real_distribution<float> lse(-5.0f, 40.0f);
  for (float scale : {0.125f, 0.3f})
    for (float cap : {5.0f, 50.0f})
      for (float slope : {0.0f, 0.25f}) {
        const int64_t n_q = 300, n_kv = 1000;
        const ScoreMods m = mods_of(scale, cap, slope, n_q, n_kv);
        for (int k = 0; k < 300; ++k) {
          const float s = score(rng);
          const int i = k % int(n_q), j = (k * 37) % int(n_kv);
          const float s_mod = m.score(s, i, j);
          const float lse2 = float(lse(rng) * kLog2e);
          const float p = std::exp2(s_mod * m.a.scale_log2 - lse2);
          if (!(p > 1e-30f)) continue;  // underflowed: checked below
          const double t = std::tanh(double(scale) * s / cap);
          EXPECT_NEAR(m.ds_factor(p, lse2, i, j), 1.0 - t * t, 2e-3)
              << "scale " << scale << " cap " << cap << " slope " << slope << " s " << s << " p " << p;
        }
      }
  // A P of 0 (underflowed, or masked) gives t = −inf, clamped: a finite factor, which its dS of 0 keeps 0.
  const ScoreMods m = mods_of(0.125f, 50.0f, 0.0f, 10, 10);
  const float f = m.ds_factor(0.0f, 3.0f, 1, 2);
  EXPECT_TRUE(std::isfinite(f));
  EXPECT_EQ(0.0f * f, 0.0f);
  // Without a cap, 1.
  EXPECT_EQ(mods_of(0.125f, 0.0f, 0.5f, 10, 10).ds_factor(0.25f, 3.0f, 1, 2), 1.0f);
}

// The sink at the end of a row: the LSE of the scores and the sink together, O rescaled so that its
// normalisation divides by the sink's term too; a row that saw no key gets LSE = the sink, O = 0.
// One-sided ALiBi (kOneSided: the bias without its absolute value, the row's part out of the loop)
// is only right where every key a query sees sits at or before ALiBi's diagonal j <= i + N_kv − N_q:
// alibi_one_sided must never claim a call that shows a query a key past it (checked against every
// visible pair, params.h's rule), and must claim the causal calls ALiBi models make.
TEST(ScoreMods, OneSidedAlibiOnlyWhereNoVisibleKeyIsPastTheDiagonal) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> len(1, 40), edge(-1, 6), coin(0, 1);
  int claimed = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    AttentionParams p;
    p.seqlen_q = len(rng);
    p.seqlen_kv = len(rng);
    p.causal = coin(rng) == 1;
    p.causal_align = coin(rng) == 1 ? CausalAlign::bottom_right : CausalAlign::top_left;
    p.window_left = edge(rng);
    p.window_right = edge(rng);
    const int64_t off = p.causal_offset();
    bool past = false;  // a visible key past ALiBi's diagonal
    for (int64_t i = 0; i < p.seqlen_q; ++i)
      for (int64_t j = 0; j < p.seqlen_kv; ++j) {
        bool visible = !p.causal || j <= i + off;
        if (p.window_left >= 0) visible = visible && j >= i + off - p.window_left;
        if (p.window_right >= 0) visible = visible && j <= i + off + p.window_right;
        past = past || (visible && j > i + p.seqlen_kv - p.seqlen_q);
      }
    if (alibi_one_sided(p)) {
      ++claimed;
      EXPECT_FALSE(past) << "N_q " << p.seqlen_q << " N_kv " << p.seqlen_kv << " causal " << p.causal << " window "
                         << p.window_left << "," << p.window_right;
    }
  }
  EXPECT_GT(claimed, 1000);
  AttentionParams c;  // causal, bottom-right, and top-left with N_kv >= N_q: one-sided
  c.causal = true;
  c.seqlen_q = 100;
  c.seqlen_kv = 300;
  c.causal_align = CausalAlign::bottom_right;
  EXPECT_TRUE(alibi_one_sided(c));
  c.causal_align = CausalAlign::top_left;
  EXPECT_TRUE(alibi_one_sided(c));
  c.seqlen_q = 301;  // top-left with N_q > N_kv: row 300 sees key 300 > 300 − 1
  EXPECT_FALSE(alibi_one_sided(c));
  c.causal = false;
  EXPECT_FALSE(alibi_one_sided(c));
}

TEST(ScoreMods, SinkJoinsTheRowsDenominator) {
  const float scale = 0.125f;
  const ScoreMods m = mods_of(scale, 0.0f, 0.0f, 10, 10);
  const float c = m.a.scale_log2;
  const float scores[] = {10.0f, 30.0f, -4.0f, 22.0f};  // raw
  for (float sink_logit : {-3.0f, 2.0f, 9.0f}) {
    // The kernel's state: m (here the max), l relative to it.
    float row_m = 30.0f, l = 0.0f;
    for (float s : scores) l += std::exp2((s - row_m) * c);
    float alpha = 0.0f;
    m.finish_row(row_m, l, alpha, sink_logit * m.a.inv_scale);
    double want = std::exp(double(sink_logit));
    for (float s : scores) want += std::exp(double(scale) * s);
    const double lse = double(row_m) * scale + std::log(double(l));  // the kernels' log_sum_exp
    EXPECT_NEAR(lse, std::log(want), 1e-5) << "sink " << sink_logit;
    // O's normaliser: alpha / l' must equal 1 / (Σ e^(scaled − scale·m_old)·… ) = e^(scale·30) / want.
    EXPECT_NEAR(double(alpha) / l, std::exp(double(scale) * 30.0 - std::log(want)), 1e-6);
  }
  float row_m = -INFINITY, l = 0.0f, alpha = 1.0f;
  m.finish_row(row_m, l, alpha, 4.0f * m.a.inv_scale);
  EXPECT_EQ(alpha, 0.0f);  // O (all zero) stays 0
  EXPECT_NEAR(double(row_m) * scale + std::log(double(l)), 4.0, 1e-6);
  // No sink: nothing changes.
  row_m = 3.0f, l = 2.0f;
  m.finish_row(row_m, l, alpha, -INFINITY);
  EXPECT_EQ(row_m, 3.0f);
  EXPECT_EQ(l, 2.0f);
  EXPECT_EQ(alpha, 1.0f);
}

}  // namespace
}  // namespace fa::kernels
