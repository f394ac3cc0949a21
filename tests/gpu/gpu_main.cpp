// main() of every per-step GPU test executable: registers the shared suite for the step(s)
// linked in, then runs GoogleTest.
#include <gtest/gtest.h>

#include "tests/gpu/step_suite.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  fa::testing::register_step_suite();
  return RUN_ALL_TESTS();
}
