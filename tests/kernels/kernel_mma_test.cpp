// The production mma.sync forward's test program: the shared GPU suite (tests/gpu/step_suite.cpp)
// runs on it as on every step; here, what sets it apart from a step.
#include <gtest/gtest.h>

#include <algorithm>

#include "fa/registry.h"
#include "kernels/kernels.h"
#include "tests/gpu/config_sweep.h"
#include "tests/gpu/step_suite.h"
#include "tests/gpu/varlen_check.h"

namespace fa {
namespace {

// It registers under its own number, above every step's, and says which lesson it generalises.
TEST(KernelMma, RegistersAboveTheStepsAndNamesItsLesson) {
  const StepInfo& k = testing::the_step();
  EXPECT_EQ(k.number, kernels::kProductionMma);
  EXPECT_EQ(k.base, 10);
  EXPECT_TRUE(k.caps.causal && k.caps.lse && k.caps.gqa);
  EXPECT_EQ(k.caps.only_sm, 0) << "mma.sync runs on every GPU the build targets";
}

// fp16 (a build with FA_DTYPES=bf16;fp16): every configuration's fp16 kernels over the sweep's shapes
// (ragged, GQA, both alignments, rows with no key, large logits, long sequences, strided rows),
// not only those the tuner picks for the shared suite's Fp16 cases.
TEST(KernelMma, EveryConfigMatchesTheReferenceInFp16) {
  FA_REQUIRE_FP16();
  testing::expect_every_config_matches(testing::the_step(), DType::fp16);
}

// Packed sequences (varlen) in fp16 (a build with FA_DTYPES=bf16;fp16): long ones through the
// forward's own kernels, decode-sized ones through the decode kernel's packed path, split and not,
// in neighbours whose rows would change the result if read and NaN rows past the last.
TEST(KernelMma, PackedSequencesInFp16) {
  FA_REQUIRE_GPU();
  FA_REQUIRE_FP16();
  testing::VarlenOptions fp16;
  fp16.dtype = DType::fp16;
  for (int d : testing::the_step().caps.head_dims) {
    for (bool causal : {false, true})
      testing::expect_varlen_matches({300, 37, 520, 129}, {400, 37, 520, 641}, 4, 2, d, causal, 0, 0,
                                     /*rows_past_last=*/true, "", fp16);
    for (int splits : {0, 3})
      testing::expect_varlen_matches({1, 4, 1, 2}, {1000, 77, 1, 4096}, 32, 8, d, true, splits, 0, false, "", fp16);
  }
}

}  // namespace
}  // namespace fa
