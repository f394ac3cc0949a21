// The production forwards' decode path (kernels/fwd_decode.cu), run through kernel 100 or 101 as
// a caller reaches it: calls of a few query rows per group with a workspace go to the GQA-packed
// split-KV kernel. Against the reference with O, the LSE, their guards and the workspace poisoned
// (tests/gpu/split_kv_check.h): every group size, every head dim the build has, both layouts, causal rows in
// both alignments, rows that see no key, the kernel's own split count; a split, lengths per sequence or pages asked of
// a call the decode kernel does not take are refused with nothing written; describe names the decode kernel for the
// calls it takes; the score modifications; sliding windows; fp16 where the build has it. Steps 29 and 30's ragged and
// paged cache tests run through both kernels too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "tests/gpu/split_kv_check.h"
#include "tests/gpu/varlen_check.h"

namespace fa {
namespace {

using testing::expect_split_matches;
using testing::split_shape;

// The head dims the decode kernel serves of those the step has (its tuner's: every one, Part VI's
// 32, 96, 192 and 256 too where the build compiles them; Decode.HeadDims).
std::vector<int64_t> decode_head_dims() {
  const tuner::Tuner* t = tuner::find_tuner(kernels::kProductionDecode);
  std::vector<int64_t> dims;
  if (t == nullptr) ADD_FAILURE() << "the decode kernel registers no tuner";
  for (int d : testing::the_step().caps.head_dims)
    if (t != nullptr && !t->config_names(d).empty()) dims.push_back(d);
  if (dims.empty()) ADD_FAILURE() << "the decode kernel has none of the step's head dims";
  return dims;
}

// shapes(d)'s calls on every configuration of the decode kernel's tuner (keys over warps, 32 rows a
// warp, ...) at every head dim, each unsplit (a workspace given, num_splits = 1) and in 4 splits.
template <typename Shapes>
void expect_every_decode_config_matches(Shapes&& shapes) {
  const tuner::Tuner* t = tuner::find_tuner(kernels::kProductionDecode);
  ASSERT_NE(t, nullptr);
  int runs = 0;
  for (int64_t d : decode_head_dims())
    for (const std::string& config : t->config_names(int(d)))
      for (int splits : {1, 4}) {
        for (const ProblemShape& s : shapes(d)) expect_split_matches(s, splits, 4, t, config);
        ++runs;
      }
  EXPECT_GT(runs, 0);
}

TEST(Decode, OneRowEveryGroupSize) {
  FA_REQUIRE_GPU();
  for (auto [h, hkv] : {std::pair{4, 4}, std::pair{6, 2}, std::pair{32, 8}, std::pair{32, 1}})
    for (int64_t d : {64, 128})
      for (int splits : {2, 5}) expect_split_matches(split_shape(2, h, hkv, 1, 1000, d), splits, splits);
}

// Every configuration of the decode kernel's tuner, not only its pick: one row of each group size
// (4 and 8 rows per group: the keys-over-warps configurations' case), split and not; speculative
// rows past one 16-row tile, causal; rows that see no key.
TEST(Decode, EveryConfigurationMatches) {
  FA_REQUIRE_GPU();
  const tuner::Tuner* t = tuner::find_tuner(kernels::kProductionDecode);
  ASSERT_NE(t, nullptr);
  int runs = 0;
  for (int64_t d : decode_head_dims())
    for (const std::string& config : t->config_names(int(d))) {
      for (int splits : {1, 3}) expect_split_matches(split_shape(2, 32, 8, 1, 1000, d), splits, splits, t, config);
      expect_split_matches(split_shape(2, 16, 2, 1, 700, d, true), 2, 2, t, config);
      expect_split_matches(split_shape(2, 16, 2, 5, 777, d, true), 4, 4, t, config);
      expect_split_matches(split_shape(1, 8, 2, 9, 5, d, true), 2, 2, t, config);
      ++runs;
    }
  EXPECT_GT(runs, 0);
}

TEST(Decode, SpeculativeRowsCausal) {
  FA_REQUIRE_GPU();
  // 5 rows of a group of 8 (40 packed rows), bottom-right; 16 rows of a group of 4 (64, the most
  // one tile takes), top-left.
  expect_split_matches(split_shape(2, 16, 2, 5, 777, 128, true), 4, 4);
  expect_split_matches(split_shape(1, 8, 2, 16, 900, 64, true, CausalAlign::top_left), 3, 3);
}

TEST(Decode, RowsThatSeeNoKeyAreZero) {
  FA_REQUIRE_GPU();
  expect_split_matches(split_shape(1, 8, 2, 9, 5, 128, true), 2, 2);  // bottom-right, N_q > N_kv
}

// The combine spreads a row's splits over 1 to 8 warps (combine_warps: two splits a lane group):
// every width at both head dims; empty ranges (64 splits of 1000 keys leave most of them empty),
// speculative causal rows, rows that see no key.
TEST(Decode, CombineEveryWarpsPerRow) {
  FA_REQUIRE_GPU();
  for (int64_t d : decode_head_dims()) {
    for (int splits : {3, 6, 12, 24, 32, 64}) expect_split_matches(split_shape(1, 32, 8, 1, 3000, d), splits, splits);
    expect_split_matches(split_shape(2, 16, 2, 1, 1000, d), 64, 64);
    expect_split_matches(split_shape(2, 16, 2, 5, 4000, d, true), 24, 24);
    expect_split_matches(split_shape(1, 8, 2, 9, 700, d, true), 32, 32);
    expect_split_matches(split_shape(1, 8, 2, 9, 5, d, true), 24, 24);  // bottom-right: 4 rows see no key
  }
}

// The score modifications in the decode kernel: softcap, ALiBi per head and per (batch, head) (each
// packed row with its own head's slope), sinks (each row's once: by the kernel without a split, by
// the combine with one), and all three; unsplit and split, GQA groups of 4 and 8, speculative causal
// rows, rows that see no key (LSE = the sink).
TEST(Decode, ScoreMods) {
  FA_REQUIRE_GPU();
  using Alibi = ProblemShape::Alibi;
  auto mods = [](ProblemShape s, float cap, Alibi alibi, bool sinks) {
    s.softcap = cap;
    s.alibi = alibi;
    s.sinks = sinks;
    return s;
  };
  // Unsplit, the decode kernel's own sink; in 4 splits, the combine's.
  expect_every_decode_config_matches([&](int64_t d) {
    return std::vector<ProblemShape>{mods(split_shape(2, 32, 8, 1, 1000, d), 30.0f, Alibi::none, false),
                                     mods(split_shape(2, 16, 2, 5, 777, d, true), 0.0f, Alibi::per_head, false),
                                     mods(split_shape(2, 16, 4, 1, 900, d), 0.0f, Alibi::per_batch_head, false),
                                     mods(split_shape(2, 32, 8, 1, 1000, d), 0.0f, Alibi::none, true),
                                     mods(split_shape(1, 8, 2, 9, 5, d, true), 20.0f, Alibi::per_head, true)};
  });
}

// A sliding window in the decode kernel (flash-attn's window_size; a model's local layers while it
// generates): a block reads only its share of the window's tiles (kv_tile_span), masked at both
// ends, split or not. Windows narrower than a tile and wider than a split's range, the diagonal key
// alone, both sides without the causal flag (either alignment), speculative rows, rows that see no
// key, and with the score modifications; every configuration of the decode kernel.
TEST(Decode, SlidingWindow) {
  FA_REQUIRE_GPU();
  auto window = [](ProblemShape s, int64_t left, int64_t right) {
    s.window_left = left, s.window_right = right;
    return s;
  };
  expect_every_decode_config_matches([&](int64_t d) {
    ProblemShape m = window(split_shape(2, 16, 4, 2, 1000, d, true), 300, 0);
    m.softcap = 20.0f, m.alibi = ProblemShape::Alibi::per_head, m.sinks = true;
    return std::vector<ProblemShape>{window(split_shape(2, 32, 8, 1, 1000, d, true), 100, 0),
                                     window(split_shape(1, 8, 2, 1, 3000, d, true), 1000, 0),
                                     window(split_shape(2, 32, 8, 1, 1000, d, true), 0, 0),
                                     window(split_shape(2, 16, 2, 5, 777, d, true), 31, 0),
                                     window(split_shape(2, 16, 4, 1, 900, d), 200, 50),
                                     window(split_shape(2, 16, 4, 3, 900, d, false, CausalAlign::top_left), 5, 300),
                                     window(split_shape(1, 8, 2, 9, 5, d, true), 2, 0),  // bottom-right, N_q > N_kv
                                     m};
  });
}

// A window on packed sequences longer than a decode: kernel 100's decode kernel reads every packed
// call and takes it; kernel 101's packed prefill instantiation has no window, and the call is
// refused by name with nothing written (the library's choice then runs it on kernel 100).
TEST(Decode, SlidingWindowOnLongPackedSequences) {
  FA_REQUIRE_GPU();
  testing::VarlenOptions window;
  window.window = {128, 0};
  if (testing::the_step().number == kernels::kProductionHopper) window.refusal = "a sliding window with packed";
  for (int64_t d : decode_head_dims())
    testing::expect_varlen_matches({300, 37, 520, 129}, {400, 37, 520, 641}, 4, 2, d, true, 0, 0, false, "", window);
}

TEST(Decode, BnhdLayout) {
  FA_REQUIRE_GPU();
  ProblemShape s = split_shape(3, 16, 4, 2, 2000, 128, true);
  s.layout = Layout::bnhd;
  expect_split_matches(s, 4, 4);
}

TEST(Decode, ChoosesItsSplitWithAWorkspace) {
  FA_REQUIRE_GPU();
  // 2 groups on a whole GPU: the kernel splits (the check asserts the workspace was written).
  const std::vector<unsigned char> ws = expect_split_matches(split_shape(1, 8, 2, 1, 8192, 128), 0, kMaxKvSplits);
  EXPECT_GT(testing::bytes_written(ws), 0u) << "num_splits = 0 with a workspace: the decode kernel did not split";
}

// Runs the kernel on `p` (prob's call with an option the decode kernel alone has) and expects a
// refusal naming `what`, with O as poisoned as before.
void expect_refused_untouched(AttentionProblem& prob, const AttentionParams& p, const std::string& what) {
  prob.poison_outputs();
  const std::vector<float> before = prob.output_bhnd();
  const Status st = testing::the_step().forward(p, nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  const std::vector<float> after = prob.output_bhnd();
  ASSERT_EQ(before.size(), after.size());
  EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * sizeof(float))) << "O was written";
}

TEST(Decode, SplitOfACallItDoesNotTakeIsRefusedWithNothingWritten) {
  FA_REQUIRE_GPU();
  AttentionProblem prob(split_shape(1, 4, 2, 300, 513, 64, true));  // 600 packed rows: the prefill kernel's
  AttentionParams p = prob.params();
  const size_t bytes = split_kv_workspace_bytes(p, 2);
  DeviceBuffer<unsigned char> ws(bytes);
  p.num_splits = 2, p.workspace = ws.get(), p.workspace_bytes = bytes;
  expect_refused_untouched(prob, p, "split-KV");
}

TEST(Decode, LengthsPerSequenceOfACallItDoesNotTakeAreRefused) {
  FA_REQUIRE_GPU();
  AttentionProblem prob(split_shape(2, 4, 2, 300, 513, 64, true));  // 600 packed rows
  AttentionParams p = prob.params();
  DeviceBuffer<int32_t> lengths(2);
  lengths.upload({100, 513});
  p.seqlens_kv = lengths.get();
  expect_refused_untouched(prob, p, "seqlens_kv");
}

TEST(Decode, PagesOfACallItDoesNotTakeAreRefused) {
  FA_REQUIRE_GPU();
  AttentionProblem prob(split_shape(2, 4, 2, 300, 512, 64, true));  // 600 packed rows
  AttentionParams p = prob.params();
  DeviceBuffer<int32_t> table(2 * 8);
  table.upload(std::vector<int32_t>(16, 0));
  p.block_table = table.get(), p.block_table_stride = 8, p.page_size = 64, p.num_pages = 1;
  p.k_stride = p.v_stride = Strides{64 * 2 * 64, 64, 2 * 64, 1};  // one page of (64, H_kv, D)
  expect_refused_untouched(prob, p, "block_table");
}

// fp16 (a build with FA_DTYPES=bf16;fp16): the decode kernel's fp16 instantiations, every
// configuration at every head dim, against the fp64 reference at fp16's tighter rule for O
// (harness/check.h's output_tolerance): one row a group unsplit and in 3 splits, speculative causal
// rows, rows that see no key, every score modification together, and a window masked at both ends
// of a split's range. Skipped, never passed, in a build without fp16.
TEST(Decode, Fp16) {
  FA_REQUIRE_GPU();
  FA_REQUIRE_FP16();
  auto fp16 = [](ProblemShape s) {
    s.dtype = DType::fp16;
    return s;
  };
  const tuner::Tuner* t = tuner::find_tuner(kernels::kProductionDecode);
  ASSERT_NE(t, nullptr);
  int runs = 0;
  for (int64_t d : decode_head_dims())
    for (const std::string& config : t->config_names(int(d))) {
      for (int splits : {1, 3})
        expect_split_matches(fp16(split_shape(2, 32, 8, 1, 1000, d)), splits, splits, t, config);
      expect_split_matches(fp16(split_shape(2, 16, 2, 5, 777, d, true)), 4, 4, t, config);
      expect_split_matches(fp16(split_shape(1, 8, 2, 9, 5, d, true)), 2, 2, t, config);
      ProblemShape mods = fp16(split_shape(1, 8, 2, 9, 700, d, true));
      mods.softcap = 20.0f, mods.alibi = ProblemShape::Alibi::per_head, mods.sinks = true;
      for (int splits : {1, 4}) expect_split_matches(mods, splits, splits, t, config);
      ProblemShape window = fp16(split_shape(2, 16, 2, 5, 3000, d, true));
      window.window_left = 700, window.window_right = 0;
      expect_split_matches(window, 3, 3, t, config);
      ++runs;
    }
  EXPECT_GT(runs, 0);
}

// The decode kernel has every head dim the step has (Part VI's 32, 96, 192 and 256 too, where the
// build compiles them; the other tests here run at each, 256 with O's columns over two warps): one
// query row a group in two splits and five causal rows in three, against the reference.
TEST(Decode, HeadDims) {
  FA_REQUIRE_GPU();
  const std::vector<int64_t> served = decode_head_dims();
  for (int d : testing::the_step().caps.head_dims) {
    const bool has = std::find(served.begin(), served.end(), int64_t(d)) != served.end();
    EXPECT_TRUE(has) << "head dim " << d;
    if (!has) continue;
    expect_split_matches(split_shape(2, 32, 8, 1, 1000, d), 2, 2);
    expect_split_matches(split_shape(2, 16, 2, 5, 777, d, true), 3, 3);
  }
}

// describe (fa_step_describe, the package's describe) names the kernel that runs the call: the
// decode kernel's configuration for a decode call with a workspace, the kernel's own for prefill.
TEST(Decode, DescribeNamesTheDecodeKernelForTheCallsItTakes) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  for (int64_t d : decode_head_dims()) {
    AttentionParams p = validation_params(split_shape(2, 32, 8, 1, 8192, d));
    p.workspace = p.o;  // a stand-in: describe reads the call's sizes and options, never the memory
    p.workspace_bytes = split_kv_workspace_bytes(p, kMaxKvSplits);
    EXPECT_NE(describe_config(step, p).find("decode kernel (102)"), std::string::npos) << describe_config(step, p);
    p = validation_params(split_shape(2, 32, 8, 512, 8192, d));
    EXPECT_EQ(describe_config(step, p).find("decode kernel"), std::string::npos) << describe_config(step, p);
  }
}

}  // namespace
}  // namespace fa
