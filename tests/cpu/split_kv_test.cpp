// Split-KV on the CPU (Part V): the combine of S partial results (device/split_combine.h) against
// fp64 softmax over all the keys, empty splits and empty rows included; and the choice of how
// many ways to split (library/split_kv.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "device/split_combine.h"
#include "library/split_kv.h"

namespace fa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// One query row: scores s (already scaled, −inf where masked) and values v (n, d) row-major.
struct Row {
  std::vector<float> s, v;
  int d;
};

// What the block of split [begin, end) writes: its keys' softmax-weighted values, normalised over
// its own keys (fp32, as a kernel's partial O), and its log-sum-exp (−inf when it saw no key).
void partial(const Row& r, int begin, int end, std::vector<float>& o, float& lse) {
  double m = -std::numeric_limits<double>::infinity();
  for (int j = begin; j < end; ++j) m = std::max(m, double(r.s[j]));
  o.assign(r.d, 0.0f);
  if (m == -std::numeric_limits<double>::infinity()) {
    lse = -kInf;
    return;
  }
  double l = 0;
  std::vector<double> acc(r.d, 0.0);
  for (int j = begin; j < end; ++j) {
    const double p = std::exp(double(r.s[j]) - m);
    l += p;
    for (int c = 0; c < r.d; ++c) acc[c] += p * r.v[j * r.d + c];
  }
  for (int c = 0; c < r.d; ++c) o[c] = float(acc[c] / l);
  lse = float(m + std::log(l));
}

// The whole row in fp64: softmax over every key; lse = −inf and o = 0 when every key is masked.
void full(const Row& r, std::vector<double>& o, double& lse) {
  const int n = int(r.s.size());
  double m = -std::numeric_limits<double>::infinity();
  for (float x : r.s) m = std::max(m, double(x));
  o.assign(r.d, 0.0);
  if (m == -std::numeric_limits<double>::infinity()) {
    lse = -std::numeric_limits<double>::infinity();
    return;
  }
  double l = 0;
  for (int j = 0; j < n; ++j) {
    const double p = std::exp(double(r.s[j]) - m);
    l += p;
    for (int c = 0; c < r.d; ++c) o[c] += p * r.v[j * r.d + c];
  }
  for (double& x : o) x /= l;
  lse = m + std::log(l);
}

// Splits the row's keys into `splits` ranges of ceil(n / splits) (the last ones possibly empty),
// combines the partials the way the combine kernel does, and checks against full().
void check_combine(const Row& r, int splits) {
  const int n = int(r.s.size());
  const int per = (n + splits - 1) / splits;
  std::vector<std::vector<float>> o(splits);
  std::vector<float> lse(splits);
  for (int s = 0; s < splits; ++s) partial(r, std::min(n, s * per), std::min(n, (s + 1) * per), o[s], lse[s]);
  const float got_lse = combined_lse(lse.data(), splits, 1);
  std::vector<double> want;
  double want_lse;
  full(r, want, want_lse);
  SCOPED_TRACE("n " + std::to_string(n) + ", " + std::to_string(splits) + " splits");
  if (want_lse == -std::numeric_limits<double>::infinity()) {
    EXPECT_EQ(got_lse, -kInf);
  } else {
    EXPECT_NEAR(got_lse, want_lse, 1e-5 * (1 + std::abs(want_lse)));
  }
  for (int c = 0; c < r.d; ++c) {
    float got = 0.0f;
    for (int s = 0; s < splits; ++s) got += split_weight(lse[s], got_lse) * o[s][c];
    ASSERT_FALSE(std::isnan(got)) << "column " << c;
    ASSERT_NEAR(got, want[c], 1e-5 * (1 + std::abs(want[c]))) << "column " << c;
  }
}

Row random_row(std::mt19937& gen, int n, int d, float spread) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Row r{std::vector<float>(n), std::vector<float>(size_t(n) * d), d};
  for (float& x : r.s) x = spread * normal(gen);
  for (float& x : r.v) x = normal(gen);
  return r;
}

TEST(SplitCombine, EqualsSoftmaxOverAllKeys) {
  std::mt19937 gen(2701);
  for (int n : {1, 7, 64, 300})
    for (int splits : {1, 2, 3, 8, 13})
      for (float spread : {1.0f, 30.0f})  // 30: hot logits, the splits' LSEs far apart
        check_combine(random_row(gen, n, 16, spread), splits);
}

TEST(SplitCombine, EmptySplitsWeighNothing) {
  std::mt19937 gen(2702);
  // More splits than keys: the last ranges hold no key (lse −inf, O 0).
  check_combine(random_row(gen, 5, 8, 1.0f), 8);
  // Whole ranges masked, as a causal or windowed row leaves them.
  Row r = random_row(gen, 64, 8, 2.0f);
  for (int j = 16; j < 48; ++j) r.s[j] = -kInf;
  check_combine(r, 4);
  EXPECT_EQ(split_weight(-kInf, 1.5f), 0.0f);
}

TEST(SplitCombine, AnEmptyRowIsZeroNotNaN) {
  std::mt19937 gen(2703);
  Row r = random_row(gen, 40, 8, 1.0f);
  for (float& x : r.s) x = -kInf;  // every key masked (bottom-right causal, N_q > N_kv)
  check_combine(r, 5);
  const float lse[3] = {-kInf, -kInf, -kInf};
  EXPECT_EQ(combined_lse(lse, 3, 1), -kInf);
  EXPECT_EQ(split_weight(-kInf, -kInf), 0.0f);  // not e^(−inf − (−inf)) = NaN
}

