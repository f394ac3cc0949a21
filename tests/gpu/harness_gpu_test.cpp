// The fp32 GPU reference against the fp64 CPU reference on random shapes, and the device input
// generator against the host one.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "harness/gpu.h"
#include "harness/random.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

struct RefCase {
  int64_t b, hq, hkv, nq, nkv, d;
  bool causal;
  CausalAlign align;
  Layout layout;
};

class GpuReference : public ::testing::TestWithParam<RefCase> {};

TEST_P(GpuReference, MatchesCpuReference) {
  FA_REQUIRE_GPU();
  const RefCase c = GetParam();
  ProblemShape s;
  s.batch = c.b;
  s.heads_q = c.hq;
  s.heads_kv = c.hkv;
  s.seqlen_q = c.nq;
  s.seqlen_kv = c.nkv;
  s.head_dim = c.d;
  s.causal = c.causal;
  s.align = c.align;
  s.layout = c.layout;
  s.seed = uint64_t(c.nq * 7919 + c.nkv * 31 + c.d);
  AttentionProblem prob(s);
  ReferenceData cpu = compute_reference(prob, ReferenceKind::cpu);
  ReferenceData gpu = compute_reference(prob, ReferenceKind::gpu);
  std::vector<float> o(gpu.o.begin(), gpu.o.end()), lse(gpu.lse.begin(), gpu.lse.end());
  // fp32 against fp64: far tighter than the bf16 rule.
  CompareResult ro = compare(o, cpu.o, Tolerance{1e-5, 1e-4, 1e-5});
  CompareResult rl = compare(lse, cpu.lse, Tolerance{1e-5, 1e-5, 1e-6});
  EXPECT_TRUE(ro.ok) << to_string(s) << " O: " << ro.summary();
  EXPECT_TRUE(rl.ok) << to_string(s) << " LSE: " << rl.summary();
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuReference,
    ::testing::Values(RefCase{1, 1, 1, 1, 1, 64, false, CausalAlign::top_left, Layout::bhnd},
                      RefCase{2, 3, 3, 17, 33, 128, false, CausalAlign::top_left, Layout::bhnd},
                      RefCase{1, 4, 2, 130, 97, 64, true, CausalAlign::top_left, Layout::bnhd},
                      RefCase{2, 2, 1, 100, 40, 128, true, CausalAlign::bottom_right, Layout::bhnd},
                      RefCase{1, 2, 2, 257, 513, 64, true, CausalAlign::bottom_right, Layout::bnhd}),
    [](const ::testing::TestParamInfo<RefCase>& info) {
      const RefCase& c = info.param;
      std::ostringstream name;
      name << "B" << c.b << "_H" << c.hq << "_Hkv" << c.hkv << "_N" << c.nq << "x" << c.nkv << "_D" << c.d;
      if (c.causal) name << (c.align == CausalAlign::bottom_right ? "_causalBR" : "_causal");
      if (c.layout == Layout::bnhd) name << "_bnhd";
      return name.str();
    });

// The score modifications: the GPU reference applies them as the CPU reference does (softcap,
// ALiBi per head and per (batch, head), sinks, all together under a causal window, and rows that
// see no key but their sink).
TEST(GpuReferenceScoreMods, MatchesCpuReference) {
  FA_REQUIRE_GPU();
  struct Case {
    ProblemShape s;
    const char* what;
  };
  std::vector<Case> cases;
  auto add = [&](ProblemShape s, float cap, ProblemShape::Alibi alibi, bool sinks, const char* what) {
    s.softcap = cap;
    s.alibi = alibi;
    s.sinks = sinks;
    s.softmax_scale = 0.3f;  // a scale far from 1/sqrt(D): the cap must sit on the scaled score
    s.seed = 1000 + cases.size();
    cases.push_back({s, what});
  };
  add(make_shape(1, 2, 2, 130, 97, 64), 5.0f, ProblemShape::Alibi::none, false, "softcap");
  add(make_shape(2, 4, 2, 77, 150, 128, true, CausalAlign::bottom_right), 0.0f, ProblemShape::Alibi::per_head, false,
      "alibi per head");
  add(make_shape(3, 2, 1, 100, 40, 64, true, CausalAlign::top_left), 0.0f, ProblemShape::Alibi::per_batch_head, false,
      "alibi per (batch, head), N_q > N_kv");
  add(make_shape(1, 2, 2, 90, 30, 64, true, CausalAlign::bottom_right), 0.0f, ProblemShape::Alibi::none, true,
      "sinks, rows with no key");
  ProblemShape all = make_shape(2, 2, 2, 200, 260, 128, true, CausalAlign::bottom_right);
  all.window_left = 40;
  all.window_right = 0;
  add(all, 8.0f, ProblemShape::Alibi::per_batch_head, true, "everything under a causal window");
  for (const Case& c : cases) {
    AttentionProblem prob(c.s);
    ReferenceData cpu = compute_reference(prob, ReferenceKind::cpu);
    ReferenceData gpu = compute_reference(prob, ReferenceKind::gpu);
    std::vector<float> o(gpu.o.begin(), gpu.o.end()), lse(gpu.lse.begin(), gpu.lse.end());
    CompareResult ro = compare(o, cpu.o, Tolerance{1e-5, 1e-4, 1e-5});
    CompareResult rl = compare(lse, cpu.lse, Tolerance{1e-5, 1e-5, 1e-6});
    EXPECT_TRUE(ro.ok) << c.what << ": " << to_string(c.s) << " O: " << ro.summary();
    EXPECT_TRUE(rl.ok) << c.what << ": " << to_string(c.s) << " LSE: " << rl.summary();
  }
}

