#include "tests/gpu/step_suite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "harness/random.h"
#include "reference/cpu_reference.h"

namespace fa::testing {
namespace {

// A fresh seed per test, derived from its name: every case sees different data, every run of
// the same case the same data (so a failure reproduces).
uint64_t seed_for(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return mix64(h);
}

std::string shape_name(const ProblemShape& s) {
  std::ostringstream os;
  os << "B" << s.batch << "_H" << s.heads_q;
  if (s.heads_kv != s.heads_q) os << "_Hkv" << s.heads_kv;
  os << "_N" << s.seqlen_q;
  if (s.seqlen_kv != s.seqlen_q) os << "x" << s.seqlen_kv;
  os << "_D" << s.head_dim;
  if (s.causal) os << (s.align == CausalAlign::bottom_right ? "_causalBR" : "_causal");
  if (s.layout == Layout::bnhd) os << "_bnhd";
  if (s.window_left >= 0 || s.window_right >= 0)
    os << "_W" << (s.window_left < 0 ? std::string("inf") : std::to_string(s.window_left)) << "x"
       << (s.window_right < 0 ? std::string("inf") : std::to_string(s.window_right))
       << (s.align == CausalAlign::bottom_right ? "BR" : "TL");
  if (s.softcap != 0.0f) os << "_cap" << int(s.softcap);
  if (s.alibi != ProblemShape::Alibi::none) os << (s.alibi == ProblemShape::Alibi::per_head ? "_alibiH" : "_alibiBH");
  if (s.sinks) os << "_sinks";
  // scale 0.3 → "_scale0p30": no '-' (GoogleTest's filter reads it as "exclude what follows", so a
  // name holding one selects nothing and its ctest entry passed without running; main() refuses them)
  if (s.softmax_scale != 0.0f) {
    const long c = std::lround(s.softmax_scale * 100);
    os << "_scale" << c / 100 << "p" << (c % 100 < 10 ? "0" : "") << c % 100;
  }
  return os.str();
}

class FnTest : public ::testing::Test {
 public:
  explicit FnTest(std::function<void()> body) : body_(std::move(body)) {}
  void TestBody() override { body_(); }

