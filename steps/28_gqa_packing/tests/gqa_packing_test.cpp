// Step 28's GQA packing against the reference: groups of 1 to 32 query heads per KV head packed
// into one Q tile, split and unsplit. The packed rows' order (query-major: the G heads of one query
// are adjacent rows) puts tile edges inside a query's group when G does not divide the tile, and
// sends each row's O, LSE and partials to its own head: tests with such edges, with causal masks
// in both alignments (where a row's query, not its packed index, decides what it sees), and with
// the (B, N, H, D) layout, in which one query's heads are adjacent in memory. O, the LSE, their
// guard regions and the workspace start poisoned (tests/gpu/split_kv_check.h).
#include <gtest/gtest.h>

#include "tests/gpu/split_kv_check.h"

namespace fa {
namespace {

using testing::expect_split_matches;
using testing::split_shape;

TEST(GqaPacking, DecodeGroupsOfEverySize) {
  FA_REQUIRE_GPU();
  // G = 1 (no sharing), 3 (does not divide the tile), 4, 8 and 32 (MQA); unsplit and split.
  for (auto [h, hkv] : {std::pair{4, 4}, std::pair{6, 2}, std::pair{32, 8}, std::pair{16, 2}, std::pair{32, 1}})
    for (int64_t d : {64, 128})
      for (int splits : {1, 3}) expect_split_matches(split_shape(2, h, hkv, 1, 777, d), splits, splits);
}

TEST(GqaPacking, TileEdgeInsideAQueryGroupCausal) {
  FA_REQUIRE_GPU();
  // G = 3: packed row 128 is query 42's third head, so the second tile starts mid-group. Causal in
  // both alignments, N_q != N_kv: each row sees the keys of its query.
  for (CausalAlign align : {CausalAlign::top_left, CausalAlign::bottom_right})
    for (int splits : {1, 2}) expect_split_matches(split_shape(1, 6, 2, 100, 301, 64, true, align), splits, splits);
  // G = 32: 5 speculative rows are 160 packed rows, two tiles; bottom-right, each row one key on.
  expect_split_matches(split_shape(2, 32, 1, 5, 1000, 128, true), 1, 1);
  expect_split_matches(split_shape(2, 32, 1, 5, 1000, 128, true), 4, 4);
}

TEST(GqaPacking, RowsThatSeeNoKeyAreZero) {
  FA_REQUIRE_GPU();
  // Bottom-right, N_q > N_kv, G = 4: the first 37 queries of every head see no key.
  expect_split_matches(split_shape(1, 8, 2, 70, 33, 128, true), 1, 1);
  expect_split_matches(split_shape(1, 8, 2, 70, 33, 128, true), 3, 3);
}

TEST(GqaPacking, BnhdLayoutDecode) {
  FA_REQUIRE_GPU();
  // (B, N, H, D): a query's heads are D elements apart and its queries H·D apart; the packed rows
  // go through both strides.
  for (int splits : {1, 4}) {
    ProblemShape s = split_shape(3, 16, 4, 3, 2000, 128, true);
    s.layout = Layout::bnhd;
    expect_split_matches(s, splits, splits);
  }
}

}  // namespace
}  // namespace fa
