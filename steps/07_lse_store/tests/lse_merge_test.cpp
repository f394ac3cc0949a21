// The LSE tests of a step that writes it (07 on; the step is the one this executable holds). LSE
// against the fp64 reference is in the shared suite (every case compares it once caps.lse is
// set); here: two halves of the keys, run as two separate attention calls with their own LSE,
// merged with device/lse_merge.h, must equal the full result. Plus every compiled configuration,
// with its LSE, as in step 06.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "device/lse_merge.h"
#include "tests/gpu/config_sweep.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

// Splits the keys at `split`: part A sees keys [0, split), part B keys [split, N). Causal needs
// N_q == N_kv: part A keeps the top-left diagonal; part B's keys are shifted by `split`, which is
// bottom-right alignment of an N_q × (N − split) problem (offset = −split). Part B's first
// `split` rows see no key at all: O = 0 and LSE = -inf there, weight 0 in the merge.
void expect_split_merge_matches(int64_t n, int64_t split, int64_t d, bool causal) {
  FA_REQUIRE_GPU();
  ProblemShape s;
  s.batch = 2, s.heads_q = 4, s.heads_kv = 2, s.seqlen_q = s.seqlen_kv = n, s.head_dim = d, s.causal = causal;
  s.with_lse = true;
  s.seed = uint64_t(7000 + n + split + d + causal);
  AttentionProblem prob(s);
  ReferenceData ref = compute_reference(prob);
  const AttentionParams full = prob.params();
  const size_t rows = size_t(s.batch * s.heads_q * n);
  DeviceBuffer<__nv_bfloat16> o_a(rows * size_t(d)), o_b(rows * size_t(d));
  DeviceBuffer<float> lse_a(rows), lse_b(rows);
  o_a.poison(), o_b.poison(), lse_a.poison(), lse_b.poison();

  AttentionParams a = full;
  a.seqlen_kv = split;
  a.o = o_a.get();
  a.lse = lse_a.get();
  AttentionParams b = full;
  b.k = static_cast<const __nv_bfloat16*>(full.k) + split * full.k_stride.seq;
  b.v = static_cast<const __nv_bfloat16*>(full.v) + split * full.v_stride.seq;
  b.seqlen_kv = n - split;
  b.causal_align = CausalAlign::bottom_right;  // offset (n − split) − n = −split
  b.o = o_b.get();
  b.lse = lse_b.get();
  const StepInfo& step = testing::the_step();
  Status sa = step.forward(a, nullptr), sb = step.forward(b, nullptr);
  ASSERT_TRUE(sa.ok()) << sa.message();
  ASSERT_TRUE(sb.ok()) << sb.message();
  FA_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<float> oa = to_float(o_a), ob = to_float(o_b), la = lse_a.download(), lb = lse_b.download();
  std::vector<float> merged_o(rows * size_t(d)), merged_lse(rows);
  for (size_t r = 0; r < rows; ++r) {
    const LseMergeWeights w = merge_lse(la[r], lb[r]);
    merged_lse[r] = w.lse;
    for (int64_t c = 0; c < d; ++c)
      merged_o[r * size_t(d) + size_t(c)] =
          merge_output(oa[r * size_t(d) + size_t(c)], ob[r * size_t(d) + size_t(c)], w);
  }
  const CompareResult co = compare(merged_o, ref.o, bf16_tolerance());
  const CompareResult cl = compare(merged_lse, ref.lse, lse_tolerance());
  EXPECT_TRUE(co.ok) << "merged O: " << co.summary();
  EXPECT_TRUE(cl.ok) << "merged LSE: " << cl.summary();
}

TEST(LseMerge, TwoKeyHalvesMergeToTheFullResult_D64) {
  expect_split_merge_matches(1000, 448, 64, false);
}
TEST(LseMerge, TwoKeyHalvesMergeToTheFullResult_D128) {
  expect_split_merge_matches(777, 300, 128, false);
}
TEST(LseMerge, CausalHalvesMergeToTheFullResult_D64) {
  expect_split_merge_matches(1000, 448, 64, true);
}
TEST(LseMerge, CausalHalvesMergeToTheFullResult_D128) {
  expect_split_merge_matches(777, 300, 128, true);
}

}  // namespace
}  // namespace fa
