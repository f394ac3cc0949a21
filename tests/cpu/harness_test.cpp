// Host-side logic: the comparison rule, the FLOP counter, the mask helpers, the validation every
// step runs first, the CLI parser and the counter-based random generator.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "harness/cli.h"
#include "harness/compare.h"
#include "harness/flops.h"
#include "harness/gpu.h"
#include "device/mask.h"
#include "harness/problem.h"
#include "harness/random.h"
#include "harness/timer.h"
#include "fa/registry.h"

namespace fa {
namespace {

constexpr int64_t kTestMaxBatchHeads = int64_t(65535) * 65535;  // the tensor-core steps' limit

TEST(Compare, PassesWithinToleranceAndReportsWorstIndex) {
  std::vector<double> ref{1.0, 2.0, -3.0, 0.5};
  std::vector<float> out{1.001f, 2.0f, -3.02f, 0.5f};
  CompareResult r = compare(out, ref, Tolerance{});
  EXPECT_TRUE(r.ok) << r.summary();
  EXPECT_EQ(r.worst_index, 2);
  EXPECT_NEAR(r.max_abs_err, 0.02, 1e-6);
}

TEST(Compare, FailsOnElementOutsideAtolPlusRtol) {
  std::vector<double> ref{1.0, 2.0};
  std::vector<float> out{1.0f, 2.05f};  // 0.05 > 0.01 + 0.01·2
  CompareResult r = compare(out, ref, Tolerance{1e-2, 1e-2, 1.0});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_violation, 1);
}

TEST(Compare, FailsOnRelativeNorm) {
  std::vector<double> ref(100, 1.0);
  std::vector<float> out(100, 1.015f);  // every element inside atol+rtol, the norm is not
  CompareResult r = compare(out, ref, Tolerance{1e-2, 1e-2, 1e-2});
  EXPECT_EQ(r.violations, 0);
  EXPECT_FALSE(r.ok);
}

TEST(Compare, FailsOnAnyNaNOrInf) {
  std::vector<double> ref{1, 2, 3};
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    std::vector<float> out{1, bad, 3};
    CompareResult r = compare(out, ref, Tolerance{});
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.first_nonfinite, 1);
  }
}

TEST(Compare, MinusInfReferenceDemandsMinusInf) {
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> ref{ninf, 1.0};
  EXPECT_TRUE(compare(std::vector<float>{-INFINITY, 1.0f}, ref, Tolerance{}).ok);
  EXPECT_FALSE(compare(std::vector<float>{0.0f, 1.0f}, ref, Tolerance{}).ok);
  EXPECT_FALSE(compare(std::vector<float>{std::nanf(""), 1.0f}, ref, Tolerance{}).ok);
}

TEST(Flops, FullAndCausalCounts) {
  AttentionParams p;
  p.batch = 2;
  p.heads_q = 3;
  p.seqlen_q = p.seqlen_kv = 4;
  p.head_dim = 64;
  EXPECT_DOUBLE_EQ(attention_flops(p), 4.0 * 2 * 3 * 64 * 16);
  p.causal = true;  // 1 + 2 + 3 + 4 = 10 visible pairs
  EXPECT_DOUBLE_EQ(attention_flops(p), 4.0 * 2 * 3 * 64 * 10);
  p.seqlen_q = 2;  // top-left, N_kv = 4: rows see 1 and 2 keys
  EXPECT_DOUBLE_EQ(visible_pairs(2, 4, true, 0), 3.0);
  EXPECT_DOUBLE_EQ(visible_pairs(2, 4, true, 2), 3.0 + 4.0);       // bottom-right: 3 and 4
  EXPECT_DOUBLE_EQ(visible_pairs(4, 2, true, -2), 0 + 0 + 1 + 2);  // fully masked first rows
}

TEST(Mask, VisibleKeysAndDirection) {
  EXPECT_TRUE(causal_visible(5, 5, 0));   // the diagonal is visible
  EXPECT_FALSE(causal_visible(5, 6, 0));  // the future is not
  EXPECT_EQ(visible_keys(0, 10, true, 0), 1);
  EXPECT_EQ(visible_keys(3, 10, false, 0), 10);
  EXPECT_EQ(visible_keys(0, 10, true, -3), 0);
  EXPECT_EQ(visible_keys(20, 10, true, 0), 10);
  EXPECT_EQ(kv_head_of(5, 8, 2), 1);
  EXPECT_EQ(cdiv(1013, 64), 16);
}