TEST(SplitCombine, ReadsEverySplitThroughItsStride) {
  // lse_s at lse[s · stride]: the combine kernel's rows of (splits, rows) arrays.
  const float lse[6] = {0.0f, 99.0f, std::log(3.0f), 99.0f, -kInf, 99.0f};
  EXPECT_NEAR(combined_lse(lse, 3, 2), std::log(4.0f), 1e-6);
}

// ---- how many splits ------------------------------------------------------------------------------

TEST(KvSplits, NoSplitWhenTheGridAlreadyFillsTheGpu) {
  EXPECT_EQ(choose_kv_splits(/*blocks=*/132, /*kv_tiles=*/128, /*slots=*/132), 1);
  EXPECT_EQ(choose_kv_splits(1024, 128, 264), 1);
  EXPECT_EQ(choose_kv_splits(212, 128, 264), 1);  // 80 % of a wave
}

TEST(KvSplits, NothingToSplit) {
  EXPECT_EQ(choose_kv_splits(8, 1, 132), 1);  // one KV tile
  EXPECT_EQ(choose_kv_splits(8, 0, 132), 1);
  EXPECT_EQ(choose_kv_splits(8, 100, 132, /*max_splits=*/1), 1);
}

TEST(KvSplits, TheProductionDecodeAsksForAFullerWave) {
  // 4 sequences of 64k keys (32 packed groups, 1024 tiles) and 1 of 128k (8 groups, 2048 tiles),
  // two blocks per SM: the steps' rule stops at 85 % of a wave, the production decode's at 95 %.
  EXPECT_EQ(choose_kv_splits(32, 1024, 264), 7);                                  // 224 blocks
  EXPECT_EQ(choose_kv_splits(32, 1024, 264, kMaxKvSplits, kDecodeSplitRule), 8);  // 256
  EXPECT_EQ(choose_kv_splits(8, 2048, 264), 29);                                  // 232
  EXPECT_EQ(choose_kv_splits(8, 2048, 264, kMaxKvSplits, kDecodeSplitRule), 32);  // 256
  // A grid 85 % full: the steps leave it, the production decode splits it (7 ways: 1575 blocks,
  // 5.97 waves).
  EXPECT_EQ(choose_kv_splits(225, 128, 264), 1);
  EXPECT_EQ(choose_kv_splits(225, 128, 264, kMaxKvSplits, kDecodeSplitRule), 7);
}

TEST(KvSplits, DecodeFillsAWaveWithTheFewestSplits) {
  // B = 1, H_q = 32, N_q = 1 (one Q tile per head), N_kv = 8k in tiles of 64, two blocks per SM.
  const int s = choose_kv_splits(32, 128, 264);
  // 7 splits: 224 blocks in 264 slots, 85 % of a wave, within 85 % of the best choice's (8
  // splits: 256 blocks, 97 %); 6 splits fill 73 %.
  EXPECT_EQ(s, 7);
  // Whatever the grid: within bounds, the last wave at least 85 % as full as the best choice's,
  // and no split count below it reaches that.
  for (int64_t blocks : {1, 3, 8, 32, 40, 100, 200})
    for (int64_t kv_tiles : {2, 5, 16, 128, 2048})
      for (int64_t slots : {132, 264}) {
        const int got = choose_kv_splits(blocks, kv_tiles, slots);
        SCOPED_TRACE(std::to_string(blocks) + " blocks, " + std::to_string(kv_tiles) + " KV tiles, " +
                     std::to_string(slots) + " slots: " + std::to_string(got) + " splits");
        ASSERT_GE(got, 1);
        ASSERT_LE(got, std::min<int64_t>(kMaxKvSplits, kv_tiles));
        if (blocks >= slots * 4 / 5) {
          ASSERT_EQ(got, 1);
          continue;
        }
        auto eff = [&](int sp) {
          const double waves = double(blocks) * sp / double(slots);
          return waves / std::ceil(waves);
        };
        // Only split counts that shorten the longest range count: another split that leaves every
        // range as long adds blocks and a longer combine for nothing.
        auto shortens = [&](int sp) {
          return sp == 1 || kv_tiles_per_split(kv_tiles, sp) < kv_tiles_per_split(kv_tiles, sp - 1);
        };
        const int most = int(std::min<int64_t>({kMaxKvSplits, kv_tiles, slots}));
        double best = 0;
        for (int sp = 1; sp <= most; ++sp)
          if (shortens(sp)) best = std::max(best, eff(sp));
        EXPECT_TRUE(shortens(got));
        EXPECT_GE(eff(got), kSplitRule.min_efficiency * best - 1e-12);
        for (int sp = 1; sp < got; ++sp) {
          if (!shortens(sp)) continue;
          EXPECT_LT(eff(sp), kSplitRule.min_efficiency * best) << "fewer splits, " << sp << ", would do";
        }
      }
}

TEST(KvSplits, RangesCoverEveryTileOnce) {
  for (int64_t kv_tiles : {1, 7, 64, 129})
    for (int splits : {1, 2, 3, 8, 64}) {
      const int64_t per = kv_tiles_per_split(kv_tiles, splits);
      int64_t covered = 0;
      for (int s = 0; s < splits; ++s) covered += std::max<int64_t>(0, std::min(kv_tiles, (s + 1) * per) - s * per);
      EXPECT_EQ(covered, kv_tiles) << kv_tiles << " tiles, " << splits << " splits";
      EXPECT_GE(per * splits, kv_tiles);
    }
}

}  // namespace
}  // namespace fa