// fp16 inputs (the production forwards' other type): the GPU reference reads them as fp16, as the
// CPU reference's host copies do; bf16 bits read as fp16 (or the reverse) disagree on every element.
// Large logits, causal bottom-right with rows that see no key, GQA, (B, N, H, D) storage.
TEST(GpuReferenceFp16, MatchesCpuReference) {
  FA_REQUIRE_GPU();
  ProblemShape s = make_shape(2, 4, 2, 130, 97, 128, true, CausalAlign::bottom_right);
  s.layout = Layout::bnhd;
  s.input = InputKind::large_logits;
  s.dtype = DType::fp16;
  s.seed = 16;
  AttentionProblem prob(s);
  ReferenceData cpu = compute_reference(prob, ReferenceKind::cpu);
  ReferenceData gpu = compute_reference(prob, ReferenceKind::gpu);
  std::vector<float> o(gpu.o.begin(), gpu.o.end()), lse(gpu.lse.begin(), gpu.lse.end());
  // Ten times the bf16 cases' atol and rtol: at logits ~60 the fp32 reference's own error reaches
  // 7e-5 (measured on an H100); a type read as the other is wrong by O(1).
  CompareResult ro = compare(o, cpu.o, Tolerance{1e-4, 1e-3, 1e-5});
  CompareResult rl = compare(lse, cpu.lse, Tolerance{1e-5, 1e-5, 1e-6});
  EXPECT_TRUE(ro.ok) << to_string(s) << " O: " << ro.summary();
  EXPECT_TRUE(rl.ok) << to_string(s) << " LSE: " << rl.summary();
}

// The generator rounds to the problem's type: an fp16 problem holds fp16 values (11 significant
// bits, not bf16's 8), in both layouts.
TEST(Generator, Fp16ProblemsHoldFp16Values) {
  FA_REQUIRE_GPU();
  for (Layout layout : {Layout::bhnd, Layout::bnhd}) {
    ProblemShape s = make_shape(2, 3, 3, 5, 5, 64);
    s.seed = 11;
    s.layout = layout;
    s.dtype = DType::fp16;
    AttentionProblem prob(s);
    std::vector<float> q = prob.host_q();
    AttentionParams p = prob.params();
    EXPECT_EQ(p.dtype, DType::fp16);
    int wrong = 0, unlike_bf16 = 0;  // every element fp16's rounding; most of them unlike bf16's
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t n = 0; n < 5; ++n)
          for (int64_t d = 0; d < 64; ++d) {
            const float x = normal_at(11 * 4 + 1, uint64_t(((b * 3 + h) * 5 + n) * 64 + d));
            // The device's normal draw (fast sine and logarithm) is off from the host's by up to
            // ~1e-5 absolute (measured on an H100: -0.0053902 for the host's -0.0053813), more than
            // fp16's step near zero: an fp16 value, within 2e-5 and one step of the host's rounding.
            const float expect = __half2float(__float2half_rn(x));
            const float got = q[size_t(b * p.q_stride.batch + h * p.q_stride.head + n * p.q_stride.seq + d)];
            const float step = std::ldexp(1.0f, std::ilogb(expect) - 10);  // fp16's spacing at expect
            const bool bad = __half2float(__float2half_rn(got)) != got || std::fabs(got - expect) > 2e-5f + step;
            if (bad && wrong++ < 4)
              ADD_FAILURE() << "element " << d << ": " << got << " for " << expect << " (x " << x << ")";
            unlike_bf16 += expect != __bfloat162float(__float2bfloat16_rn(x));
          }
    EXPECT_EQ(wrong, 0);
    EXPECT_GT(unlike_bf16, 2 * 3 * 5 * 64 / 2);
    for (float y : prob.output_bhnd()) ASSERT_TRUE(std::isnan(y));  // fp16's 0xFFFF is a NaN too
  }
}

