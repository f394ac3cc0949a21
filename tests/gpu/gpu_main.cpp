// main() of every per-step GPU test executable: registers the shared suite for the step(s)
// linked in, then runs GoogleTest.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "harness/gpu.h"
#include "tests/gpu/step_suite.h"

namespace {

// A step built for one GPU generation only (the sm_90a instructions of the Hopper steps) does not
// run on another: then every test is reported SKIPPED, with the reason, and none passes.
class StepRunsOnThisGpu : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!fa::gpu_available()) return;  // each GPU test skips by itself (FA_REQUIRE_GPU)
    if (fa::Status st = fa::check_device(fa::testing::the_step().caps); !st.ok())
      GTEST_SKIP() << "step " << fa::testing::the_step().number << ": " << st.message() << ": NOT RUN";
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new StepRunsOnThisGpu);
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
  // ctest runs each test as --gtest_filter=<its name>: a name holding one of the filter's own
  // characters ('-' starts the exclusions, ':' separates patterns, '*' and '?' match) would select
  // another test or none, and a program that ran no test exits 0. Such a name is refused here.
  const ::testing::UnitTest& all = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < all.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *all.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const std::string name = std::string(suite.name()) + "." + suite.GetTestInfo(j)->name();
      if (name.find_first_of("-:*?") != std::string::npos) {
        std::fprintf(stderr, "test name %s holds one of GoogleTest's filter characters (- : * ?): rename it\n",
                     name.c_str());
        return 1;
      }
    }
  }
  return RUN_ALL_TESTS();
}
