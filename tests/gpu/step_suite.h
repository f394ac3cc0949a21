// The shared, parametrised GPU suite. Test names are stable: the bug catalog and the mutation
// tests select them with gtest filters such as "Suite.LargeLogits*".
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "harness/gpu.h"
#include "harness/problem.h"
#include "fa/registry.h"

namespace fa::testing {

// Registers, for every registered step, the cases its capabilities allow.
void register_step_suite();
// Registers the tests that need tens of GB of GPU memory (run alone: `--fa_large`).
void register_large_suite();

// Runs `step` on a fresh problem of `shape` and expects a match with the reference.
void expect_matches_reference(const StepInfo& step, const ProblemShape& shape);

// A tensor past 2^31 elements: correct results (or a clear refusal, for steps with a limit).
void expect_64bit_offsets(const StepInfo& step);

// The single registered step of this executable (fails the test if there is not exactly one).
const StepInfo& the_step();

/// The head dims a step's backward has: Capabilities::backward_head_dims, or where that is empty
/// every head dim of its forward.
inline const std::vector<int>& backward_head_dims(const StepInfo& step) {
  return step.caps.backward_head_dims.empty() ? step.caps.head_dims : step.caps.backward_head_dims;
}

/// Whether the GPU runs sm_90 code (compute capability 9.0: an H100 or H200), as the library's
/// check_device says: the mma.sync backward at D = 256 is built and run there alone.
inline bool runs_sm90() {
  Capabilities sm90;
  sm90.only_sm = 90;
  return check_device(sm90).ok();
}

// Whether the step takes fp16 (the production kernels built with FA_DTYPES=bf16;fp16).
inline bool takes_fp16(const StepInfo& step) {
  return std::find(step.caps.dtypes.begin(), step.caps.dtypes.end(), DType::fp16) != step.caps.dtypes.end();
}

}  // namespace fa::testing

// Skips the current test (reported as SKIPPED, never as a pass) when the step under test has no
// fp16 kernels: every lesson, and the production kernels in a build without FA_DTYPES=bf16;fp16.
#define FA_REQUIRE_FP16()                                                                                       \
  do {                                                                                                          \
    if (!::fa::testing::takes_fp16(::fa::testing::the_step()))                                                  \
      GTEST_SKIP() << "the step has no fp16 kernels (FA_DTYPES=bf16;fp16 builds the production ones): NOT RUN"; \
  } while (0)

// Skips the current test (reported as SKIPPED, never as a pass) when no GPU is present.
#define FA_REQUIRE_GPU()                                                                 \
  do {                                                                                   \
    std::string fa_why_;                                                                 \
    if (!::fa::gpu_available(&fa_why_)) GTEST_SKIP() << fa_why_ << ": GPU test skipped"; \
  } while (0)

// Skips the current test unless the GPU runs sm_90a code (compute capability 9.0): the tests of
// the Hopper wrappers, built for that target alone. The reason is the library's (check_device).
#define FA_REQUIRE_SM90A()                                                      \
  do {                                                                          \
    FA_REQUIRE_GPU();                                                           \
    ::fa::Capabilities fa_caps_;                                                \
    fa_caps_.only_sm = 90;                                                      \
    if (const ::fa::Status fa_st_ = ::fa::check_device(fa_caps_); !fa_st_.ok()) \
      GTEST_SKIP() << fa_st_.message() << ": NOT RUN";                          \
  } while (0)
