// Step 06's own tests: the tuning key carries this build's id (seed bug #10; no GPU needed), every
// compiled configuration is correct, the tuner caches, and FA_AUTOTUNE=0 falls back to the
// heuristic.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>

#include "library/autotune.h"
#include "fa/registry.h"
#include "fa/steps.h"
#include "tests/gpu/config_sweep.h"

namespace fa {
namespace {

AttentionParams shape_only(int64_t n, int64_t d, bool causal) {
  AttentionParams p;
  p.batch = 2;
  p.heads_q = p.heads_kv = 16;
  p.seqlen_q = p.seqlen_kv = n;
  p.head_dim = d;
  p.causal = causal;
  set_bhnd_strides(p);
  return p;
}

// Seed bug #10 (stale autotune cache): the key must name the build of the kernels, so timings
// cached by an older build are never looked up by this one. Runs without a GPU.
TEST(AutotuneKey, StepKeyCarriesThisBuildId) {
  const std::string id = step06::build_id();
  ASSERT_FALSE(id.empty());
  const std::string key = step06::tuning_key(shape_only(4096, 64, true));
  EXPECT_NE(key.find("build=" + id), std::string::npos) << "tuning key without the build id: " << key;
  // And the cache keeps builds apart: an entry written under another build id is not found.
  autotune::Cache cache("");
  autotune::Key older = autotune::shape_key(shape_only(4096, 64, true));
  older.gpu = autotune::current_gpu_name();
  older.build_id = autotune::hash_hex("an older build");
  cache.put(older, "BLOCK_M=64 BLOCK_N=64 warps=4 stages=2", 1.0);
  autotune::Key now = older;
  now.build_id = id;
  EXPECT_EQ(now.str(), key) << "step 06 builds its key differently from shape_key + gpu + build id";
  EXPECT_FALSE(cache.find(now));
}

TEST(AutotuneKey, ShapeAndCausalChangeTheKey) {
  EXPECT_NE(step06::tuning_key(shape_only(4096, 64, true)), step06::tuning_key(shape_only(4096, 64, false)));
  EXPECT_NE(step06::tuning_key(shape_only(4096, 64, true)), step06::tuning_key(shape_only(4096, 128, true)));
  EXPECT_NE(step06::tuning_key(shape_only(4096, 64, true)), step06::tuning_key(shape_only(2048, 64, true)));
}

TEST(AutotuneConfigs, EveryConfigMatchesTheReference) {
  testing::expect_every_config_matches(&step06::config_names, &step06::forward_with_config, false);
}

TEST(AutotuneConfigs, UnknownConfigIsRefused) {
  FA_REQUIRE_GPU();
  ProblemShape s;
  s.with_lse = false;
  AttentionProblem prob(s);
  Status st = step06::forward_with_config(prob.params(), "BLOCK_M=7", nullptr);
  EXPECT_FALSE(st.ok());
}

TEST(Autotune, FirstCallTunesThenTheCacheAnswers) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  // A shape this build has most likely never tuned: the cache file outlives the process, and a
  // key tuned by an earlier run of this very binary would make the first call a cache hit.
  const int64_t fresh = int64_t(::getpid()) % 509 + int64_t(std::time(nullptr)) % 499;
  ProblemShape s;
  s.batch = 1, s.heads_q = s.heads_kv = 3, s.seqlen_q = 517 + fresh, s.seqlen_kv = 999, s.head_dim = 64;
  s.with_lse = false;
  s.seed = 606;
  AttentionProblem prob(s);
  ASSERT_TRUE(step.describe);
  const std::string before = step.describe(prob.params());
  ReferenceData ref = compute_reference(prob);
  CheckResult r = run_and_check(step, prob, ref);
  EXPECT_TRUE(r.ok()) << r.summary();
  const std::string after = step.describe(prob.params());
  std::cout << "    before: " << before << "\n    after:  " << after << "\n";
  if (autotune::enabled()) {
    EXPECT_NE(before.find("not tuned yet"), std::string::npos) << before;
    EXPECT_NE(after.find("(tuned)"), std::string::npos) << after;
  }
}

TEST(Autotune, DisabledUsesTheHeuristic) {
  FA_REQUIRE_GPU();
  const char* old = std::getenv("FA_AUTOTUNE");
  const std::string saved = old ? old : "";
  ::setenv("FA_AUTOTUNE", "0", 1);
  const StepInfo& step = testing::the_step();
  ProblemShape s;
  s.batch = 2, s.heads_q = s.heads_kv = 2, s.seqlen_q = 333, s.seqlen_kv = 444, s.head_dim = 128, s.causal = true;
  s.with_lse = step.caps.lse;
  s.seed = 607;
  AttentionProblem prob(s);
  const std::string how = step.describe(prob.params());
  ReferenceData ref = compute_reference(prob);
  CheckResult r = run_and_check(step, prob, ref);
  if (old)
    ::setenv("FA_AUTOTUNE", saved.c_str(), 1);
  else
    ::unsetenv("FA_AUTOTUNE");
  EXPECT_NE(how.find("heuristic"), std::string::npos) << how;
  EXPECT_TRUE(r.ok()) << r.summary();
}

}  // namespace
}  // namespace fa