// Sizes and strides with the harness's stand-in pointers (distinct, aligned, never dereferenced).
AttentionParams valid_params() {
  ProblemShape s;
  s.batch = 1;
  s.heads_q = s.heads_kv = 2;
  s.seqlen_q = s.seqlen_kv = 17;
  s.head_dim = 64;
  return validation_params(s);
}

TEST(Validate, AcceptsValidAndRefusesEachBadInputWithAMessage) {
  Capabilities caps;
  EXPECT_TRUE(validate(valid_params(), caps).ok());
  struct Case {
    const char* what;
    void (*spoil)(AttentionParams&);
    const char* expect;
  } cases[] = {
      {"D=96", [](AttentionParams& p) { p.head_dim = 96; }, "head dim 96"},
      {"N=0", [](AttentionParams& p) { p.seqlen_kv = 0; }, ">= 1"},
      {"null", [](AttentionParams& p) { p.v = nullptr; }, "non-null"},
      {"groups", [](AttentionParams& p) { p.heads_kv = 3; }, "multiple of H_kv"},
      {"causal", [](AttentionParams& p) { p.causal = true; }, "causal"},
      {"lse", [](AttentionParams& p) { p.lse = reinterpret_cast<float*>(16); }, "LSE"},
      {"align", [](AttentionParams& p) { p.q = static_cast<const char*>(p.q) + 2; }, "aligned"},
      {"stride", [](AttentionParams& p) { p.o_stride.dim = 3; }, "unit stride"},
      // 2^32 + 64 truncates to 64 in 32 bits; the check is in 64.
      {"D past int", [](AttentionParams& p) { p.head_dim = (int64_t(1) << 32) + 64; }, "head dim"},
      {"o is q", [](AttentionParams& p) { p.o = const_cast<void*>(p.q); }, "o overlaps"},
      {"o in k", [](AttentionParams& p) { p.o = static_cast<char*>(const_cast<void*>(p.k)) + 64; }, "o overlaps"},
      {"o zero head stride", [](AttentionParams& p) { p.o_stride.head = 0; }, "zero head"},
      {"o negative stride", [](AttentionParams& p) { p.o_stride.seq = -64; }, ">= 0"},
  };
  for (const Case& c : cases) {
    AttentionParams p = valid_params();
    c.spoil(p);
    Status st = validate(p, caps);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << c.what << ": " << st.message();
  }
}

TEST(Validate, LseMustBeAlignedAndSeparate) {
  Capabilities caps;
  caps.lse = true;
  AttentionParams p = valid_params();
  p.lse = reinterpret_cast<float*>(uintptr_t(5) << 44);  // past the stand-ins of validation_params
  EXPECT_TRUE(validate(p, caps).ok()) << validate(p, caps).message();
  p.lse = reinterpret_cast<float*>((uintptr_t(5) << 44) + 2);
  EXPECT_NE(validate(p, caps).message().find("4-byte aligned"), std::string::npos);
  p.lse = static_cast<float*>(p.o);
  EXPECT_NE(validate(p, caps).message().find("lse overlaps"), std::string::npos);
}

TEST(Validate, BroadcastInputsAndSizeOneDimsAreAccepted) {
  Capabilities caps;
  AttentionParams p = valid_params();
  p.batch = 2;
  set_bhnd_strides(p);
  p.k_stride.batch = p.v_stride.batch = 0;  // one K/V for both batch entries
  EXPECT_TRUE(validate(p, caps).ok()) << validate(p, caps).message();
  p = valid_params();
  p.batch = 1;
  p.q_stride.batch = p.k_stride.batch = p.v_stride.batch = p.o_stride.batch = -5;  // never used
  EXPECT_TRUE(validate(p, caps).ok()) << validate(p, caps).message();
  p = valid_params();
  p.batch = 2;
  set_bhnd_strides(p);
  p.o_stride.batch = 0;  // the output may not broadcast
  EXPECT_NE(validate(p, caps).message().find("zero batch stride"), std::string::npos);
}

