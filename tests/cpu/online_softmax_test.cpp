// The online-softmax recurrence of steps 01-03 on the CPU, built from the same helpers the
// kernels call (device/online_softmax.h), against the two-pass softmax in fp64; the worked
// example of docs/online_softmax.md; the row-slice index map of device/row_slice.h; the grid
// limits of library/launch_limits.h.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "library/launch_limits.h"
#include "device/online_softmax.h"
#include "device/row_slice.h"

namespace fa {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// softmax(s)·v in fp64, the textbook way: max, exp-sum, weighted sum. v is (n, d) row-major.
std::vector<double> two_pass(const std::vector<float>& s, const std::vector<float>& v, int d) {
  double m = -std::numeric_limits<double>::infinity();
  for (float x : s) m = std::max(m, double(x));
  double l = 0;
  std::vector<double> o(d, 0.0);
  for (size_t j = 0; j < s.size(); ++j) {
    const double p = std::exp(double(s[j]) - m);
    l += p;
    for (int k = 0; k < d; ++k) o[k] += p * v[j * d + k];
  }
  for (double& x : o) x /= l;
  return o;
}

enum class Variant { fa2, fa1_normalised, update_order_bug };

// The kernels' recurrence over tiles of `block_n` keys, in fp32. The last tile is padded with
// zero keys whose scores are masked to -inf, exactly as steps 02 and 03 do.
//   fa2:              o_i kept un-normalised, one division at the end (steps 01 and 03)
//   fa1_normalised:   o_i divided by l_i after every tile, undone at the next (step 02)
//   update_order_bug: m_i overwritten before alpha is computed (catalog #5)
std::vector<float> streamed(const std::vector<float>& s, const std::vector<float>& v, int d, int block_n,
                            Variant variant) {
  const int64_t n_kv = int64_t(s.size());
  float m_i = -kInf, l_i = 0.0f;
  std::vector<float> o_i(d, 0.0f);
  for (int64_t kv_start = 0; kv_start < n_kv; kv_start += block_n) {
    const int rows = tile_rows(kv_start, block_n, n_kv);
    std::vector<float> p(block_n);
    float tile_max = -kInf;
    for (int n = 0; n < block_n; ++n) {
      p[n] = n < rows ? s[kv_start + n] : -kInf;  // padded keys: -inf, never 0
      tile_max = std::max(tile_max, p[n]);
    }
    const float m_new = std::max(m_i, tile_max);
    if (variant == Variant::update_order_bug) m_i = m_new;
    const float alpha = online_softmax_rescale(m_i, m_new);
    float p_sum = 0.0f;
    for (int n = 0; n < block_n; ++n) {
      p[n] = std::exp(p[n] - m_new);
      p_sum += p[n];
    }
    const float undo = variant == Variant::fa1_normalised ? alpha * l_i : alpha;
    for (float& x : o_i) x *= undo;
    l_i = alpha * l_i + p_sum;
    for (int n = 0; n < rows; ++n)
      for (int k = 0; k < d; ++k) o_i[k] += p[n] * v[(kv_start + n) * d + k];
    if (variant == Variant::fa1_normalised)
      for (float& x : o_i) x /= l_i;
    m_i = m_new;
  }
  if (variant != Variant::fa1_normalised)
    for (float& x : o_i) x /= l_i;
  return o_i;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::abs(double(a[k]) - b[k]));
  return worst;
}

struct Row {
  std::vector<float> s, v;
};

Row random_row(int n, int d, float score_std, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Row r;
  for (int j = 0; j < n; ++j) r.s.push_back(score_std * normal(gen));
  for (int j = 0; j < n * d; ++j) r.v.push_back(normal(gen));
  return r;
}

TEST(OnlineSoftmax, RescaleIsExpOfTheMaxDifference) {
  EXPECT_FLOAT_EQ(online_softmax_rescale(1.0f, 3.0f), std::exp(-2.0f));
  EXPECT_EQ(online_softmax_rescale(2.5f, 2.5f), 1.0f);   // the max did not move: nothing to rescale
  EXPECT_EQ(online_softmax_rescale(-kInf, 0.7f), 0.0f);  // first key: the empty state is discarded
  // Every score so far masked: exp(-inf - (-inf)) would be NaN; 1 keeps l = 0 and O = 0 finite.
  EXPECT_EQ(online_softmax_rescale(-kInf, -kInf), 1.0f);
  // alpha <= 1 always: the running max never decreases, so the old state only ever shrinks.
  for (float m_old : {-50.0f, -1.0f, 0.0f, 3.0f, 80.0f})
    for (float delta : {0.0f, 0.5f, 10.0f, 200.0f}) EXPECT_LE(online_softmax_rescale(m_old, m_old + delta), 1.0f);
}

TEST(OnlineSoftmax, TileRowsOfARaggedLastTile) {
  EXPECT_EQ(tile_rows(0, 32, 1000), 32);
  EXPECT_EQ(tile_rows(992, 32, 1000), 8);  // 1000 = 31·32 + 8
  EXPECT_EQ(tile_rows(0, 32, 1), 1);
  EXPECT_EQ(tile_rows(32, 32, 64), 32);
  int64_t covered = 0;
  for (int64_t start = 0; start < 1013; start += 64) covered += tile_rows(start, 64, 1013);
  EXPECT_EQ(covered, 1013);
}