 private:
  std::function<void()> body_;
};

void add_test(const std::string& suite, const std::string& name, std::function<void()> body) {
  ::testing::RegisterTest(suite.c_str(), name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                          [body]() -> ::testing::Test* { return new FnTest(body); });
}

// The head dims the suite asks of every step: the lessons' 64 and 128, and Part VI's others (a step
// is asked only those its capabilities list: kernel 100's forward has all six, kernel 101's four,
// where the build compiles them, FA_HEAD_DIMS).
constexpr int kSuiteHeadDims[] = {32, 64, 96, 128, 192, 256};

bool has_dtype(const StepInfo& st, DType t) {
  return std::find(st.caps.dtypes.begin(), st.caps.dtypes.end(), t) != st.caps.dtypes.end();
}

bool supports(const StepInfo& st, const ProblemShape& s) {
  const Capabilities& c = st.caps;
  bool dim_ok = false;
  for (int d : c.head_dims) dim_ok |= (d == s.head_dim);
  if (!has_dtype(st, s.dtype)) return false;
  const bool window = s.window_left >= 0 || s.window_right >= 0;
  const bool mods_ok =
      (s.softcap == 0.0f || c.softcap) && (s.alibi == ProblemShape::Alibi::none || c.alibi) && (!s.sinks || c.sinks);
  return dim_ok && (!s.causal || c.causal) && (s.heads_kv == s.heads_q || c.gqa) && (!window || c.sliding_window) &&
         mods_ok;
}

// Registers `shape` under suite/name for `st` if the step supports it.
void add_one(const StepInfo& st, const std::string& suite, ProblemShape shape, const std::string& tag) {
  if (!supports(st, shape)) return;
  if (st.caps.max_batch_heads > 0 && shape.batch * shape.heads_q > st.caps.max_batch_heads) return;
  std::string name = (tag.empty() ? "" : tag + "_") + shape_name(shape);
  shape.seed = seed_for(suite + "." + name);
  const StepInfo* step = &st;
  add_test(suite, name, [step, shape] { expect_matches_reference(*step, shape); });
}

// fp16 (the production forwards, where the build compiles it: FA_DTYPES=bf16;fp16): the same case in
// suite "Fp16", named after the bf16 suite it repeats (Fp16.Ragged_B1_H2_N1013x1531_D64), inputs
// generated in fp16 and O held to fp16's tighter rule (harness/compare.h). A step without fp16 in
// its Capabilities registers none.
void add_fp16_case(const StepInfo& st, const std::string& suite, ProblemShape shape, const std::string& tag = "") {
  shape.dtype = DType::fp16;
  add_one(st, "Fp16", shape, suite + (tag.empty() ? "" : "_" + tag));
}

// The suites whose every case runs in fp16 too: the shapes, ragged and cross-attention sizes, both
// causal alignments and the rows they leave without a key, large logits (inputs ~60 fit fp16; the
// logits ~100·√D are fp32 inside), structured inputs, layouts, GQA, long sequences (V ~16 with N_kv
// = 8192: the unnormalised O ~131072 is past fp16's 65504, fine in fp32 state), a custom scale. The
// window and score-modification kernels' fp16 instantiations get a few cases of their own below.
bool repeated_in_fp16(const std::string& suite) {
  for (const char* s : {"Shapes", "Ragged", "CausalAlign", "FullyMaskedRows", "LargeLogits", "Structured", "Layout",
                        "GQA", "LongSeq", "Scale"})
    if (suite == s) return true;
  return false;
}

void add_case(const StepInfo& st, const std::string& suite, ProblemShape shape, const std::string& tag = "") {
  add_one(st, suite, shape, tag);
  if (repeated_in_fp16(suite)) add_fp16_case(st, suite, shape, tag);
}

void register_for(const StepInfo& st) {
  // Shapes: 1, 17, not-a-multiple-of-any-tile (1013 vs 1024), tile multiples, B and H > 1 with
  // distinct data per head, both head dims, causal on and off.
  for (int d : kSuiteHeadDims) {
    for (bool causal : {false, true}) {
      add_case(st, "Shapes", make_shape(1, 1, 1, 1, 1, d, causal));
      add_case(st, "Shapes", make_shape(2, 3, 3, 17, 17, d, causal));
      add_case(st, "Shapes", make_shape(1, 2, 2, 64, 64, d, causal));
      add_case(st, "Shapes", make_shape(2, 2, 2, 1013, 1024, d, causal));
      add_case(st, "Shapes", make_shape(1, 2, 2, 1024, 1013, d, causal));
      add_case(st, "Shapes", make_shape(1, 4, 4, 4096, 4096, d, causal));
    }
    // Ragged cross-attention: N_q != N_kv with neither a tile multiple (stride confusion, #9).
    add_case(st, "Ragged", make_shape(1, 2, 2, 1013, 1531, d));
    add_case(st, "Ragged", make_shape(1, 2, 2, 1531, 1013, d));
    add_case(st, "Ragged", make_shape(3, 2, 2, 1, 777, d));
    add_case(st, "Ragged", make_shape(1, 1, 1, 333, 1, d));
    // Causal alignment when N_q != N_kv, both conventions; bottom-right with N_q > N_kv leaves
    // the first N_q - N_kv rows with no visible key (O = 0, LSE = -inf, never NaN).
    add_case(st, "CausalAlign", make_shape(1, 2, 2, 300, 1000, d, true, CausalAlign::top_left));
    add_case(st, "CausalAlign", make_shape(1, 2, 2, 300, 1000, d, true, CausalAlign::bottom_right));
    add_case(st, "CausalAlign", make_shape(1, 2, 2, 1000, 300, d, true, CausalAlign::top_left));
    add_case(st, "FullyMaskedRows", make_shape(1, 2, 2, 1000, 300, d, true, CausalAlign::bottom_right));
    add_case(st, "FullyMaskedRows", make_shape(2, 1, 1, 77, 5, d, true, CausalAlign::bottom_right));
    // Structured inputs.
    ProblemShape big = make_shape(1, 2, 2, 515, 700, d);
    big.input = InputKind::large_logits;  // logits with std ~100: exp overflows without the max
    add_case(st, "LargeLogits", big);
    big.causal = true;
    add_case(st, "LargeLogits", big);
    ProblemShape ident = make_shape(1, 2, 2, 200, 200, d);
    ident.input = InputKind::identity_qk;
    add_case(st, "Structured", ident, "IdentityQK");
    ProblemShape ramp = make_shape(2, 2, 2, 129, 257, d);
    ramp.input = InputKind::v_ramp;
    add_case(st, "Structured", ramp, "VRamp");
    // Layouts: (B, N, H, D) storage, and grouped-query / multi-query attention.
    ProblemShape bnhd = make_shape(2, 3, 3, 100, 130, d);
    bnhd.layout = Layout::bnhd;
    add_case(st, "Layout", bnhd);
    // Strided views: every row followed by a gap (a slice of a packed QKV tensor, say); O's gaps
    // must stay untouched.
    ProblemShape gapped = make_shape(2, 2, 1, 77, 150, d, true, CausalAlign::bottom_right);
    gapped.row_gap = 24;
    add_case(st, "Layout", gapped, "RowGap24");
    gapped.layout = Layout::bnhd;
    add_case(st, "Layout", gapped, "RowGap24");
    add_case(st, "GQA", make_shape(2, 4, 2, 97, 131, d));
    add_case(st, "GQA", make_shape(1, 8, 1, 64, 200, d, true));
    // Long sequences: where low-precision softmax state drifts (seed bug #1).
    add_case(st, "LongSeq", make_shape(1, 2, 2, 8192, 8192, d));
    add_case(st, "LongSeq", make_shape(1, 2, 2, 8192, 8192, d, true));
    // Every key weighs 1 and V ~ 16: the unnormalised O reaches ~16·N_kv = 131072, which fp32
    // state holds and fp16 state (largest value 65504) turns into inf.
    ProblemShape flat = make_shape(1, 2, 2, 256, 8192, d);
    flat.input = InputKind::flat_large_v;
    add_case(st, "LongSeq", flat, "FlatLargeV");
    // More (batch, head) pairs than a grid's y dimension holds (65535), with GQA and ragged
    // causal tiles: the launch must spread them (over z, or x) or the step must refuse.
    add_case(st, "Grid", make_shape(2, 32800, 8200, 40, 70, d, true, CausalAlign::bottom_right), "BatchHeadsPast65535");
  }
  // Sliding windows (flash-attn's window_size; the steps that take one): masked tiles at both ends
  // of a Q tile's range, windows narrower and wider than a tile, one side unbounded, with and
  // without causal, both alignments, N_q != N_kv, GQA, and windows that leave whole rows, and whole
  // Q tiles, with no key (O = 0, LSE = -inf). The references apply the same rule (device/mask.h's
  // key_visible), the kernels WindowFlag (kernels/mask.h).
  for (int d : kSuiteHeadDims) {
    auto window = [&](ProblemShape s, int64_t left, int64_t right) {
      s.window_left = left;
      s.window_right = right;
      add_case(st, "Window", s);
    };
    window(make_shape(1, 2, 2, 1013, 1024, d), 100, 50);
    window(make_shape(1, 2, 2, 1013, 1024, d, true), 256, -1);
    window(make_shape(2, 2, 1, 777, 1531, d, false, CausalAlign::bottom_right), 300, 0);
    window(make_shape(1, 4, 2, 1531, 777, d, true, CausalAlign::bottom_right), 31, 7);
    window(make_shape(1, 2, 2, 2048, 2048, d), -1, 64);
    window(make_shape(1, 2, 2, 1024, 1024, d), 0, 0);
    window(make_shape(1, 2, 2, 500, 300, d, false, CausalAlign::top_left), 10, 10);  // rows past 310 see nothing
    window(make_shape(1, 1, 1, 4096, 4096, d, true, CausalAlign::bottom_right), 1000, -1);
    // fp16: a window masked at both ends of a range, GQA with both alignments.
    ProblemShape w16 = make_shape(1, 4, 2, 1531, 777, d, true, CausalAlign::bottom_right);
    w16.window_left = 31;
    w16.window_right = 7;
    add_fp16_case(st, "Window", w16);
    w16 = make_shape(1, 2, 2, 1013, 1024, d);
    w16.window_left = 100;
    w16.window_right = 50;
    add_fp16_case(st, "Window", w16);
  }

  // Score modifications (softcap, ALiBi, sinks; the steps that take them): each alone and all
  // together, against the references' formulas (include/fa/params.h). A cap that saturates (logits
  // of std ~100 under a cap of 30) and one in tanh's bend under a scale far from 1/sqrt(D) (0.3: a
  // cap applied after the scale instead of before it is wrong there); ALiBi per head and per
  // (batch, head), aligned bottom-right whatever the causal alignment, N_q != N_kv both ways; sinks
  // with rows that see no key (O = 0, LSE = the sink), and at N = 4096 (the GPU reference; the cap
  // at N = 8192 too).
  using Alibi = ProblemShape::Alibi;
  for (int d : kSuiteHeadDims) {
    auto mods = [&](ProblemShape s, float cap, Alibi alibi, bool sinks, float scale = 0.0f) {
      s.softcap = cap;
      s.alibi = alibi;
      s.sinks = sinks;
      s.softmax_scale = scale;
      add_case(st, "ScoreMods", s);
    };
    ProblemShape hot = make_shape(1, 2, 2, 515, 700, d, true);
    hot.input = InputKind::large_logits;
    mods(hot, 30.0f, Alibi::none, false);
    mods(make_shape(1, 2, 2, 1013, 1024, d, true), 5.0f, Alibi::none, false, 0.3f);
    mods(make_shape(1, 1, 1, 8192, 8192, d, true, CausalAlign::bottom_right), 50.0f, Alibi::none, false);
    mods(make_shape(1, 4, 2, 300, 1000, d), 0.0f, Alibi::per_head, false);
    mods(make_shape(2, 2, 2, 1000, 300, d, true, CausalAlign::top_left), 0.0f, Alibi::per_batch_head, false);
    // ALiBi one-sided (every visible key at or before its diagonal: kernels/score_mod.h's kOneSided,
    // the row's part of the bias out of the loop): causal top-left with N_kv > N_q, a long causal
    // call with hot logits, and a window ending at the diagonal without the causal flag
    mods(make_shape(2, 2, 1, 700, 1500, d, true, CausalAlign::top_left), 0.0f, Alibi::per_batch_head, false);
    ProblemShape hot_alibi = make_shape(1, 2, 1, 8192, 8192, d, true, CausalAlign::bottom_right);
    hot_alibi.input = InputKind::large_logits;
    mods(hot_alibi, 0.0f, Alibi::per_head, false);
    ProblemShape band = make_shape(1, 2, 2, 900, 1300, d, false, CausalAlign::bottom_right);
    band.window_left = 200;
    band.window_right = 0;
    mods(band, 0.0f, Alibi::per_head, false);
    mods(make_shape(2, 2, 1, 1000, 300, d, true, CausalAlign::bottom_right), 0.0f, Alibi::none, true);
    mods(make_shape(1, 2, 2, 4096, 4096, d), 0.0f, Alibi::none, true);
    ProblemShape all = make_shape(2, 4, 2, 777, 1531, d, true, CausalAlign::bottom_right);
    all.window_left = 300;
    all.window_right = 0;
    mods(all, 20.0f, Alibi::per_batch_head, true, 0.2f);
    // fp16: a saturating cap on large logits, and every modification together.
    hot.softcap = 30.0f;
    add_fp16_case(st, "ScoreMods", hot);
    all.softcap = 20.0f;
    all.alibi = Alibi::per_batch_head;
    all.sinks = true;
    all.softmax_scale = 0.2f;
    add_fp16_case(st, "ScoreMods", all);
  }

  // A custom softmax scale is honoured.
  ProblemShape scaled = make_shape(1, 2, 2, 150, 150, 64);
  scaled.softmax_scale = 0.3f;
  add_case(st, "Scale", scaled, "Custom0p3");

  // Bad input: a clear error, and nothing written.
  const StepInfo* step = &st;
  auto bad = [step](const std::string& name, std::function<void(AttentionParams&)> spoil) {
    add_test("BadInput", name, [step, spoil] {
      FA_REQUIRE_GPU();
      ProblemShape s = make_shape(1, 2, 2, 64, 64, 64);
      s.with_lse = step->caps.lse;
      AttentionProblem prob(s);
      AttentionParams p = prob.params();
      spoil(p);
      Status st = step->forward(p, nullptr);
      FA_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_FALSE(st.ok()) << "bad input was accepted";
      EXPECT_FALSE(st.message().empty());
      size_t written = 0;
      for (float x : prob.output_bhnd()) written += !std::isnan(x);
      EXPECT_EQ(written, 0u) << "the step wrote to O despite refusing the input";
      size_t lse_written = 0;
      for (float x : prob.lse()) lse_written += !std::isnan(x);
      EXPECT_EQ(lse_written, 0u) << "the step wrote to LSE despite refusing the input";
      std::string why;
      EXPECT_TRUE(prob.memory_intact(&why)) << why;
      std::cout << "    refused with: " << st.message() << "\n";
    });
  };
  // A head dim the step has no kernel for: 96 where it has none (every lesson), and 80 (no step).
  if (std::find(st.caps.head_dims.begin(), st.caps.head_dims.end(), 96) == st.caps.head_dims.end())
    bad("HeadDim96", [](AttentionParams& p) { p.head_dim = 96; });
  bad("HeadDim80", [](AttentionParams& p) { p.head_dim = 80; });
  bad("ZeroSeqlen", [](AttentionParams& p) { p.seqlen_q = 0; });
  bad("NegativeBatch", [](AttentionParams& p) { p.batch = -1; });
  bad("NullQ", [](AttentionParams& p) { p.q = nullptr; });
  bad("NullO", [](AttentionParams& p) { p.o = nullptr; });
  bad("HeadsNotDivisible", [](AttentionParams& p) {
    p.heads_q = 3;
    p.heads_kv = 2;
  });
  bad("MisalignedPointer", [](AttentionParams& p) { p.k = static_cast<const char*>(p.k) + 2; });
  bad("NonUnitDimStride", [](AttentionParams& p) { p.v_stride.dim = 2; });
  if (!st.caps.causal) bad("CausalUnsupported", [](AttentionParams& p) { p.causal = true; });
  bad("WindowBelowMinusOne", [](AttentionParams& p) { p.window_left = -2; });
  if (!st.caps.sliding_window) bad("WindowUnsupported", [](AttentionParams& p) { p.window_left = 100; });
  bad("NegativeSoftcap", [](AttentionParams& p) { p.softcap = -1.0f; });
  bad("NanSoftcap", [](AttentionParams& p) { p.softcap = NAN; });
  if (!st.caps.softcap) bad("SoftcapUnsupported", [](AttentionParams& p) { p.softcap = 30.0f; });
  // (Any device pointer will do: a step refuses before it reads the array.)
  if (!st.caps.alibi)
    bad("AlibiUnsupported", [](AttentionParams& p) { p.alibi_slopes = static_cast<const float*>(p.k); });
  if (!st.caps.sinks) bad("SinksUnsupported", [](AttentionParams& p) { p.sinks = static_cast<const float*>(p.k); });
  if (st.caps.alibi)
    bad("AlibiStrideBelowHeads", [](AttentionParams& p) {
      p.alibi_slopes = static_cast<const float*>(p.k);
      p.alibi_slopes_stride_batch = 1;  // H_q = 2
    });
  // Element types: one the step is not built for (fp16 on every lesson, and on the production
  // forwards of a bf16-only build), and a value outside the enum.
  if (!has_dtype(st, DType::fp16)) bad("Fp16Unsupported", [](AttentionParams& p) { p.dtype = DType::fp16; });
  bad("DtypeOutsideTheEnum", [](AttentionParams& p) { p.dtype = static_cast<DType>(7); });
}

}  // namespace

void expect_64bit_offsets(const StepInfo& step) {
  FA_REQUIRE_GPU();
  // B·H·N·D = 257·256·256·128 = 257·2^23 = 2^31 + 2^23; batch 256 starts at element 2^31.
  ProblemShape s = make_shape(257, 256, 256, 256, 256, 128);
  s.seed = seed_for("Overflow");
  s.with_lse = step.caps.lse;
  const double elems = double(s.batch * s.heads_q * s.seqlen_q * s.head_dim);
  ASSERT_GT(elems, double(int64_t(1) << 31));
  if (step.caps.max_tensor_elements > 0 && elems > double(step.caps.max_tensor_elements)) {
    const AttentionParams p = validation_params(s);
    Status refused = step.forward(p, nullptr);
    EXPECT_FALSE(refused.ok()) << "a step with a tensor-size limit must refuse a larger tensor";
    return;
  }
  size_t free_bytes = 0, total = 0;
  FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  // Four bf16 tensors, plus step 00's N² score buffer, plus headroom.
  const double need = 4 * elems * 2 + double(s.batch * s.heads_q) * s.seqlen_q * s.seqlen_kv * 4 + (2ull << 30);
  if (double(free_bytes) < need)
    GTEST_SKIP() << "needs " << need / 1e9 << " GB of free GPU memory, " << free_bytes / 1e9 << " GB free";
  AttentionProblem prob(s);
  AttentionParams p = prob.params();
  if (!step.caps.lse) p.lse = nullptr;
  Status st = step.forward(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  std::string why;
  EXPECT_TRUE(prob.memory_intact(&why)) << why;
  // Check heads 0 and H-1 of the last batch against the fp64 CPU reference.
  const int64_t b = s.batch - 1;
  for (int64_t h : {int64_t(0), s.heads_q - 1}) {
    std::vector<float> q = prob.head_rows(prob.q, p.q_stride, b, h, s.seqlen_q);
    std::vector<float> k = prob.head_rows(prob.k, p.k_stride, b, h, s.seqlen_kv);
    std::vector<float> v = prob.head_rows(prob.v, p.v_stride, b, h, s.seqlen_kv);
    std::vector<float> o = prob.head_rows(prob.o, p.o_stride, b, h, s.seqlen_q);
    AttentionParams one = p;
    one.batch = one.heads_q = one.heads_kv = 1;
    set_bhnd_strides(one);
    ReferenceOutput ref = cpu_reference(one, q.data(), k.data(), v.data());
    CompareResult r = compare(o, ref.o, bf16_tolerance());
    EXPECT_TRUE(r.ok) << "batch " << b << " head " << h << " (element offset "
                      << b * p.o_stride.batch + h * p.o_stride.head << "): " << r.summary();
  }
}

void expect_64bit_row_offsets(const StepInfo& step) {
  FA_REQUIRE_GPU();
  // (B, N, H, D) with a row stride of 2^19 elements (a strided view): row 4096 starts at element
  // 2^31, so row × sequence stride overflows 32 bits while every tensor is small in elements.
  // 304 rows past that boundary, for Q/O and for K/V alike: a wrapped key offset must carry
  // enough weight in the late rows' softmax (up to 7 % of the keys) to fail the check, not only
  // a wrapped query row.
  ProblemShape s = make_shape(1, 2, 2, 4400, 4400, 64, step.caps.causal);
  s.layout = Layout::bnhd;
  s.row_gap = (int64_t(1) << 19) - s.heads_q * s.head_dim;
  s.kv_pad_rows = 0;  // the guards still follow the last row
  s.seed = seed_for("Overflow.RowStride");
  s.with_lse = step.caps.lse;
  const AttentionParams shape = shape_params(s);
  ASSERT_GT(double(s.seqlen_q - 1) * double(shape.q_stride.seq), double(int64_t(1) << 31));
  const double span = double(s.seqlen_q) * double(shape.q_stride.seq);
  if (step.caps.max_tensor_elements > 0 && span > double(step.caps.max_tensor_elements)) {
    Status refused = step.forward(validation_params(s), nullptr);
    EXPECT_FALSE(refused.ok()) << "a step with a tensor-size limit must refuse a larger tensor";
    return;
  }
  size_t free_bytes = 0, total = 0;
  FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  const double need = 4 * span * 2 + double(s.heads_q) * s.seqlen_q * s.seqlen_kv * 4 + (2ull << 30);
  if (double(free_bytes) < need)
    GTEST_SKIP() << "needs " << need / 1e9 << " GB of free GPU memory, " << free_bytes / 1e9 << " GB free";
  expect_matches_reference(step, s);
}

const StepInfo& the_step() {
  const auto& all = steps();
  if (all.size() != 1) throw std::runtime_error("expected exactly one registered step in this test executable");
  return all.front();
}

void expect_matches_reference(const StepInfo& step, const ProblemShape& shape) {
  FA_REQUIRE_GPU();
  ProblemShape s = shape;
  s.with_lse = step.caps.lse;
  AttentionProblem prob(s);
  ReferenceData ref = compute_reference(prob);
  CheckResult r = run_and_check(step, prob, ref);
  EXPECT_TRUE(r.ok()) << "step " << step.number << " on " << to_string(s) << "\n  " << r.summary();
}

void register_step_suite() {
  for (const StepInfo& st : steps()) register_for(st);
}

void register_large_suite() {
  // 64-bit offsets: Q, K, V and O each hold more than 2^31 elements. A step that claims no size
  // limit must get the last batch (which starts exactly at element 2^31) right; a step with a
  // limit must refuse the shape. Kept out of the regular suite: it needs ~20-40 GB of GPU memory,
  // so ctest runs it alone (RESOURCE_LOCK).
  for (const StepInfo& st : steps()) {
    const StepInfo* step = &st;
    add_test("Overflow", "Past2To31Elements", [step] { expect_64bit_offsets(*step); });
    add_test("Overflow", "RowStridePast2To31", [step] { expect_64bit_row_offsets(*step); });
  }
}

}  // namespace fa::testing