// check_device: a step for every GPU is always fine; a step pinned to one compute capability
// (the Hopper steps: 90) is refused on any other, and without a GPU, with a message naming it.
// Runs with or without a GPU: the expectation follows the machine.
TEST(CheckDevice, PinnedStepsRunOnlyOnTheirGpu) {
  Capabilities caps;
  EXPECT_TRUE(check_device(caps).ok());
  caps.only_sm = 90;
  const Status st = check_device(caps);
  if (!gpu_available()) {
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("compute capability 9.0 and no CUDA device is usable"), std::string::npos)
        << st.message();
    return;
  }
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  EXPECT_EQ(st.ok(), major == 9 && minor == 0) << st.message();
  if (!st.ok()) {
    EXPECT_NE(st.message().find("built for compute capability 9.0 only"), std::string::npos) << st.message();
  }
}

// A step whose inputs come through TMA tensor maps (12 on) says so in its capabilities, and
// validate refuses a broadcast input for it, naming the tensor and the axis; size-1 dimensions
// stay free, as for every step.
TEST(Validate, BroadcastInputsAreRefusedWhereTheStepTakesNone) {
  Capabilities caps;
  caps.broadcast = false;
  AttentionParams p = valid_params();
  p.batch = 2;
  set_bhnd_strides(p);
  EXPECT_TRUE(validate(p, caps).ok()) << validate(p, caps).message();
  p.v_stride.batch = 0;
  EXPECT_NE(validate(p, caps).message().find("v has a zero batch stride (a broadcast)"), std::string::npos)
      << validate(p, caps).message();
  p = valid_params();
  p.batch = 1;
  p.k_stride.batch = 0;  // never stepped along
  EXPECT_TRUE(validate(p, caps).ok()) << validate(p, caps).message();
}

// The launch limits are capabilities, so validate (and through it fa_validate) refuses exactly
// what a step's launcher cannot run; a refusal is Unsupported, not a runtime error.
TEST(Validate, LaunchLimitsAreCapabilities) {
  Capabilities caps;
  caps.max_seqlen = 100;
  caps.max_batch_heads = 3;
  AttentionParams p = valid_params();
  EXPECT_TRUE(validate(p, caps).ok());
  p.seqlen_kv = 101;
  Status st = validate(p, caps);
  EXPECT_TRUE(st.unsupported());
  EXPECT_NE(st.message().find("at most 100"), std::string::npos) << st.message();
  p = valid_params();
  p.batch = 2;  // B·H_q = 4
  set_bhnd_strides(p);
  EXPECT_NE(validate(p, caps).message().find("B·H_q must be at most 3"), std::string::npos);
  EXPECT_FALSE(Status::Error("cudaMalloc failed").unsupported());
}

TEST(Validate, TensorSizeLimit) {
  Capabilities caps;
  caps.max_tensor_elements = int64_t(1) << 31;
  AttentionParams p = valid_params();
  p.batch = 1 << 20;  // 2^20 · 2 · 17 · 64 elements > 2^31
  EXPECT_FALSE(validate(p, caps).ok());
}

// An output whose elements would share an address is refused, whatever stride makes it so: rows
// closer than D apart, heads closer than N rows apart, batch entries closer than H·N·D apart. A
// layout whose axes nest (any permutation of a dense or padded tensor) is accepted.
TEST(Validate, OutputWhoseElementsOverlapIsRefused) {
  Capabilities caps;
  struct Case {
    const char* what;
    void (*spoil)(AttentionParams&);
    const char* expect;
  } cases[] = {
      {"rows 8 apart at D=64", [](AttentionParams& p) { p.o_stride.seq = 8; }, "o's sequence stride (8)"},
      {"heads 16 rows apart, N=17", [](AttentionParams& p) { p.o_stride.head = 16 * 64; }, "o's head stride (1024)"},
      {"batch entries 8 apart",
       [](AttentionParams& p) {
         p.batch = 2;
         p.o_stride.batch = 8;
       },
       "o's batch stride (8)"},
      {"heads and rows on one stride",
       [](AttentionParams& p) {
         p.o_stride.head = 64;
         p.o_stride.seq = 64;
       },
       "within the span"},
  };
  for (const Case& c : cases) {
    AttentionParams p = valid_params();
    set_bhnd_strides(p);
    c.spoil(p);
    Status st = validate(p, caps);
    EXPECT_TRUE(st.unsupported()) << c.what;
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << c.what << ": " << st.message();
  }
  AttentionParams p = valid_params();
  p.batch = 2;
  p.o_stride = bnhd_strides(p.heads_q, p.seqlen_q, p.head_dim);  // (B, N, H, D) storage
  EXPECT_TRUE(validate(p, caps).ok()) << validate(p, caps).message();
  p.o_stride.seq = 3 * 64 * 2;  // padded rows: a gap between positions
  p.o_stride.batch = p.o_stride.seq * 17;
  EXPECT_TRUE(validate(p, caps).ok()) << validate(p, caps).message();
}

