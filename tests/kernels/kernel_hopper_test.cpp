// The production Hopper forward's test program: the shared GPU suite (tests/gpu/step_suite.cpp) and
// the tuner's tests run on it as on every tuned step; here, what sets it apart from a step.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "fa/registry.h"
#include "kernels/kernels.h"
#include "library/tuner.h"
#include "tests/gpu/config_sweep.h"
#include "tests/gpu/step_suite.h"
#include "tests/gpu/varlen_check.h"

namespace fa {
namespace {

// It registers under its own number, above every step's, and says which lesson it generalises.
TEST(KernelHopper, RegistersAboveTheStepsAndNamesItsLesson) {
  const StepInfo& k = testing::the_step();
  EXPECT_EQ(k.number, kernels::kProductionHopper);
  EXPECT_EQ(k.base, 16);
  EXPECT_TRUE(k.caps.causal && k.caps.lse && k.caps.gqa);
  EXPECT_EQ(k.caps.only_sm, 90) << "wgmma and setmaxnreg: sm_90a code";
  EXPECT_TRUE(k.caps.tma);
}

// The epilogue is part of a configuration's name, so the tuner's cache tells the two apart: at
// D = 128 one configuration stores O from the registers, the others through shared memory.
TEST(KernelHopper, TheEpilogueIsInTheConfigurationName) {
  const tuner::Tuner* t = tuner::find_tuner(kernels::kProductionHopper);
  ASSERT_NE(t, nullptr);
  for (int d : testing::the_step().caps.head_dims) {
    const std::vector<std::string> names = t->config_names(d);
    ASSERT_FALSE(names.empty()) << "D = " << d;
    for (const std::string& n : names)
      EXPECT_TRUE(n.find("O=smem") != std::string::npos || n.find("O=registers") != std::string::npos) << n;
    if (d == 128) {
      EXPECT_TRUE(std::any_of(names.begin(), names.end(),
                              [](const std::string& n) { return n.find("O=registers") != std::string::npos; }));
    }
  }
}

// Packed sequences longer than a decode run on this kernel's own configurations (the Packed
// instantiations, kernels/sequences.h): every one of them, not only the tuner's pick, on sequences
// of several Q and KV tiles whose last tiles reach into NaN rows past the last sequence.
TEST(KernelHopper, EveryConfigurationReadsPackedSequences) {
  FA_REQUIRE_GPU();
  const tuner::Tuner* t = tuner::find_tuner(kernels::kProductionHopper);
  ASSERT_NE(t, nullptr);
  int runs = 0;
  for (int d : testing::the_step().caps.head_dims)
    for (const std::string& config : t->config_names(d))
      for (bool causal : {false, true}) {
        SCOPED_TRACE(config);
        testing::expect_varlen_matches({300, 37, 520, 129}, {400, 37, 520, 641}, 4, 2, d, causal, 0, 0,
                                       /*rows_past_last=*/true, config);
        ++runs;
      }
  EXPECT_GT(runs, 0);
}

// The same in fp16 (a build with FA_DTYPES=bf16;fp16): every configuration's fp16 Packed kernels,
// and decode-sized packed rows (the decode kernel's packed path), split and not.
TEST(KernelHopper, EveryConfigurationReadsPackedSequencesInFp16) {
  FA_REQUIRE_GPU();
  FA_REQUIRE_FP16();
  const tuner::Tuner* t = tuner::find_tuner(kernels::kProductionHopper);
  ASSERT_NE(t, nullptr);
  testing::VarlenOptions fp16;
  fp16.dtype = DType::fp16;
  int runs = 0;
  for (int d : testing::the_step().caps.head_dims) {
    for (const std::string& config : t->config_names(d))
      for (bool causal : {false, true}) {
        SCOPED_TRACE(config);
        testing::expect_varlen_matches({300, 37, 520, 129}, {400, 37, 520, 641}, 4, 2, d, causal, 0, 0,
                                       /*rows_past_last=*/true, config, fp16);
        ++runs;
      }
    for (int splits : {0, 3})
      testing::expect_varlen_matches({1, 4, 1, 2}, {1000, 77, 1, 4096}, 32, 8, d, true, splits, 0, false, "", fp16);
  }
  EXPECT_GT(runs, 0);
}

// fp16 (a build with FA_DTYPES=bf16;fp16): every configuration's fp16 kernels over the sweep's shapes
// (ragged, GQA, both alignments, rows with no key, large logits, long sequences, strided rows),
// not only those the tuner picks for the shared suite's Fp16 cases.
TEST(KernelHopper, EveryConfigMatchesTheReferenceInFp16) {
  FA_REQUIRE_FP16();
  testing::expect_every_config_matches(testing::the_step(), DType::fp16);
}

}  // namespace
}  // namespace fa
