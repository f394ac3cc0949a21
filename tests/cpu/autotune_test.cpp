// The tuner's host logic on the CPU: the key (library/autotune.h), the cache file, the slicing
// rule and the heuristic of library/tuner.h, a tuner with stand-in launchers; and the LSE merge
// (device/lse_merge.h).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device/lse_merge.h"
#include "library/autotune.h"
#include "library/tuner.h"

namespace fa {
namespace {

autotune::Key sample_key() {
  autotune::Key k;
  k.seqlen_q = 4096;
  k.seqlen_kv = 4096;
  k.head_dim = 64;
  k.batch = 2;
  k.heads_q = 16;
  k.heads_kv = 4;
  k.causal = "top_left";
  k.gpu = "NVIDIA H200";
  k.build_id = "0123456789abcdef";
  return k;
}

// Sizes and contiguous (B, H, N, D) strides, no tensors: all the key and the tuner's rules read.
AttentionParams shape(int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nkv, int64_t d) {
  AttentionParams p;
  p.batch = b;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = nq;
  p.seqlen_kv = nkv;
  p.head_dim = d;
  set_bhnd_strides(p);
  return p;
}

// A fresh folder of its own under the system's temporary directory, removed afterwards: a test
// never reads or writes the user's cache, and a second run starts from nothing again.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fa_autotune_test_XXXXXX").string();
    if (::mkdtemp(pattern.data())) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  bool ok() const { return !path_.empty(); }

 private:
  std::string path_;
};

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
  EXPECT_TRUE(changed([](autotune::Key& k) { k.batch = 1; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.heads_q = 32; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.heads_kv = 16; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.causal = "none"; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.dtype = "fp16"; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.layout = "bnhd"; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.lse = true; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.split = "auto"; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.split = "4"; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.gpu = "NVIDIA A100-SXM4-80GB"; }));
  EXPECT_TRUE(changed([](autotune::Key& k) { k.build_id = "fedcba9876543210"; }));  // seed bug #10
  EXPECT_EQ(base.find('\t'), std::string::npos);
}

// A growing KV cache (decode) keys by N_kv's bucket: one tuning per power of two, not per call.
TEST(AutotuneKey, KvBucketsKeyGrowingCachesByPowersOfTwo) {
  autotune::Key k = sample_key();
  k.seqlen_kv = 2049;
  const autotune::Key a = autotune::kv_bucketed(k);
  k.seqlen_kv = 4096;
  const autotune::Key b = autotune::kv_bucketed(k);
  EXPECT_EQ(a.seqlen_kv, 4096);
  EXPECT_EQ(a.str(), b.str());
  EXPECT_NE(a.str().find(" nkv<=4096 "), std::string::npos) << a.str();
  k.seqlen_kv = 4097;
  EXPECT_NE(autotune::kv_bucketed(k).str(), b.str());
  k.seqlen_kv = 4096;
  EXPECT_NE(k.str(), b.str());  // an exact key is never a bucket's
  k.seqlen_kv = 1;
  EXPECT_EQ(autotune::kv_bucketed(k).seqlen_kv, 1);
}

TEST(AutotuneKey, ReadsAsOneLine) {
  EXPECT_EQ(sample_key().str(),
            "nq=4096 nkv=4096 d=64 b=2 hq=16 hkv=4 causal=top_left dtype=bf16 layout=bhnd lse=0 gpu=NVIDIA H200 "
            "build=0123456789abcdef");
  autotune::Key k = sample_key();
  k.gpu = "a\tb\nc";  // tabs separate the cache file's fields, newlines its lines
  EXPECT_EQ(k.str().find_first_of("\t\n"), std::string::npos);
}