// Sizes multiply in 128 bits: B = H_q = 2^32 makes B·H_q wrap to 0 in int64, which once passed a
// B·H_q limit. Any tensor past 2^60 elements is refused before a stride or limit is looked at.
TEST(Validate, SizesWhoseProductsWrapAreRefused) {
  Capabilities caps;
  caps.max_batch_heads = kTestMaxBatchHeads;
  AttentionParams p = valid_params();
  p.batch = p.heads_q = p.heads_kv = int64_t(1) << 32;
  p.q_stride = p.k_stride = p.v_stride = p.o_stride = Strides{64, 64, 64, 1};
  Status st = validate(p, caps);
  EXPECT_TRUE(st.unsupported());
  EXPECT_NE(st.message().find("elements (B·H·N·D); at most 2^60"), std::string::npos) << st.message();
  // Just inside the size rule, B·H_q is still judged in 128 bits by the limit.
  p = valid_params();
  p.batch = int64_t(1) << 17;
  p.heads_q = p.heads_kv = int64_t(1) << 16;  // B·H_q = 2^33; each tensor 2^40 bytes
  p.seqlen_q = p.seqlen_kv = 1;
  p.q_stride = p.k_stride = p.v_stride = p.o_stride = bhnd_strides(p.heads_q, 1, p.head_dim);
  st = validate(p, caps);
  EXPECT_NE(st.message().find("B·H_q must be at most"), std::string::npos) << st.message();
}

// A tensor whose last byte would lie past 2^64 is refused: its sizes or strides cannot be right.
TEST(Validate, TensorsMustLieInsideTheAddressSpace) {
  Capabilities caps;
  AttentionParams p = valid_params();
  p.k = reinterpret_cast<const void*>(~uintptr_t(0) - 4095);  // 4 KiB below the top, K needs 4.25 KiB
  Status st = validate(p, caps);
  EXPECT_NE(st.message().find("k would run past the end of the address space"), std::string::npos) << st.message();
}

// A TMA step (caps.tma) addresses tiles with 32-bit coordinates and holds strides as 40-bit byte
// counts: B or H past 2^31 − 1 and a stride past 2^39 − 8 elements are refused, naming the tensor.
TEST(Validate, TmaStepsRefuseWhatATensorMapCannotHold) {
  Capabilities caps;
  caps.tma = true;
  AttentionParams p = valid_params();
  p.batch = int64_t(1) << 31;
  p.heads_q = p.heads_kv = 1;
  p.seqlen_q = p.seqlen_kv = 1;
  p.q_stride = p.k_stride = p.v_stride = p.o_stride = bhnd_strides(1, 1, 64);
  Status st = validate(p, caps);
  EXPECT_NE(st.message().find("q's batch size 2147483648 is past this step's TMA coordinates"), std::string::npos)
      << st.message();
  caps.tma = false;
  EXPECT_TRUE(validate(p, caps).ok()) << validate(p, caps).message();  // a grid step has no such limit

  caps.tma = true;
  p = valid_params();
  p.batch = 2;
  set_bhnd_strides(p);
  p.k_stride.batch = (int64_t(1) << 39) - 8;  // the largest a map holds
  EXPECT_TRUE(validate(p, caps).ok()) << validate(p, caps).message();
  p.k_stride.batch = int64_t(1) << 39;
  st = validate(p, caps);
  EXPECT_NE(st.message().find("k's batch stride 549755813888 is past what a TMA tensor map holds"), std::string::npos)
      << st.message();
}

