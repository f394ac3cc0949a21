// The production mma.sync forward's test program: the shared GPU suite (tests/gpu/step_suite.cpp)
// runs on it as on every step; here, what sets it apart from a step.
#include <gtest/gtest.h>

#include "fa/registry.h"
#include "kernels/kernels.h"
#include "tests/gpu/step_suite.h"

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

}  // namespace
}  // namespace fa