TEST(AutotuneKey, ShapeKeyReadsTheParams) {
  AttentionParams p = shape(2, 16, 4, 100, 300, 128);
  p.causal = true;
  p.causal_align = CausalAlign::bottom_right;
  autotune::Key k = autotune::shape_key(p);
  EXPECT_EQ(k.batch, 2);
  EXPECT_EQ(k.heads_q, 16);
  EXPECT_EQ(k.heads_kv, 4);
  EXPECT_EQ(k.seqlen_q, 100);
  EXPECT_EQ(k.seqlen_kv, 300);
  EXPECT_EQ(k.head_dim, 128);
  EXPECT_EQ(k.causal, "bottom_right");
  EXPECT_EQ(k.dtype, "bf16");
  EXPECT_EQ(k.layout, "bhnd");
  EXPECT_FALSE(k.lse);
  EXPECT_TRUE(k.gpu.empty());
  EXPECT_TRUE(k.build_id.empty());
  p.causal_align = CausalAlign::top_left;
  EXPECT_EQ(autotune::shape_key(p).causal, "top_left");
  p.causal = false;
  EXPECT_EQ(autotune::shape_key(p).causal, "none");
  // Split-KV: none without a split, auto when the step may choose (0 with a workspace), else S.
  EXPECT_EQ(autotune::shape_key(p).split, "none");
  int scratch = 0;
  p.workspace = &scratch;
  EXPECT_EQ(autotune::shape_key(p).split, "auto");
  p.num_splits = 1;
  EXPECT_EQ(autotune::shape_key(p).split, "none");
  p.num_splits = 8;
  EXPECT_EQ(autotune::shape_key(p).split, "8");
  EXPECT_NE(autotune::shape_key(p).str().find(" split=8"), std::string::npos);
}

TEST(AutotuneKey, LayoutClassOfTheStrides) {
  AttentionParams p = shape(2, 8, 2, 100, 300, 64);
  EXPECT_STREQ(autotune::layout_class(p), "bhnd");
  p.q_stride = p.o_stride = bnhd_strides(8, 100, 64);
  p.k_stride = p.v_stride = bnhd_strides(2, 300, 64);
  EXPECT_STREQ(autotune::layout_class(p), "bnhd");
  p.o_stride = bhnd_strides(8, 100, 64);  // the tensors disagree
  EXPECT_STREQ(autotune::layout_class(p), "strided");
  p = shape(2, 8, 2, 100, 300, 64);
  p.k_stride.seq = 72;  // padded rows
  EXPECT_STREQ(autotune::layout_class(p), "strided");
}

// Two problems that differ only in H_kv, the layout class, LSE or the build get different keys:
// a result tuned for one never chooses for the other.
TEST(AutotuneKey, TunerKeySeparatesHeadsLayoutLseAndBuild) {
  const tuner::Tuner a(98, "build-a", {}), b(98, "build-b", {});
  const AttentionParams base = shape(2, 16, 16, 4096, 4096, 128);
  const std::string key = a.key(base);
  EXPECT_NE(key.find(" hkv=16 "), std::string::npos) << key;
  EXPECT_NE(key.find(" layout=bhnd "), std::string::npos) << key;
  EXPECT_NE(key.find(" lse=0 "), std::string::npos) << key;
  EXPECT_NE(key.find(" build=build-a"), std::string::npos) << key;

  AttentionParams gqa = shape(2, 16, 4, 4096, 4096, 128);
  EXPECT_NE(a.key(gqa), key);
  AttentionParams bnhd = base;
  bnhd.q_stride = bnhd.o_stride = bnhd.k_stride = bnhd.v_stride = bnhd_strides(16, 4096, 128);
  EXPECT_NE(a.key(bnhd), key);
  AttentionParams with_lse = base;
  float lse_stand_in = 0;
  with_lse.lse = &lse_stand_in;  // never dereferenced
  EXPECT_NE(a.key(with_lse), key);
  EXPECT_NE(b.key(base), key);
  EXPECT_EQ(a.key(base), key);
}

