// The tests of a tuned step's tuner (library/tuner.h). They find the tuner through the one step
// this executable holds, so the same tests serve every tuned step: the key carries the build id
// (seed bug #10), every compiled configuration is correct, the first call tunes and later calls
// find the result, FA_AUTOTUNE=0 falls back to the heuristic, a tuned call costs a lookup on the
// host, and the first call on a large shape stays bounded.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>

#include "fa/registry.h"
#include "harness/check.h"
#include "harness/cuda_check.h"
#include "library/autotune.h"
#include "library/tuner.h"
#include "tests/gpu/config_sweep.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

// Every run of this executable tunes into a cache file of its own, in a fresh folder: the tests
// never read or write the user's cache, and a second run starts from an empty cache again. The
// tuners read FA_AUTOTUNE_CACHE at their first call, which comes after this SetUp.
class OwnTuningCache : public ::testing::Environment {
 public:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "fa_tuner_test_XXXXXX").string();
    if (!::mkdtemp(pattern.data())) return;  // the tuner then uses the default path
    dir_ = pattern;
    ::setenv("FA_AUTOTUNE_CACHE", (dir_ + "/autotune.txt").c_str(), 1);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::string dir_;
};
[[maybe_unused]] ::testing::Environment* const kOwnTuningCache =
    ::testing::AddGlobalTestEnvironment(new OwnTuningCache);

// The tuner of the step this executable holds (nullptr if it has none).
const tuner::Tuner* the_tuner() {
  return tuner::find_tuner(testing::the_step().number);
}

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

// Sets FA_AUTOTUNE for the lifetime of the guard, then restores it.
class AutotuneSwitch {
 public:
  explicit AutotuneSwitch(const char* value) {
    if (const char* old = std::getenv("FA_AUTOTUNE")) saved_ = old;
    ::setenv("FA_AUTOTUNE", value, 1);
  }
  ~AutotuneSwitch() {
    if (saved_)
      ::setenv("FA_AUTOTUNE", saved_->c_str(), 1);
    else
      ::unsetenv("FA_AUTOTUNE");
  }

 private:
  std::optional<std::string> saved_;
};

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Seed bug #10 (stale autotune cache): the key must name the build of the kernels, so timings
// cached by an older build are never looked up by this one. Runs without a GPU.
TEST(AutotuneKey, StepKeyCarriesThisBuildId) {
  const tuner::Tuner* t = the_tuner();
  ASSERT_NE(t, nullptr) << "step " << testing::the_step().number << " registers no tuner";
  // FA_BUILD_ID: 16 hex digits of a hash over what the step compiles (cmake/FaCourse.cmake). A
  // fixed name instead would be the same for every build, and a rebuild would reuse old timings.
  const std::string& id = t->build_id();
  EXPECT_EQ(id.size(), 16u) << "build id '" << id << "' is not the build's hash";
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos)
      << "build id '" << id << "' is not the build's hash";
  const AttentionParams p = shape_only(4096, 64, true);
  const std::string key = t->key(p);
  EXPECT_NE(key.find("build=" + id), std::string::npos) << "tuning key without the build id: " << key;
  // And the cache keeps builds apart: an entry written under another build id is not found.
  autotune::Cache cache("");
  autotune::Key older = autotune::shape_key(p);
  older.gpu = autotune::current_device().name;
  older.build_id = autotune::hash_hex("an older build");
  cache.put(older, "BLOCK_M=64 BLOCK_N=64 warps=4 stages=2", 1.0);
  autotune::Key now = older;
  now.build_id = id;
  EXPECT_EQ(now.str(), key) << "the tuner builds its key differently from shape_key + gpu + build id";
  EXPECT_FALSE(cache.find(now));
}

TEST(AutotuneKey, ShapeCausalHeadsLayoutAndLseChangeTheKey) {
  const tuner::Tuner* t = the_tuner();
  ASSERT_NE(t, nullptr);
  const AttentionParams base = shape_only(4096, 64, true);
  const std::string key = t->key(base);
  EXPECT_NE(t->key(shape_only(4096, 64, false)), key);
  EXPECT_NE(t->key(shape_only(4096, 128, true)), key);
  EXPECT_NE(t->key(shape_only(2048, 64, true)), key);
  AttentionParams bottom_right = base;
  bottom_right.causal_align = CausalAlign::bottom_right;
  EXPECT_NE(t->key(bottom_right), key);
  AttentionParams gqa = base;
  gqa.heads_kv = 4;
  set_bhnd_strides(gqa);
  EXPECT_NE(t->key(gqa), key);
  AttentionParams bnhd = base;
  bnhd.q_stride = bnhd.k_stride = bnhd.v_stride = bnhd.o_stride = bnhd_strides(16, 4096, 64);
  EXPECT_NE(t->key(bnhd), key);
  AttentionParams with_lse = base;
  float lse_stand_in = 0;
  with_lse.lse = &lse_stand_in;  // never dereferenced
  EXPECT_NE(t->key(with_lse), key);
}

TEST(AutotuneConfigs, EveryConfigMatchesTheReference) {
  testing::expect_every_config_matches(testing::the_step());
}