TEST(Generator, DeviceMatchesHostFormulaInBothLayouts) {
  FA_REQUIRE_GPU();
  for (Layout layout : {Layout::bhnd, Layout::bnhd}) {
    ProblemShape s;
    s.batch = 2;
    s.heads_q = s.heads_kv = 3;
    s.seqlen_q = s.seqlen_kv = 5;
    s.head_dim = 64;
    s.seed = 11;
    s.layout = layout;
    AttentionProblem prob(s);
    std::vector<float> q = prob.host_q();
    AttentionParams p = prob.params();
    // Element (b=1, h=2, n=3, d=7): logical index ((1·3+2)·5+3)·64+7, Q is tensor 1 of seed 11.
    const uint64_t logical = ((1 * 3 + 2) * 5 + 3) * 64 + 7;
    const float expect = __bfloat162float(__float2bfloat16_rn(normal_at(11 * 4 + 1, logical)));
    EXPECT_EQ(q[size_t(1 * p.q_stride.batch + 2 * p.q_stride.head + 3 * p.q_stride.seq + 7)], expect);
    // Outputs start poisoned.
    for (float x : prob.output_bhnd()) ASSERT_TRUE(std::isnan(x));
  }
}

// The poisoned memory around the tensors (harness/problem.h) and the check that watches it: each
// of these writes one element just outside a tensor and expects memory_intact() to say so.
TEST(PoisonedMemory, KvPaddingRowsAndRowGapsAreNaN) {
  FA_REQUIRE_GPU();
  for (Layout layout : {Layout::bhnd, Layout::bnhd}) {
    const ProblemShape s{.batch = 2,
                         .heads_q = 4,
                         .heads_kv = 2,
                         .seqlen_q = 5,
                         .seqlen_kv = 7,
                         .head_dim = 64,
                         .layout = layout,
                         .row_gap = 8};
    AttentionProblem prob(s);
    const AttentionParams p = prob.params();
    ASSERT_GE(p.k_stride.seq, (layout == Layout::bnhd ? s.heads_kv : 1) * s.head_dim + s.row_gap);
    std::vector<float> k = prob.host_k();
    // Every row past N_kv, of every (batch, head), is NaN; the gap after a valid row too.
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads_kv; ++h) {
        const int64_t head = b * p.k_stride.batch + h * p.k_stride.head;
        for (int64_t n = s.seqlen_kv; n < s.seqlen_kv + s.kv_pad_rows; ++n)
          ASSERT_TRUE(std::isnan(k[size_t(head + n * p.k_stride.seq)])) << "row " << n << " is not poisoned";
        ASSERT_FALSE(std::isnan(k[size_t(head)]));
      }
    ASSERT_TRUE(std::isnan(k[size_t((layout == Layout::bnhd ? s.heads_kv : 1) * s.head_dim)])) << "row gap";
    std::string why;
    EXPECT_TRUE(prob.memory_intact(&why)) << why;
  }
}

TEST(PoisonedMemory, WritesOutsideOAndLseAreCaught) {
  FA_REQUIRE_GPU();
  const ProblemShape s{
      .batch = 1, .heads_q = 2, .heads_kv = 2, .seqlen_q = 9, .seqlen_kv = 9, .head_dim = 64, .row_gap = 8};
  const __nv_bfloat16 one = __float2bfloat16(1.0f);
  // (where, element offset from O's first element)
  const std::pair<const char*, int64_t> o_cases[] = {{"before O", -1}, {"after O", 0}, {"in a row gap of O", 64}};
  for (const auto& [where, at] : o_cases) {
    AttentionProblem prob(s);
    const int64_t offset = std::string(where) == "after O" ? int64_t(prob.o.size()) : at;
    FA_CUDA_CHECK(cudaMemcpy(prob.o.get() + offset, &one, sizeof one, cudaMemcpyHostToDevice));
    std::string why;
    EXPECT_FALSE(prob.memory_intact(&why)) << "a write " << where << " went unnoticed";
    EXPECT_NE(why.find("O"), std::string::npos) << why;
  }
  for (int64_t at : {int64_t(-1), int64_t(s.heads_q * s.seqlen_q)}) {
    AttentionProblem prob(s);
    const float x = 1.0f;
    FA_CUDA_CHECK(cudaMemcpy(prob.lse_buf.get() + at, &x, sizeof x, cudaMemcpyHostToDevice));
    std::string why;
    EXPECT_FALSE(prob.memory_intact(&why)) << "a write at LSE[" << at << "] went unnoticed";
    EXPECT_NE(why.find("LSE"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace fa