TEST(AutotuneKey, HashIsStableAndSensitive) {
  EXPECT_EQ(autotune::hash_hex("abc"), autotune::hash_hex("abc"));
  EXPECT_NE(autotune::hash_hex("attention.cu -O3 sm_90"), autotune::hash_hex("attention.cu -O3 sm_80"));
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
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("nested/dir/autotune.txt");  // folders are created
  {
    autotune::Cache c(path);
    EXPECT_FALSE(c.find(sample_key()));
    c.put(sample_key(), "first", 2.0);
    c.put(sample_key(), "second", 1.0);
  }
  ASSERT_TRUE(std::filesystem::exists(path));
  autotune::Cache again(path);  // a new process, in effect
  ASSERT_TRUE(again.find(sample_key()));
  EXPECT_EQ(*again.find(sample_key()), "second");
  autotune::Key other = sample_key();
  other.heads_kv = 16;
  EXPECT_FALSE(again.find(other));
}

TEST(AutotuneCache, ResultOfAnotherBuildIsNotReused) {
  // Seed bug #10: timings of an old build of the kernels must not choose for the new build.
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("stale.txt");
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
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("garbage.txt");
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

// ---- the slicing rule ------------------------------------------------------------------------

TEST(TuningSlice, SmallProblemIsTimedWhole) {
  const AttentionParams p = shape(2, 16, 16, 4096, 4096, 64);
  ASSERT_LE(tuner::tuning_flops(p), tuner::kTuneBudgetFlops);
  const AttentionParams s = tuner::tuning_slice(p);
  EXPECT_EQ(s.batch, 2);
  EXPECT_EQ(s.heads_q, 16);
  EXPECT_EQ(s.heads_kv, 16);
}

TEST(TuningSlice, FlopsAreTheTwoMatmuls) {
  EXPECT_DOUBLE_EQ(tuner::tuning_flops(shape(2, 16, 4, 1000, 3000, 128)), 4.0 * 2 * 16 * 1000 * 3000 * 128);
}

TEST(TuningSlice, FewerBatchEntriesFirst) {
  const AttentionParams p = shape(32, 16, 16, 8192, 8192, 128);  // 1.8e13 FLOPs
  const AttentionParams s = tuner::tuning_slice(p);
  EXPECT_EQ(s.batch, 9);  // 9 · 5.5e11 fits in 5e12, 10 does not
  EXPECT_EQ(s.heads_q, 16);
  EXPECT_EQ(s.heads_kv, 16);
  EXPECT_LE(tuner::tuning_flops(s), tuner::kTuneBudgetFlops);
  // The slice is a view of the caller's tensors: same pointers, same strides.
  EXPECT_EQ(s.q, p.q);
  EXPECT_EQ(s.q_stride.batch, p.q_stride.batch);
  EXPECT_EQ(s.k_stride.head, p.k_stride.head);
  EXPECT_EQ(s.o_stride.seq, p.o_stride.seq);
  EXPECT_EQ(s.seqlen_q, p.seqlen_q);
  EXPECT_EQ(s.seqlen_kv, p.seqlen_kv);
}

TEST(TuningSlice, LongSequenceGetsFewerHeads) {
  const AttentionParams p = shape(1, 16, 16, 32768, 32768, 128);  // 8.8e12 FLOPs
  const AttentionParams s = tuner::tuning_slice(p);
  EXPECT_EQ(s.batch, 1);
  EXPECT_EQ(s.heads_q, 9);
  EXPECT_EQ(s.heads_kv, 9);
  EXPECT_LE(tuner::tuning_flops(s), tuner::kTuneBudgetFlops);
}

TEST(TuningSlice, GqaGroupsStayWhole) {
  const AttentionParams p = shape(4, 32, 8, 32768, 32768, 128);  // groups of 4 query heads
  const AttentionParams s = tuner::tuning_slice(p);
  EXPECT_EQ(s.batch, 1);
  EXPECT_EQ(s.heads_kv, 2);  // a group is 2.2e12 FLOPs: two fit
  EXPECT_EQ(s.heads_q, 8);
  EXPECT_EQ(s.heads_q / s.heads_kv, p.heads_q / p.heads_kv);
  EXPECT_LE(tuner::tuning_flops(s), tuner::kTuneBudgetFlops);
}

TEST(TuningSlice, OneHeadOverTheBudgetIsTimedAlone) {
  // 131072 tokens: one head alone is 8.8e12 FLOPs, past the budget; the tuner times that one head
  // (about 18 ms a run at 500 TFLOP/s) rather than the whole 1.4e14.
  const AttentionParams p = shape(1, 16, 16, 131072, 131072, 128);
  const AttentionParams s = tuner::tuning_slice(p);
  EXPECT_EQ(s.batch, 1);
  EXPECT_EQ(s.heads_q, 1);
  EXPECT_EQ(s.heads_kv, 1);
  EXPECT_LE(tuner::tuning_flops(s), tuner::tuning_flops(p) / 16);
  // The same problem at a budget one head fits: within the budget.
  const AttentionParams within = tuner::tuning_slice(p, 2e13);
  EXPECT_EQ(within.heads_q, 2);
  EXPECT_LE(tuner::tuning_flops(within), 2e13);
}

TEST(TuningSlice, OneKvGroupOverTheBudgetKeepsItsQueryHeads) {
  const AttentionParams p = shape(2, 16, 1, 32768, 32768, 128);  // multi-query attention
  const AttentionParams s = tuner::tuning_slice(p);
  EXPECT_EQ(s.batch, 1);
  EXPECT_EQ(s.heads_kv, 1);
  EXPECT_EQ(s.heads_q, 16);
}

// ---- the heuristic ---------------------------------------------------------------------------

tuner::KernelConfig config(int d, int block_m, int block_n, int stages, int smem) {
  tuner::KernelConfig c;
  c.head_dim = d;
  c.block_m = block_m;
  c.block_n = block_n;
  c.num_warps = block_m / 16;
  c.stages = stages;
  c.smem_bytes = smem;
  return c;
}

const std::vector<tuner::KernelConfig> kHeuristicConfigs = {
    config(64, 64, 64, 3, 56 << 10),
    config(128, 32, 64, 2, 300 << 10),  // most blocks of all, but fits no GPU of today
    config(128, 128, 64, 2, 96 << 10),  // the preferred one at D = 128
    config(128, 64, 64, 2, 64 << 10),
};
constexpr int kSms = 132, kSmem = 227 << 10;

TEST(Heuristic, FirstFittingConfigWhenTheGridFillsTheGpu) {
  // 32 Q tiles of 128 rows × 32 (batch, head) pairs = 1024 blocks >= 2 · 132.
  const tuner::KernelConfig* c =
      tuner::pick_heuristic(kHeuristicConfigs, shape(2, 16, 16, 4096, 4096, 128), kSms, kSmem);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c, &kHeuristicConfigs[2]) << c->name();
  c = tuner::pick_heuristic(kHeuristicConfigs, shape(2, 16, 16, 4096, 4096, 64), kSms, kSmem);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c, &kHeuristicConfigs[0]) << c->name();
}

