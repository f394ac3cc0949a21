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
    fa::testing::register_large_suite();
  } else {
    fa::testing::register_step_suite();
  }
  return RUN_ALL_TESTS();
}
