// main() of every per-step GPU test executable: registers the shared suite for the step(s)
// linked in, then runs GoogleTest.
#include <gtest/gtest.h>

#include <string>

#include "tests/gpu/step_suite.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  bool large = false;
  for (int i = 1; i < argc; ++i) large |= std::string(argv[i]) == "--fa_large";
  if (large) {
    // Only the large suite: a step's own TEST()s register themselves statically and would run
    // again here (and some of them, like the tuner's first-call test, expect a fresh process).
    if (GTEST_FLAG_GET(filter) == "*") GTEST_FLAG_SET(filter, "Overflow.*");
    fa::testing::register_large_suite();
  } else {
    fa::testing::register_step_suite();
  }
  return RUN_ALL_TESTS();
}