// docs/online_softmax.md walks through this row: s = (2, 4, 1, 3), v = (1, 2, 3, 4).
TEST(OnlineSoftmax, WorkedExampleOfTheDocs) {
  const std::vector<float> s{2, 4, 1, 3}, v{1, 2, 3, 4};
  const double exact = two_pass(s, v, 1)[0];
  EXPECT_NEAR(exact, 2.418680, 1e-6);
  EXPECT_NEAR(streamed(s, v, 1, 1, Variant::fa2)[0], exact, 1e-6);             // key by key
  EXPECT_NEAR(streamed(s, v, 1, 2, Variant::fa2)[0], exact, 1e-6);             // tiles of two
  EXPECT_NEAR(streamed(s, v, 1, 3, Variant::fa2)[0], exact, 1e-6);             // ragged tiles
  EXPECT_NEAR(streamed(s, v, 1, 2, Variant::fa1_normalised)[0], exact, 1e-6);  // FA1's form
  // With m_i overwritten first, alpha is always 1 and the early keys keep too much weight.
  EXPECT_NEAR(streamed(s, v, 1, 1, Variant::update_order_bug)[0], 1.911297, 1e-5);
}

TEST(OnlineSoftmax, StreamingEqualsTwoPassForAnyTiling) {
  for (int n : {1, 2, 17, 100, 1013}) {
    const Row r = random_row(n, 8, 2.0f, 1234u + unsigned(n));
    const std::vector<double> exact = two_pass(r.s, r.v, 8);
    for (int block_n : {1, 7, 32, 64}) {
      for (Variant var : {Variant::fa2, Variant::fa1_normalised}) {
        const std::vector<float> got = streamed(r.s, r.v, 8, block_n, var);
        EXPECT_LT(max_abs_diff(got, exact), 2e-5) << "n=" << n << " block_n=" << block_n;
      }
    }
  }
}

TEST(OnlineSoftmax, WrongUpdateOrderIsDetectablyWrong) {
  // The regression tests rely on this: over a few rows of random data (scores with std 1, as
  // scale·q·k has for unit normal q and k), the catalog-#5 order is far outside bf16 tolerance.
  double worst_by_key = 0, worst_by_tile = 0;
  for (unsigned row = 0; row < 16; ++row) {
    const Row r = random_row(17, 64, 1.0f, 99u + row);
    const std::vector<double> exact = two_pass(r.s, r.v, 64);
    worst_by_key = std::max(worst_by_key, max_abs_diff(streamed(r.s, r.v, 64, 1, Variant::update_order_bug), exact));
    worst_by_tile = std::max(worst_by_tile, max_abs_diff(streamed(r.s, r.v, 64, 4, Variant::update_order_bug), exact));
  }
  EXPECT_GT(worst_by_key, 0.1);
  EXPECT_GT(worst_by_tile, 0.1);
}

TEST(OnlineSoftmax, LargeLogitsStayFinite) {
  // Scores of several hundred: exp() of the raw score is +inf in fp32 (above ~88.72), so a
  // softmax without the max subtracted gives inf/inf = NaN. The recurrence never exponentiates a
  // positive number.
  Row r = random_row(300, 4, 100.0f, 7u);
  for (float& x : r.s) x += 500.0f;
  EXPECT_TRUE(std::isinf(std::exp(r.s[0])) || std::exp(r.s[0]) > 1e38f);
  const std::vector<double> exact = two_pass(r.s, r.v, 4);
  for (int block_n : {1, 32}) {
    const std::vector<float> got = streamed(r.s, r.v, 4, block_n, Variant::fa2);
    for (float x : got) EXPECT_TRUE(std::isfinite(x));
    EXPECT_LT(max_abs_diff(got, exact), 1e-4);
  }
}

TEST(RowSlice, EveryColumnHeldByExactlyOneLane) {
  auto check = [](int head_dim) {
    const int slice = head_dim / kRowLanes;
    std::set<int> seen;
    for (int lane = 0; lane < kRowLanes; ++lane)
      for (int k = 0; k < slice; ++k) {
        const int col = slice_column(lane, k);
        EXPECT_GE(col, 0);
        EXPECT_LT(col, head_dim);
        EXPECT_TRUE(seen.insert(col).second) << "column " << col << " held twice";
      }
    EXPECT_EQ(int(seen.size()), head_dim);
  };
  check(64);
  check(128);
  EXPECT_EQ(row_slice_size<64>(), 16);
  EXPECT_EQ(row_slice_size<128>(), 32);
}

TEST(RowSlice, QuadReadsContiguousSixtyFourBytes) {
  // For each load instruction c, the four lanes read chunks 4c .. 4c+3: 64 contiguous bytes of
  // bf16 (coalesced) and, as fp32 in shared memory, banks that do not collide.
  for (int c = 0; c < 4; ++c) {
    std::set<int> banks;
    for (int lane = 0; lane < kRowLanes; ++lane) {
      const int first = slice_column(lane, c * kChunkElems);
      EXPECT_EQ(first, (c * kRowLanes + lane) * kChunkElems);
      for (int e = 0; e < kChunkElems; e += 4) banks.insert((first + e) % 32 / 4);  // float4 bank groups
    }
    EXPECT_EQ(int(banks.size()), 2 * kRowLanes);
  }
}

TEST(Launch, GridLimits) {
  EXPECT_TRUE(check_grid(1).ok());
  EXPECT_TRUE(check_grid(kMaxGridX, kMaxGridYZ, kMaxGridYZ).ok());
  EXPECT_FALSE(check_grid(kMaxGridX + 1).ok());
  EXPECT_FALSE(check_grid(16, kMaxGridYZ + 1).ok());
  EXPECT_FALSE(check_grid(0).ok());
  EXPECT_NE(check_grid(16, 70000).message().find("65535"), std::string::npos);
}

}  // namespace
}  // namespace fa
