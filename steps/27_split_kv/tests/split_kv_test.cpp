// Step 27's split-KV forward against the reference: decode shapes (one or a few query rows, a long
// cache, GQA), splits from 2 to more than there are KV tiles (empty ranges), causal bottom-right
// with rows that see no key, a prefill split, and the step's own choice of S. The workspace starts
// poisoned (NaN), as do O and LSE with their guard regions: a partial result the combine reads
// without its block having written it, or a row it fails to write, shows.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

ProblemShape shape(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nkv, int64_t d, bool causal = false,
                   CausalAlign align = CausalAlign::bottom_right) {
  ProblemShape s;
  s.batch = b, s.heads_q = h, s.heads_kv = hkv, s.seqlen_q = nq, s.seqlen_kv = nkv, s.head_dim = d;
  s.causal = causal, s.align = align, s.with_lse = true;
  s.seed = uint64_t(27000 + b * 7 + h * 11 + nq * 13 + nkv * 17 + d + causal);
  return s;
}

// Runs the step with num_splits (0: its own choice) and a poisoned workspace of `workspace_splits`
// splits' size; returns the workspace after the call.
std::vector<unsigned char> expect_split_matches(const ProblemShape& s, int num_splits, int workspace_splits) {
  AttentionProblem prob(s);
  const ReferenceData ref = compute_reference(prob);
  AttentionParams p = prob.params();
  const size_t bytes = split_kv_workspace_bytes(p, workspace_splits);
  DeviceBuffer<unsigned char> ws(bytes);
  ws.poison();
  p.num_splits = num_splits;
  p.workspace = bytes ? ws.get() : nullptr;
  p.workspace_bytes = bytes;
  prob.poison_outputs();
  const Status st = testing::the_step().forward(p, nullptr);
  EXPECT_TRUE(st.ok()) << st.message();
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  SCOPED_TRACE(to_string(s) + ", num_splits " + std::to_string(num_splits));
  const CompareResult co = compare(prob.output_bhnd(), ref.o, bf16_tolerance());
  const CompareResult cl = compare(prob.lse(), ref.lse, lse_tolerance());
  EXPECT_TRUE(co.ok) << "O: " << co.summary();
  EXPECT_TRUE(cl.ok) << "LSE: " << cl.summary();
  std::string why;
  EXPECT_TRUE(prob.memory_intact(&why)) << why;
  std::vector<unsigned char> after = bytes ? ws.download() : std::vector<unsigned char>{};
  if (num_splits > 1) {  // a split writes its partial results: an unsplit run would pass the checks above too
    size_t written = 0;
    for (unsigned char c : after) written += c != 0xFF;
    EXPECT_GT(written, 0u) << "num_splits = " << num_splits
                           << ": the workspace was not written, the step did not split";
  }
  return after;
}

TEST(SplitKv, DecodeMatchesTheReference) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128})
    for (int splits : {2, 3, 7}) expect_split_matches(shape(2, 8, 2, 1, 1000, d), splits, splits);  // GQA 8/2, ragged
}

TEST(SplitKv, MoreSplitsThanKvTilesLeaveEmptyRanges) {
  FA_REQUIRE_GPU();
  // 100 keys: two KV tiles of 64; ranges 2..7 hold none (LSE −inf, weight 0 in the combine).
  expect_split_matches(shape(1, 4, 4, 1, 100, 128), 8, 8);
  expect_split_matches(shape(1, 4, 1, 3, 17, 64), kMaxKvSplits, kMaxKvSplits);
}

TEST(SplitKv, CausalBottomRightFewRows) {
  FA_REQUIRE_GPU();
  // Speculative decoding: 5 new rows against 777 cached keys, each row one key further.
  expect_split_matches(shape(2, 8, 4, 5, 777, 128, /*causal=*/true), 4, 4);
}

TEST(SplitKv, RowsThatSeeNoKeyAreZero) {
  FA_REQUIRE_GPU();
  // Bottom-right, N_q > N_kv: the first 37 rows see no key in any range (O = 0, LSE = −inf).
  expect_split_matches(shape(1, 4, 2, 70, 33, 64, /*causal=*/true), 3, 3);
}

TEST(SplitKv, LongCacheManySplits) {
  FA_REQUIRE_GPU();
  expect_split_matches(shape(1, 8, 2, 1, 16384, 128), 64, 64);
}

TEST(SplitKv, PrefillSplitsToo) {
  FA_REQUIRE_GPU();
  // A Q tile of many rows split the same way (chunked prefill), causal top-left, N_q != N_kv.
  expect_split_matches(shape(1, 4, 2, 300, 513, 64, /*causal=*/true, CausalAlign::top_left), 2, 2);
}

TEST(SplitKv, StepChoosesToSplitADecodeWhenGivenAWorkspace) {
  FA_REQUIRE_GPU();
  // B·H_q = 8 blocks on a whole GPU: the heuristic splits. The call is right, and the workspace
  // was written (it splits), within the bytes it was given.
  const std::vector<unsigned char> ws = expect_split_matches(shape(1, 8, 2, 1, 8192, 128), 0, kMaxKvSplits);
  size_t written = 0;
  for (unsigned char c : ws) written += c != 0xFF;
  EXPECT_GT(written, 0u) << "num_splits = 0 with a workspace: the step did not split an 8-block decode";
  // Without a workspace it does not split, and is still right.
  expect_split_matches(shape(1, 8, 2, 1, 8192, 128), 0, 1);
}

}  // namespace
}  // namespace fa