// A persistent step numbers its work tiles in 32 bits; validate counts them with the smallest
// tile a config takes, so fa_validate refuses what the launcher would.
TEST(Validate, WorkTileLimitCountsTilesOfTheSmallestConfig) {
  Capabilities caps;
  caps.max_work_tiles = 10;
  caps.work_tile_rows = 4;
  AttentionParams p = valid_params();  // B·H_q = 2, N_q = 17: 5 tiles of 4 rows per head
  p.seqlen_q = 20;
  set_bhnd_strides(p);
  EXPECT_TRUE(validate(p, caps).ok()) << validate(p, caps).message();
  p.seqlen_q = 21;  // 6 tiles per head, 12 in all
  set_bhnd_strides(p);
  Status st = validate(p, caps);
  EXPECT_TRUE(st.unsupported());
  EXPECT_NE(st.message().find("at most 10 tiles of 4 query rows"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("got 12"), std::string::npos) << st.message();
}

// The GPU check is validate's last rule: a step pinned to a compute capability no GPU has is
// refused by validate itself, with or without a GPU, and only once the input has passed.
TEST(Validate, TheGpuCheckIsPartOfValidation) {
  Capabilities caps;
  caps.only_sm = 10;  // compute capability 1.0: no GPU this build runs on
  AttentionParams p = valid_params();
  Status st = validate(p, caps);
  EXPECT_TRUE(st.unsupported());
  EXPECT_NE(st.message().find("compute capability 1.0"), std::string::npos) << st.message();
  p.head_dim = 96;  // an input error is reported first: it holds on every machine
  EXPECT_NE(validate(p, caps).message().find("head dim 96"), std::string::npos);
}

TEST(Registry, UnknownStepIsAnError) {
  Status st = run_step(987, AttentionParams{}, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("unknown step 987"), std::string::npos);
}

TEST(Cli, ParsesAndRejects) {
  CliArgs a({"--step", "3", "--causal", "--d=128", "--steps", "0,1,7"}, {"causal"}, {"step", "d", "steps"});
  EXPECT_EQ(a.get_int("step", -1), 3);
  EXPECT_EQ(a.get_int("d", 64), 128);
  EXPECT_TRUE(a.flag("causal"));
  EXPECT_EQ(a.get_int_list("steps", {}), (std::vector<int64_t>{0, 1, 7}));
  EXPECT_THROW(CliArgs({"--bogus"}, {}, {}), std::invalid_argument);
  EXPECT_THROW(CliArgs({"--d"}, {}, {"d"}), std::invalid_argument);
  CliArgs b({"--d", "sixty"}, {}, {"d"});
  EXPECT_THROW(b.get_int("d", 0), std::invalid_argument);
}

TEST(Random, DeterministicNormalWithSensibleMoments) {
  EXPECT_EQ(normal_at(1, 42), normal_at(1, 42));
  EXPECT_NE(normal_at(1, 42), normal_at(2, 42));
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = normal_at(9, uint64_t(i));
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
}

TEST(Timer, FitToBudgetShrinksOnlySlowPoints) {
  const TimingOptions asked{5, 30, true};
  // A fast point keeps every run it asked for.
  TimingOptions fast = fit_to_budget(asked, 0.5, 2000.0);
  EXPECT_EQ(fast.iters, 30);
  EXPECT_EQ(fast.warmup, 5);
  // 100 ms per run: the 2 s budget pays for 20 runs and 5 warm-ups.
  TimingOptions mid = fit_to_budget(asked, 100.0, 2000.0);
  EXPECT_EQ(mid.iters, 20);
  EXPECT_EQ(mid.warmup, 5);
  // 650 ms per run: the floor of 5 timed runs and one warm-up.
  TimingOptions slow = fit_to_budget(asked, 650.0, 2000.0);
  EXPECT_EQ(slow.iters, 5);
  EXPECT_EQ(slow.warmup, 1);
  EXPECT_TRUE(slow.flush_l2);
  // The floor never exceeds what was asked; no warm-up asked, none added; no budget, no change.
  EXPECT_EQ(fit_to_budget(TimingOptions{0, 3, true}, 650.0, 2000.0).iters, 3);
  EXPECT_EQ(fit_to_budget(TimingOptions{0, 3, true}, 650.0, 2000.0).warmup, 0);
  EXPECT_EQ(fit_to_budget(asked, 650.0, 0.0).iters, 30);
  EXPECT_EQ(fit_to_budget(asked, 0.0, 2000.0).iters, 30);
}

}  // namespace
}  // namespace fa
