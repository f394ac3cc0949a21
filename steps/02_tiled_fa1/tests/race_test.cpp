// Step 02 keeps one K/V tile in shared memory while every warp of the block walks all Q tiles
// against it. The barrier at the end of the KV loop stops a warp that is done with the tile from
// loading the next one over it while other warps still read it. These shapes make an early
// finisher certain: N_q leaves the last Q tile with rows for the first warp or two only, so the
// other warps skip that tile and reach the next load while the first ones are still computing,
// and ~63 K/V tiles give the race 63 chances per head. Each case runs three times.
#include <gtest/gtest.h>

#include "harness/check.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

void expect_no_race(int64_t batch, int64_t heads, int64_t n_q, int64_t n_kv, int64_t head_dim, uint64_t seed) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  ProblemShape s;
  s.batch = batch;
  s.heads_q = s.heads_kv = heads;
  s.seqlen_q = n_q;
  s.seqlen_kv = n_kv;
  s.head_dim = head_dim;
  s.seed = seed;
  s.with_lse = false;
  AttentionProblem prob(s);
  const ReferenceData ref = compute_reference(prob);
  for (int run = 0; run < 3; ++run) {
    const CheckResult r = run_and_check(step, prob, ref);  // poisons O before every run
    EXPECT_TRUE(r.ok()) << "run " << run << " on " << to_string(s) << "\n  " << r.summary();
  }
}

// B·H = 132: one block per SM of an H200, each an independent chance for the race; one corrupted
// row anywhere is enough to fail the element-wise check.
// N_q = 2000 = 31·64 + 16: the last Q tile has rows for warps 0 and 1 only.
TEST(Step02Race, B4_H33_N2000_D64) {
  expect_no_race(4, 33, 2000, 2000, 64, 0x2ace01);
}
TEST(Step02Race, B2_H66_N2000_D128) {
  expect_no_race(2, 66, 2000, 2000, 128, 0x2ace02);
}
// N_q = 1985 = 31·64 + 1: warp 0 alone computes the last Q tile; N_kv ragged too.
TEST(Step02Race, B4_H33_N1985x2003_D64) {
  expect_no_race(4, 33, 1985, 2003, 64, 0x2ace03);
}

}  // namespace
}  // namespace fa