TEST(Heuristic, MostBlocksWhenNoConfigFillsTheGpu) {
  // 8 × 2 = 16 blocks of 128 rows, 16 × 2 = 32 of 64 rows: both below 264; the smaller tile
  // spreads over more SMs. The 32-row config would have more still, but does not fit.
  const tuner::KernelConfig* c = tuner::pick_heuristic(kHeuristicConfigs, shape(1, 2, 2, 1024, 1024, 128), kSms, kSmem);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c, &kHeuristicConfigs[3]) << c->name();
  // Decoding (N_q = 1): one block per (batch, head) for every config: the first of equals.
  c = tuner::pick_heuristic(kHeuristicConfigs, shape(1, 16, 16, 1, 4096, 128), kSms, kSmem);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c, &kHeuristicConfigs[2]) << c->name();
}

TEST(Heuristic, ConfigThatDoesNotFitIsSkipped) {
  // With room for it, the 32-row config gives the most blocks on a small problem.
  const tuner::KernelConfig* roomy =
      tuner::pick_heuristic(kHeuristicConfigs, shape(1, 2, 2, 1024, 1024, 128), kSms, 400 << 10);
  ASSERT_NE(roomy, nullptr);
  EXPECT_EQ(roomy, &kHeuristicConfigs[1]) << roomy->name();
  // 80 KiB per block (a smaller GPU): only the 64 KiB config fits, even on a large problem.
  const tuner::KernelConfig* small =
      tuner::pick_heuristic(kHeuristicConfigs, shape(2, 16, 16, 4096, 4096, 128), kSms, 80 << 10);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small, &kHeuristicConfigs[3]) << small->name();
}