TEST(AutotuneConfigs, UnknownConfigIsRefused) {
  FA_REQUIRE_GPU();
  const tuner::Tuner* t = the_tuner();
  ASSERT_NE(t, nullptr);
  ProblemShape s;
  s.with_lse = testing::the_step().caps.lse;
  AttentionProblem prob(s);
  const Status st = t->run_config(prob.params(), "BLOCK_M=7", nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("has no config 'BLOCK_M=7' for head dim 64"), std::string::npos) << st.message();
}

TEST(Autotune, FirstCallTunesThenTheCacheAnswers) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  const tuner::Tuner* t = the_tuner();
  ASSERT_NE(t, nullptr);
  ProblemShape s;
  s.batch = 1, s.heads_q = s.heads_kv = 3, s.seqlen_q = 517, s.seqlen_kv = 999, s.head_dim = 64;
  s.with_lse = step.caps.lse;
  s.seed = 606;
  AttentionProblem prob(s);
  const std::string before = describe_config(step, prob.params());
  ReferenceData ref = compute_reference(prob);
  CheckResult r = run_and_check(step, prob, ref);
  EXPECT_TRUE(r.ok()) << r.summary();
  const std::string after = describe_config(step, prob.params());
  std::cout << "    before: " << before << "\n    after:  " << after << "\n";
  if (autotune::enabled()) {
    EXPECT_NE(before.find("not tuned yet"), std::string::npos) << before;
    EXPECT_NE(after.find("(tuned)"), std::string::npos) << after;
    // The winner is in the cache file too, for the next process with this build.
    const char* path = std::getenv("FA_AUTOTUNE_CACHE");
    ASSERT_NE(path, nullptr);
    EXPECT_NE(file_text(path).find(t->key(prob.params()) + '\t'), std::string::npos)
        << "no line for the key in " << path;
  }
}

TEST(Autotune, DisabledUsesTheHeuristic) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  const tuner::Tuner* t = the_tuner();
  ASSERT_NE(t, nullptr);
  const AutotuneSwitch off("0");
  ProblemShape s;
  s.batch = 2, s.heads_q = s.heads_kv = 2, s.seqlen_q = 333, s.seqlen_kv = 444, s.head_dim = 128, s.causal = true;
  s.with_lse = step.caps.lse;
  s.seed = 607;
  AttentionProblem prob(s);
  const std::string how = describe_config(step, prob.params());
  const tuner::KernelConfig* h = t->heuristic(prob.params());
  ASSERT_NE(h, nullptr) << "no config fits this GPU";
  EXPECT_EQ(how, h->name() + " (heuristic, FA_AUTOTUNE=0)");
  ReferenceData ref = compute_reference(prob);
  CheckResult r = run_and_check(step, prob, ref);
  EXPECT_TRUE(r.ok()) << r.summary();
}

// Once a key is tuned, a call costs the key's string, a map lookup and the launch: a decode step
// of a model calls attention once per layer and token, so the host must keep up with the GPU.
TEST(Tuner, HostCostPerCallIsALookup) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  ProblemShape s;
  s.batch = 1, s.heads_q = s.heads_kv = 16, s.seqlen_q = 1, s.seqlen_kv = 4096, s.head_dim = 128;
  s.with_lse = step.caps.lse;
  s.seed = 608;
  AttentionProblem prob(s);
  const AttentionParams p = prob.params();
  cudaStream_t stream = nullptr;
  FA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Status first = step.forward(p, stream);  // tunes the key
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));
  ASSERT_TRUE(first.ok()) << first.message();
  // 10 rounds of 100 calls, the stream drained between rounds outside the timed region: a full
  // launch queue would make the host wait for the GPU, and that is not the host's cost.
  constexpr int kRounds = 10, kCallsPerRound = 100;
  std::chrono::steady_clock::duration host{};
  int failed = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCallsPerRound; ++i) failed += !step.forward(p, stream).ok();
    host += std::chrono::steady_clock::now() - start;
    FA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  FA_CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_EQ(failed, 0);
  const double us = std::chrono::duration<double, std::micro>(host).count() / (kRounds * kCallsPerRound);
  std::cout << "    host cost per call: " << us << " us (" << describe_config(step, p) << ")\n";
  EXPECT_LT(us, 50.0);
}

// The first call of a new key times every config; past kTuneBudgetFlops it times a slice of the
// heads, so a long-context shape does not stall its caller for the whole problem × configs × 6.
TEST(Tuner, FirstCallOnALargeShapeIsBounded) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  ProblemShape s;
  s.batch = 1, s.heads_q = s.heads_kv = 16, s.seqlen_q = s.seqlen_kv = 32768, s.head_dim = 128, s.causal = true;
  s.with_lse = step.caps.lse;
  s.seed = 609;
  AttentionProblem prob(s);
  const AttentionParams p = prob.params();
  const std::string before = describe_config(step, p);
  if (autotune::enabled()) {
    EXPECT_NE(before.find("not tuned yet"), std::string::npos) << "not a first call: " << before;
  }
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto start = std::chrono::steady_clock::now();
  const Status st = step.forward(p, nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(st.ok()) << st.message();
  const std::string after = describe_config(step, p);
  std::cout << "    first call: " << seconds << " s (" << after << ")\n";
  EXPECT_LT(seconds, 20.0);
  if (autotune::enabled()) {
    EXPECT_NE(after.find("(tuned)"), std::string::npos) << after;
  }
}

}  // namespace
}  // namespace fa
