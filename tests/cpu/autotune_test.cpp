// The tuner's cache logic (library/autotune.h) and the LSE merge (device/lse_merge.h), on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <utility>
#include <vector>
#include <string>

#include "library/autotune.h"
#include "device/lse_merge.h"

namespace fa {
namespace {

autotune::Key sample_key() {
  autotune::Key k;
  k.seqlen_q = 4096;
  k.seqlen_kv = 4096;
  k.head_dim = 64;
  k.batch_heads = 32;
  k.causal = "top_left";
  k.gpu = "NVIDIA H200";
  k.build_id = "0123456789abcdef";
  return k;
}

std::string temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("fa_autotune_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto p = dir / name;
  std::filesystem::remove(p);
  return p.string();
}

TEST(AutotuneKey, EveryFieldChangesTheKey) {
  const std::string base = sample_key().str();
  auto changed = [&](auto edit) {
    autotune::Key k = sample_key();
    edit(k);
    return k.str() != base;
  };
  EXPECT_TRUE(changed([](autotune::Key& k) { k.seqlen_q = 4095; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.seqlen_kv = 1; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.head_dim = 128; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.batch_heads = 1; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.causal = "none"; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.gpu = "NVIDIA A100-SXM4-80GB"; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.build_id = "fedcba9876543210"; }));  // seed bug #10
  EXPECT_EQ(base.find('\t'), std::string::npos);
}

TEST(AutotuneKey, ShapeKeyReadsTheParams) {
  AttentionParams p;
  p.batch = 2;
  p.heads_q = 16;
  p.heads_kv = 4;
  p.seqlen_q = 100;
  p.seqlen_kv = 300;
  p.head_dim = 128;
  p.causal = true;
  p.causal_align = CausalAlign::bottom_right;
  autotune::Key k = autotune::shape_key(p);
  EXPECT_EQ(k.batch_heads, 32);
  EXPECT_EQ(k.seqlen_q, 100);
  EXPECT_EQ(k.seqlen_kv, 300);
  EXPECT_EQ(k.head_dim, 128);
  EXPECT_EQ(k.causal, "bottom_right");
  EXPECT_TRUE(k.gpu.empty());
  EXPECT_TRUE(k.build_id.empty());
}

TEST(AutotuneKey, HashIsStableAndSensitive) {
  EXPECT_EQ(autotune::hash_hex("abc"), autotune::hash_hex("abc"));
  EXPECT_NE(autotune::hash_hex("step06.cu Jan  1 2026 10:00:00"), autotune::hash_hex("step06.cu Jan  1 2026 10:00:01"));
  EXPECT_EQ(autotune::hash_hex("").size(), 16u);
}

TEST(AutotuneCache, MemoryOnlyRoundTrip) {
  autotune::Cache c("");
  EXPECT_FALSE(c.find(sample_key()));
  c.put(sample_key(), "BLOCK_M=128 BLOCK_N=64 warps=8 stages=2", 1.5);
  ASSERT_TRUE(c.find(sample_key()));
  EXPECT_EQ(*c.find(sample_key()), "BLOCK_M=128 BLOCK_N=64 warps=8 stages=2");
}

TEST(AutotuneCache, FileSurvivesTheProcessAndLaterLinesWin) {
  const std::string path = temp_path("nested/dir/autotune.txt");  // folders are created
  {
    autotune::Cache c(path);
    c.put(sample_key(), "first", 2.0);
    c.put(sample_key(), "second", 1.0);
  }
  autotune::Cache again(path);  // a new process, in effect
  ASSERT_TRUE(again.find(sample_key()));
  EXPECT_EQ(*again.find(sample_key()), "second");
}

TEST(AutotuneCache, ResultOfAnotherBuildIsNotReused) {
  // Seed bug #10: timings of an old build of the kernels must not choose for the new build.
  const std::string path = temp_path("stale.txt");
  autotune::Key old_build = sample_key();
  old_build.build_id = autotune::hash_hex("attention.cu, yesterday");
  autotune::Cache(path).put(old_build, "BLOCK_M=64 BLOCK_N=64 warps=4 stages=2", 0.9);
  autotune::Key new_build = sample_key();
  new_build.build_id = autotune::hash_hex("attention.cu, today");
  autotune::Cache c(path);
  EXPECT_FALSE(c.find(new_build)) << "a stale entry from another build was reused";
  EXPECT_TRUE(c.find(old_build));
}

TEST(AutotuneCache, IgnoresGarbageLinesAndUnwritablePaths) {
  const std::string path = temp_path("garbage.txt");
  {
    std::ofstream f(path);
    f << "not a cache line\n\t\n" << sample_key().str() << "\tgood\t1.0\n";
  }
  autotune::Cache c(path);
  ASSERT_TRUE(c.find(sample_key()));
  EXPECT_EQ(*c.find(sample_key()), "good");
  autotune::Cache nowhere("/proc/definitely/not/writable/autotune.txt");
  nowhere.put(sample_key(), "x", 1.0);  // no throw; kept in memory
  EXPECT_EQ(*nowhere.find(sample_key()), "x");
}

// Sets environment variables for one test and restores them afterwards.
class EnvGuard {
 public:
  explicit EnvGuard(std::initializer_list<const char*> names) {
    for (const char* n : names) {
      const char* v = std::getenv(n);
      saved_.push_back({n, v ? std::optional<std::string>(v) : std::nullopt});
    }
  }
  ~EnvGuard() {
    for (auto& [n, v] : saved_) {
      if (v)
        ::setenv(n.c_str(), v->c_str(), 1);
      else
        ::unsetenv(n.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(AutotuneEnv, CachePathAndSwitch) {
  EnvGuard guard({"FA_AUTOTUNE_CACHE", "XDG_CACHE_HOME", "HOME", "FA_AUTOTUNE"});
  ::setenv("FA_AUTOTUNE_CACHE", "/tmp/some/where.txt", 1);
  EXPECT_EQ(autotune::default_cache_path(), "/tmp/some/where.txt");
  ::unsetenv("FA_AUTOTUNE_CACHE");
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(autotune::default_cache_path(), "/xdg/fa2_course/autotune.txt");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/learner", 1);
  EXPECT_EQ(autotune::default_cache_path(), "/home/learner/.cache/fa2_course/autotune.txt");
  ::setenv("FA_AUTOTUNE", "0", 1);
  EXPECT_FALSE(autotune::enabled());
  ::setenv("FA_AUTOTUNE", "1", 1);
  EXPECT_TRUE(autotune::enabled());
  ::unsetenv("FA_AUTOTUNE");
  EXPECT_TRUE(autotune::enabled());
}

// ---- LSE merge ----------------------------------------------------------------------------

TEST(LseMerge, MatchesTheSoftmaxOfTheUnion) {
  // Scores of one row: A = {1, 2}, B = {0.5, 3, -1}; values v_j = j.
  const double a[] = {1, 2}, b[] = {0.5, 3, -1};
  double za = 0, zb = 0, oa = 0, ob = 0;
  for (int j = 0; j < 2; ++j) za += std::exp(a[j]), oa += std::exp(a[j]) * j;
  for (int j = 0; j < 3; ++j) zb += std::exp(b[j]), ob += std::exp(b[j]) * (2 + j);
  const LseMergeWeights w = merge_lse(float(std::log(za)), float(std::log(zb)));
  EXPECT_NEAR(w.lse, std::log(za + zb), 1e-6);
  EXPECT_NEAR(merge_output(float(oa / za), float(ob / zb), w), (oa + ob) / (za + zb), 1e-6);
  EXPECT_NEAR(w.w_a + w.w_b, 1.0, 1e-7);
}

TEST(LseMerge, EmptyPartsHaveZeroWeight) {
  const float ninf = -std::numeric_limits<float>::infinity();
  LseMergeWeights w = merge_lse(ninf, 2.5f);
  EXPECT_EQ(w.w_a, 0.0f);
  EXPECT_EQ(w.w_b, 1.0f);
  EXPECT_EQ(w.lse, 2.5f);
  w = merge_lse(ninf, ninf);  // neither part saw a key: O = 0, LSE = -inf, no NaN
  EXPECT_EQ(w.lse, ninf);
  EXPECT_EQ(merge_output(0.0f, 0.0f, w), 0.0f);
}

TEST(LseMerge, HugeLseDoesNotOverflow) {
  const LseMergeWeights w = merge_lse(1000.0f, 999.0f);
  EXPECT_TRUE(std::isfinite(w.lse));
  EXPECT_NEAR(w.lse, 1000.0 + std::log1p(std::exp(-1.0)), 1e-3);
}

}  // namespace
}  // namespace fa