TEST(Heuristic, NothingWhenNothingFits) {
  EXPECT_EQ(tuner::pick_heuristic(kHeuristicConfigs, shape(1, 2, 2, 64, 64, 128), kSms, 0), nullptr);
  EXPECT_EQ(tuner::pick_heuristic(kHeuristicConfigs, shape(1, 2, 2, 64, 64, 96), kSms, kSmem), nullptr);
  EXPECT_EQ(tuner::pick_heuristic({}, shape(1, 2, 2, 64, 64, 64), kSms, kSmem), nullptr);
}

TEST(KernelConfig, NameListsTilesWarpsAndStages) {
  EXPECT_EQ(config(128, 128, 64, 2, 0).name(), "BLOCK_M=128 BLOCK_N=64 warps=8 stages=2");
  EXPECT_EQ(config(64, 64, 32, 0, 0).name(), "BLOCK_M=64 BLOCK_N=32 warps=4");  // no pipeline
  tuner::KernelConfig with_variant = config(128, 128, 128, 3, 0);
  with_variant.variant = "O=registers";  // step 16's register store beside its tile store
  EXPECT_EQ(with_variant.name(), "BLOCK_M=128 BLOCK_N=128 warps=8 stages=3 O=registers");
}

// ---- a tuner with stand-in launchers (no kernel runs) -------------------------------------------

int g_launches_a = 0, g_launches_b = 0;
Status launch_a(const AttentionParams&, cudaStream_t) {
  ++g_launches_a;
  return Status::Ok();
}
Status launch_b(const AttentionParams&, cudaStream_t) {
  ++g_launches_b;
  return Status::Ok();
}
Status launch_never(const AttentionParams&, cudaStream_t) {
  ADD_FAILURE() << "a config that does not fit was launched";
  return Status::Ok();
}

// Shared memory 0 fits every device (and none); INT_MAX fits none.
std::vector<tuner::KernelConfig> stand_in_configs() {
  std::vector<tuner::KernelConfig> list = {config(128, 128, 64, 2, 0), config(128, 64, 64, 2, 0),
                                           config(128, 16, 64, 2, INT_MAX), config(64, 64, 64, 3, 0)};
  list[0].launch = &launch_a;
  list[1].launch = &launch_b;
  list[2].launch = &launch_never;
  list[3].launch = &launch_b;
  return list;
}

TEST(Tuner, RegistersUntilDestroyed) {
  EXPECT_EQ(tuner::find_tuner(97), nullptr);
  {
    const tuner::Tuner t(97, "some-build", stand_in_configs());
    EXPECT_EQ(tuner::find_tuner(97), &t);
    EXPECT_EQ(t.step(), 97);
    EXPECT_EQ(t.build_id(), "some-build");
    EXPECT_EQ(t.config_names(128), (std::vector<std::string>{"BLOCK_M=128 BLOCK_N=64 warps=8 stages=2",
                                                             "BLOCK_M=64 BLOCK_N=64 warps=4 stages=2",
                                                             "BLOCK_M=16 BLOCK_N=64 warps=1 stages=2"}));
    EXPECT_EQ(t.config_names(64), (std::vector<std::string>{"BLOCK_M=64 BLOCK_N=64 warps=4 stages=3"}));
    EXPECT_TRUE(t.config_names(96).empty());
  }
  EXPECT_EQ(tuner::find_tuner(97), nullptr);
}

