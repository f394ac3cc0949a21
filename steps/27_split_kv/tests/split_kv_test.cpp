// Step 27's split-KV forward against the reference: decode shapes (one or a few query rows, a long
// cache, GQA), splits from 2 to more than there are KV tiles (empty ranges), causal bottom-right
// with rows that see no key, a prefill split, and the step's own choice of S. The workspace starts
// poisoned (NaN), as do O and LSE with their guard regions: a partial result the combine reads
// without its block having written it, or a row it fails to write, shows.
#include <gtest/gtest.h>

#include <vector>

#include "tests/gpu/split_kv_check.h"

namespace fa {
namespace {

using testing::expect_split_matches;
using testing::split_shape;

TEST(SplitKv, DecodeMatchesTheReference) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128})
    for (int splits : {2, 3, 7})
      expect_split_matches(split_shape(2, 8, 2, 1, 1000, d), splits, splits);  // GQA 8/2, ragged
}

TEST(SplitKv, MoreSplitsThanKvTilesLeaveEmptyRanges) {
  FA_REQUIRE_GPU();
  // 100 keys: two KV tiles of 64; ranges 2..7 hold none (LSE −inf, weight 0 in the combine).
  expect_split_matches(split_shape(1, 4, 4, 1, 100, 128), 8, 8);
  expect_split_matches(split_shape(1, 4, 1, 3, 17, 64), kMaxKvSplits, kMaxKvSplits);
}

TEST(SplitKv, CausalBottomRightFewRows) {
  FA_REQUIRE_GPU();
  // Speculative decoding: 5 new rows against 777 cached keys, each row one key further.
  expect_split_matches(split_shape(2, 8, 4, 5, 777, 128, /*causal=*/true), 4, 4);
}

TEST(SplitKv, RowsThatSeeNoKeyAreZero) {
  FA_REQUIRE_GPU();
  // Bottom-right, N_q > N_kv: the first 37 rows see no key in any range (O = 0, LSE = −inf).
  expect_split_matches(split_shape(1, 4, 2, 70, 33, 64, /*causal=*/true), 3, 3);
}

TEST(SplitKv, LongCacheManySplits) {
  FA_REQUIRE_GPU();
  expect_split_matches(split_shape(1, 8, 2, 1, 16384, 128), 64, 64);
}

TEST(SplitKv, PrefillSplitsToo) {
  FA_REQUIRE_GPU();
  // A Q tile of many rows split the same way (chunked prefill), causal top-left, N_q != N_kv.
  expect_split_matches(split_shape(1, 4, 2, 300, 513, 64, /*causal=*/true, CausalAlign::top_left), 2, 2);
}

TEST(SplitKv, StepChoosesToSplitADecodeWhenGivenAWorkspace) {
  FA_REQUIRE_GPU();
  // B·H_q = 8 blocks on a whole GPU: the heuristic splits. The call is right, and the workspace
  // was written (it splits), within the bytes it was given.
  const std::vector<unsigned char> ws = expect_split_matches(split_shape(1, 8, 2, 1, 8192, 128), 0, kMaxKvSplits);
  EXPECT_GT(testing::bytes_written(ws), 0u)
      << "num_splits = 0 with a workspace: the step did not split an 8-block decode";
  // Without a workspace it does not split, and is still right.
  expect_split_matches(split_shape(1, 8, 2, 1, 8192, 128), 0, 1);
}

}  // namespace
}  // namespace fa