// Two configurations one name cannot tell apart (tiles alike, epilogue not) would share a cache
// entry and run_config would reach only the first: the tuner refuses to run at all.
TEST(Tuner, TwoConfigsWithOneNameAreRefused) {
  std::vector<tuner::KernelConfig> list = stand_in_configs();
  list.push_back(list[0]);  // the same tiles, another epilogue, no variant to say so
  {
    const tuner::Tuner t(97, "some-build", list);
    const Status st = t.run_config(shape(1, 2, 2, 64, 64, 128), "BLOCK_M=64 BLOCK_N=64 warps=4 stages=2", nullptr);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("two configurations named 'BLOCK_M=128 BLOCK_N=64 warps=8 stages=2'"),
              std::string::npos)
        << st.message();
    EXPECT_FALSE(t.run(shape(1, 2, 2, 64, 64, 128), nullptr).ok());
  }
  list.back().variant = "O=smem";
  const tuner::Tuner t(97, "some-build", list);
  const int before = g_launches_b;
  EXPECT_TRUE(t.run_config(shape(1, 2, 2, 64, 64, 128), "BLOCK_M=64 BLOCK_N=64 warps=4 stages=2", nullptr).ok());
  EXPECT_EQ(g_launches_b, before + 1);
}

TEST(Tuner, RunConfigRefusesUnknownAndOversizedConfigs) {
  const tuner::Tuner t(97, "some-build", stand_in_configs());
  const AttentionParams p = shape(1, 2, 2, 64, 64, 128);
  Status unknown = t.run_config(p, "BLOCK_M=7", nullptr);
  EXPECT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.message(), "step 97 has no config 'BLOCK_M=7' for head dim 128");
  // Compiled for D = 64 only: unknown at D = 128.
  EXPECT_FALSE(t.run_config(p, "BLOCK_M=64 BLOCK_N=64 warps=4 stages=3", nullptr).ok());
  Status too_big = t.run_config(p, "BLOCK_M=16 BLOCK_N=64 warps=1 stages=2", nullptr);
  EXPECT_FALSE(too_big.ok());
  EXPECT_NE(too_big.message().find("needs more shared memory"), std::string::npos) << too_big.message();
  const int before = g_launches_b;
  Status fits = t.run_config(p, "BLOCK_M=64 BLOCK_N=64 warps=4 stages=2", nullptr);
  EXPECT_TRUE(fits.ok()) << fits.message();
  EXPECT_EQ(g_launches_b, before + 1);
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

TEST(Tuner, DisabledRunsTheHeuristicWithoutTiming) {
  EnvGuard guard({"FA_AUTOTUNE"});
  ::setenv("FA_AUTOTUNE", "0", 1);
  const tuner::Tuner t(97, "some-build", stand_in_configs());
  // One block per config on any GPU: the first of equals, the preferred 128-row config.
  const AttentionParams p = shape(1, 1, 1, 64, 64, 128);
  const tuner::KernelConfig* h = t.heuristic(p);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->name(), "BLOCK_M=128 BLOCK_N=64 warps=8 stages=2");
  EXPECT_EQ(t.describe(p), "BLOCK_M=128 BLOCK_N=64 warps=8 stages=2 (heuristic, FA_AUTOTUNE=0)");
  const int before = g_launches_a;
  Status st = t.run(p, nullptr);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(g_launches_a, before + 1);
  // A head dim the step is not compiled for: an error, nothing launched.
  AttentionParams d96 = shape(1, 1, 1, 64, 64, 96);
  Status none = t.run(d96, nullptr);
  EXPECT_FALSE(none.ok());
  EXPECT_NE(none.message().find("head dim 96"), std::string::npos) << none.message();
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
