// The backward against the fp64 reference (reference/cpu_reference_backward): fresh random
// inputs, the forward run by the step itself (its O and LSE are what the backward reads), a random
// dO, and dQ, dK, dV poisoned (NaN) with guard regions around them. Shapes: ragged N, N_q != N_kv,
// GQA (dK and dV summed over a group), causal in both alignments, bottom-right with N_q > N_kv
// (rows that see no key: zero gradients, no NaN), both head dims; sliding windows where the step
// takes them; fp16 where the step's backward has it (the production kernels built with fp16). And
// the backward's refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fa/registry.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "harness/problem.h"
#include "reference/cpu_reference.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

using bf16 = __nv_bfloat16;

// dO, dQ, dK and dV in the problem's element type: bf16 values, or fp16 bits (AttentionProblem's
// 16-bit storage).
struct Gradients {
  DType dtype = DType::bf16;
  GuardedBuffer<bf16> d_o, dq, dk, dv;
  GuardedBuffer<float> dsinks;  // H_q floats, with sinks
  DeviceBuffer<unsigned char> workspace;
  BackwardParams bp;
  std::vector<float> host_do;  // (B, H_q, N_q, D) contiguous, the stored values as floats
};

// dO random (in the problem's type), dQ, dK, dV contiguous (B, H, N, D) and poisoned, the workspace sized by the
// library's own function.
Gradients make_gradients(const AttentionProblem& prob, unsigned seed) {
  const AttentionParams p = prob.params();
  Gradients g;
  g.dtype = p.dtype;
  const size_t q_elems = size_t(p.batch * p.heads_q * p.seqlen_q * p.head_dim);
  const size_t kv_elems = size_t(p.batch * p.heads_kv * p.seqlen_kv * p.head_dim);
  g.d_o = GuardedBuffer<bf16>(q_elems);
  g.dq = GuardedBuffer<bf16>(q_elems);
  g.dk = GuardedBuffer<bf16>(kv_elems);
  g.dv = GuardedBuffer<bf16>(kv_elems);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<bf16> d_o(q_elems);
  g.host_do.resize(q_elems);
  for (size_t i = 0; i < q_elems; ++i) {
    d_o[i] = float_to_element(normal(rng), p.dtype);
    uint16_t bits;
    std::memcpy(&bits, &d_o[i], sizeof bits);
    g.host_do[i] = element_to_float(bits, p.dtype);
  }
  FA_CUDA_CHECK(cudaMemcpy(g.d_o.get(), d_o.data(), q_elems * sizeof(bf16), cudaMemcpyHostToDevice));
  g.workspace = DeviceBuffer<unsigned char>(backward_workspace_bytes(p));
  g.workspace.poison();
  g.bp = contiguous_backward_params(p, g.d_o.get(), g.dq.get(), g.dk.get(), g.dv.get(), g.workspace.get(),
                                    g.workspace.bytes());
  if (p.sinks) {
    g.dsinks = GuardedBuffer<float>(size_t(p.heads_q));
    g.bp.dsinks = g.dsinks.get();
  }
  return g;
}

std::vector<float> as_float(const Gradients& g, const GuardedBuffer<bf16>& t) {
  return to_float(t, g.dtype);
}

// A refused call: unsupported, its message naming `why`.
void expect_refused(const Status& st, const std::string& why) {
  EXPECT_TRUE(st.unsupported()) << why << ": " << st.message();
  EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
}

// Nothing written: dQ, dK and dV still hold make_gradients' NaN poison.
void expect_gradients_untouched(const Gradients& g) {
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  for (const GuardedBuffer<bf16>* t : {&g.dq, &g.dk, &g.dv})
    for (float x : as_float(g, *t)) ASSERT_TRUE(std::isnan(x)) << "a refused call wrote a gradient";
}

// ‖got − want‖ / ‖want‖, and no NaN or Inf anywhere.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, const char* name,
                  const std::string& where, double limit) {
  ASSERT_EQ(got.size(), want.size()) << name;
  double err2 = 0, ref2 = 0, worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << where << ": " << name << "[" << i << "] = " << got[i];
    const double e = double(got[i]) - want[i];
    err2 += e * e;
    ref2 += want[i] * want[i];
    if (std::abs(e) > worst) worst = std::abs(e), worst_at = i;
  }
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  EXPECT_LE(rel, limit) << where << ": " << name << " relative error " << rel << " (worst |err| " << worst
                        << " at element " << worst_at << ", reference " << want[worst_at] << ")";
  std::ostringstream text;
  text << rel;
  ::testing::Test::RecordProperty(where + " " + name + "_rel_err", text.str());
}

// The step's forward, then its backward, against the fp64 reference's gradients.
void check_backward_mode(const ProblemShape& shape, bool deterministic) {
  const std::string where = to_string(shape) + (deterministic ? " deterministic" : "");
  const StepInfo& step = testing::the_step();
  ASSERT_NE(step.backward, nullptr);
  AttentionProblem prob(shape);
  ASSERT_TRUE(step.forward(prob.params(), nullptr).ok()) << where;
  Gradients g = make_gradients(prob, unsigned(shape.seed) + 1000);
  g.bp.deterministic = deterministic;
  const Status st = step.backward(g.bp, nullptr);
  ASSERT_TRUE(st.ok()) << where << ": " << st.message();
  FA_CUDA_CHECK(cudaDeviceSynchronize());

  // The reference reads dO with O's strides: hand it the problem's sizes with contiguous O.
  AttentionParams ref_p = prob.params();
  ref_p.o_stride = bhnd_strides(ref_p.heads_q, ref_p.seqlen_q, ref_p.head_dim);
  const std::vector<float> q = prob.host_q(), k = prob.host_k(), v = prob.host_v();
  const ReferenceGradients ref =
      cpu_reference_backward(ref_p, q.data(), k.data(), v.data(), g.host_do.data(),
                             ReferenceScoreMods{prob.alibi_slopes_host.data(), prob.sinks_host.data()});
  // bf16 gradients of bf16 inputs: on an H200 every case measured 2.2e-3 to 2.9e-3 (the bf16
  // rounding of the stored gradients), so 1e-2 leaves 3.5× headroom. fp16 has 3 more bits of
  // mantissa, so its errors should be about 8× smaller (P, dS and the gradients rounded to fp16):
  // 2e-3 is below every bf16 case, so that fp16 data computed or rounded as bf16 anywhere fails.
  const double limit = g.dtype == DType::fp16 ? 2e-3 : 1e-2;
  expect_close(as_float(g, g.dq), ref.dq, "dq", where, limit);
  expect_close(as_float(g, g.dk), ref.dk, "dk", where, limit);
  expect_close(as_float(g, g.dv), ref.dv, "dv", where, limit);
  // The sinks' gradient: a sum over every row of its head of −P_sink·D_i, D_i = dO_i · O_i from the
  // bf16 O the forward stored (the reference's is exact); the limit is a guess until measured.
  if (shape.sinks) {
    ASSERT_EQ(ref.dsinks.size(), size_t(shape.heads_q));
    expect_close(g.dsinks.download(), ref.dsinks, "dsinks", where, 2e-2);
  }
  std::string why;
  for (const GuardedBuffer<bf16>* t : {&g.dq, &g.dk, &g.dv})
    EXPECT_TRUE(t->guards_intact(&why)) << where << ": " << why;
  if (shape.sinks) {
    EXPECT_TRUE(g.dsinks.guards_intact(&why)) << where << ": dsinks " << why;
  }
  EXPECT_TRUE(prob.memory_intact(&why)) << where << ": " << why;
}

// Every case in every mode the step has: the default, and the deterministic one where the step
// offers it (step 18 on, which runs these tests too).
void check_backward(const ProblemShape& shape) {
  check_backward_mode(shape, false);
  if (testing::the_step().caps.deterministic_backward) check_backward_mode(shape, true);
}

// make_shape's sizes and mask, with its own seed and the LSE the backward needs.
ProblemShape shape(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nkv, int64_t d, bool causal,
                   CausalAlign align, uint64_t seed) {
  ProblemShape s = make_shape(b, h, hkv, nq, nkv, d, causal, align);
  s.seed = seed;
  s.with_lse = true;
  return s;
}

TEST(Backward, SmallNonCausal) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128}) check_backward(shape(1, 2, 2, 64, 64, d, false, CausalAlign::top_left, 1));
}

TEST(Backward, RaggedGqaNonCausal) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128}) check_backward(shape(2, 4, 2, 77, 131, d, false, CausalAlign::top_left, 2));
}

TEST(Backward, CausalTopLeft) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128}) check_backward(shape(1, 4, 1, 150, 150, d, true, CausalAlign::top_left, 3));
}

TEST(Backward, CausalBottomRightMoreKeys) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128}) check_backward(shape(2, 2, 1, 50, 203, d, true, CausalAlign::bottom_right, 4));
}

// N_q > N_kv, bottom-right: the first N_q − N_kv rows see no key. Their dQ must be 0 (not NaN), and
// they add nothing to dK and dV.
TEST(Backward, FullyMaskedRowsGetZeroGradients) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128}) check_backward(shape(1, 2, 2, 200, 70, d, true, CausalAlign::bottom_right, 5));
}

TEST(Backward, LongerSequence) {
  FA_REQUIRE_GPU();
  check_backward(shape(1, 2, 1, 1000, 1000, 128, true, CausalAlign::top_left, 6));
}

// One Q tile against 128 KV tiles: every block of the (batch, head) adds into the same 16 rows of
// dQ at the same moment, which is where additions without atomics are lost.
TEST(Backward, ManyKeyTilesShareOneQueryTile) {
  FA_REQUIRE_GPU();
  check_backward(shape(1, 2, 2, 16, 8192, 64, false, CausalAlign::top_left, 9));
}

// A sliding window (flash-attn's window_size): a step whose forward takes one has a backward that
// takes it too (the production kernels: a Q tile range that ends before the last Q tile, turns that
// start at a Q tile's first KV tile); any other backward refuses it by name and writes nothing.
// Windows on both sides under GQA, a causal window in both alignments, and one that leaves whole
// rows with no key (rows past 310 of 500: zero gradients, no NaN).
TEST(Backward, SlidingWindow) {
  FA_REQUIRE_GPU();
  auto window = [](ProblemShape s, int64_t left, int64_t right) {
    s.window_left = left;
    s.window_right = right;
    return s;
  };
  const ProblemShape cases[] = {
      window(shape(1, 4, 2, 333, 517, 64, false, CausalAlign::top_left, 21), 100, 50),
      window(shape(1, 2, 2, 517, 333, 128, true, CausalAlign::bottom_right, 22), 31, 7),
      window(shape(2, 2, 1, 300, 300, 128, true, CausalAlign::top_left, 23), 70, -1),
      window(shape(1, 2, 2, 500, 300, 64, false, CausalAlign::top_left, 24), 10, 10),
  };
  const StepInfo& step = testing::the_step();
  if (step.caps.sliding_window) {
    for (const ProblemShape& s : cases) check_backward(s);
    return;
  }
  AttentionProblem prob(cases[0]);
  Gradients g = make_gradients(prob, 25);
  const Status st = step.backward(g.bp, nullptr);
  expect_refused(st, "sliding window");
  expect_gradients_untouched(g);
}

// Score modifications (softcap, ALiBi, sinks): a step whose forward and backward take them computes
// the gradients at the fp64 reference: the cap's derivative in dS (a cap in tanh's bend under a scale
// far from 1/sqrt(D), and a saturated one), ALiBi per (batch, head) with rows that see no key, sinks'
// own gradient (rows with only their sink), all three under a causal window; and a backward with
// sinks refuses a call without dsinks. Any other backward refuses them by name and writes nothing.
TEST(Backward, ScoreMods) {
  FA_REQUIRE_GPU();
  using Alibi = ProblemShape::Alibi;
  auto mods = [](ProblemShape s, float cap, Alibi alibi, bool sinks, float scale) {
    s.softcap = cap;
    s.alibi = alibi;
    s.sinks = sinks;
    s.softmax_scale = scale;
    return s;
  };
  ProblemShape hot = shape(1, 2, 2, 300, 300, 128, false, CausalAlign::top_left, 31);
  hot.input = InputKind::large_logits;
  ProblemShape all = shape(2, 4, 2, 400, 600, 128, true, CausalAlign::bottom_right, 35);
  all.window_left = 100;
  all.window_right = 0;
  const ProblemShape cases[] = {
      mods(shape(1, 4, 2, 333, 517, 64, true, CausalAlign::top_left, 30), 5.0f, Alibi::none, false, 0.3f),
      mods(hot, 30.0f, Alibi::none, false, 0.0f),
      mods(shape(2, 2, 2, 517, 333, 128, true, CausalAlign::bottom_right, 32), 0.0f, Alibi::per_batch_head, false,
           0.0f),
      mods(shape(2, 2, 1, 500, 300, 64, true, CausalAlign::bottom_right, 33), 0.0f, Alibi::none, true, 0.0f),
      // ALiBi's diagonal (N_kv − N_q) apart from the mask's (none, or top-left), with a cap: the
      // derivative read back from P adds the bias back.
      mods(shape(1, 4, 2, 300, 517, 64, false, CausalAlign::top_left, 34), 10.0f, Alibi::per_head, false, 0.0f),
      mods(shape(1, 2, 2, 517, 300, 128, true, CausalAlign::top_left, 39), 10.0f, Alibi::per_batch_head, false, 0.0f),
      mods(all, 20.0f, Alibi::per_head, true, 0.2f),
  };
  const StepInfo& step = testing::the_step();
  if (step.caps.softcap && step.caps.alibi && step.caps.sinks) {
    for (const ProblemShape& s : cases) check_backward(s);
    // Sinks without their gradient's buffer: refused, nothing written.
    AttentionProblem prob(cases[3]);  // the sinks case
    ASSERT_TRUE(step.forward(prob.params(), nullptr).ok());
    Gradients g = make_gradients(prob, 36);
    g.bp.dsinks = nullptr;
    const Status st = step.backward(g.bp, nullptr);
    expect_refused(st, "dsinks");
    expect_gradients_untouched(g);
    return;
  }
  // A step without them: its backward refuses each (the forward's call, with the modification added).
  AttentionProblem prob(shape(1, 2, 2, 64, 64, 64, false, CausalAlign::top_left, 37));
  Gradients g = make_gradients(prob, 38);
  BackwardParams capped = g.bp, alibi = g.bp, sinks = g.bp;
  capped.fwd.softcap = 30.0f;
  alibi.fwd.alibi_slopes = static_cast<const float*>(g.bp.fwd.k);  // any device pointer: never read
  sinks.fwd.sinks = static_cast<const float*>(g.bp.fwd.k);
  sinks.dsinks = reinterpret_cast<float*>(g.workspace.get());
  for (const auto& [call, name] :
       {std::pair{&capped, "softcap"}, std::pair{&alibi, "ALiBi"}, std::pair{&sinks, "sinks"}}) {
    const Status st = step.backward(*call, nullptr);
    expect_refused(st, name);
  }
  expect_gradients_untouched(g);
}

// Part VI's head dims, where the build compiles them (FA_HEAD_DIMS): kernel 100's backward has 32,
// 96, 192 and 256 (kernel 101's the Hopper backward's 32 and 96, the mma.sync one's 192 and 256), each
// against the fp64 reference: ragged GQA, causal bottom-right with rows that see no key, a longer
// causal call, a window and the cap. At 256 on a GPU before sm_90 the mma.sync backward refuses by
// name and writes nothing (its registers spill there). Skipped, never passed, for a step without
// such a head dim.
TEST(Backward, HeadDimsBeyondTheLessons) {
  FA_REQUIRE_GPU();
  const bool on_sm90 = testing::runs_sm90();
  int runs = 0;
  for (int d : testing::backward_head_dims(testing::the_step())) {
    if (d != 32 && d != 96 && d != 192 && d != 256) continue;
    ++runs;
    if (d == 256 && !on_sm90) {
      AttentionProblem prob(shape(1, 2, 1, 100, 130, d, true, CausalAlign::bottom_right, 11));
      ASSERT_TRUE(testing::the_step().forward(prob.params(), nullptr).ok());
      Gradients g = make_gradients(prob, 12);
      expect_refused(testing::the_step().backward(g.bp, nullptr), "head dim 256");
      expect_gradients_untouched(g);
      continue;
    }
    check_backward(shape(2, 4, 2, 77, 131, d, false, CausalAlign::top_left, 21));
    check_backward(shape(1, 4, 1, 200, 70, d, true, CausalAlign::bottom_right, 22));
    check_backward(shape(1, 2, 2, 1024, 1024, d, true, CausalAlign::top_left, 23));
    // The window kernels (their deterministic ones held the most registers at 96) and the cap's.
    ProblemShape windowed = shape(1, 4, 2, 333, 517, d, false, CausalAlign::top_left, 24);
    windowed.window_left = 100, windowed.window_right = 50;
    check_backward(windowed);
    ProblemShape capped = shape(1, 2, 1, 150, 260, d, true, CausalAlign::bottom_right, 25);
    capped.softcap = 5.0f;
    check_backward(capped);
  }
  if (runs == 0) GTEST_SKIP() << "the step has no backward at D = 32, 96, 192 or 256";
}

// A head dim a step's forward has and its backward lacks: the forward runs, the backward refuses by
// name and writes nothing. Skipped, never passed, where the backward has every head dim the forward
// has (the production kernels, since their backward has 192 and 256).
TEST(Backward, HeadDimsWithoutABackwardAreRefused) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  int runs = 0;
  const std::vector<int>& has = testing::backward_head_dims(step);
  for (int d : step.caps.head_dims) {
    if (std::find(has.begin(), has.end(), d) != has.end()) continue;
    ++runs;
    AttentionProblem prob(shape(1, 2, 1, 100, 130, d, true, CausalAlign::bottom_right, 11));
    ASSERT_TRUE(step.forward(prob.params(), nullptr).ok()) << "D = " << d;
    Gradients g = make_gradients(prob, 12);
    expect_refused(step.backward(g.bp, nullptr), "head dim " + std::to_string(d));
    expect_gradients_untouched(g);
  }
  if (runs == 0) GTEST_SKIP() << "the step's forward has no head dim beyond its backward's";
}

// fp16 (the production kernels built with FA_DTYPES=bf16;fp16): the backward in fp16 at the fp64
// reference, at fp16's tighter limit (check_backward_mode), every head dim the backward has, in
// each kernel family it runs: ragged GQA, causal bottom-right with rows that see no key, a longer
// causal call at 128, a window, large logits under a cap, and every modification together (where
// the step takes them). Skipped, never passed, where the step has no fp16 forward to produce O (every
// lesson, a build without fp16).
TEST(Backward, Fp16) {
  FA_REQUIRE_GPU();
  FA_REQUIRE_FP16();
  const StepInfo& step = testing::the_step();
  auto fp16 = [](ProblemShape s) {
    s.dtype = DType::fp16;
    return s;
  };
  const bool on_sm90 = testing::runs_sm90();
  for (int d : testing::backward_head_dims(step)) {
    if (d == 256 && !on_sm90) continue;  // refused there in any type (HeadDimsBeyondTheLessons)
    check_backward(fp16(shape(2, 4, 2, 77, 131, d, false, CausalAlign::top_left, 41)));
    check_backward(fp16(shape(1, 4, 1, 200, 70, d, true, CausalAlign::bottom_right, 42)));
  }
  check_backward(fp16(shape(1, 2, 1, 1000, 1000, 128, true, CausalAlign::top_left, 43)));
  ProblemShape windowed = fp16(shape(1, 4, 2, 333, 517, 64, false, CausalAlign::top_left, 44));
  windowed.window_left = 100, windowed.window_right = 50;
  ProblemShape hot = fp16(shape(1, 2, 2, 300, 300, 128, false, CausalAlign::top_left, 45));
  hot.input = InputKind::large_logits;
  hot.softcap = 30.0f;
  ProblemShape all = fp16(shape(2, 4, 2, 400, 600, 128, true, CausalAlign::bottom_right, 46));
  all.window_left = 100, all.window_right = 0;
  all.softcap = 20.0f, all.alibi = ProblemShape::Alibi::per_head, all.sinks = true, all.softmax_scale = 0.2f;
  const bool mods = step.caps.softcap && step.caps.alibi && step.caps.sinks;
  if (step.caps.sliding_window) check_backward(windowed);
  if (mods) check_backward(hot);
  if (mods && step.caps.sliding_window) check_backward(all);
}

// Refusals: no LSE, a workspace too small, dK overlapping dV; nothing is written.
TEST(Backward, RefusesBadCalls) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  AttentionProblem prob(shape(1, 2, 1, 64, 64, 64, false, CausalAlign::top_left, 7));
  ASSERT_TRUE(step.forward(prob.params(), nullptr).ok());
  Gradients g = make_gradients(prob, 8);
  BackwardParams no_lse = g.bp;
  no_lse.fwd.lse = nullptr;
  Status st = step.backward(no_lse, nullptr);
  expect_refused(st, "LSE");
  BackwardParams small = g.bp;
  small.workspace_bytes = backward_workspace_bytes(g.bp.fwd) - 1;
  st = step.backward(small, nullptr);
  EXPECT_NE(st.message().find("workspace"), std::string::npos) << st.message();
  BackwardParams overlap = g.bp;
  overlap.dv = overlap.dk;
  st = step.backward(overlap, nullptr);
  EXPECT_NE(st.message().find("overlaps"), std::string::npos) << st.message();
  expect_gradients_untouched(g);
}

}  // namespace
}  // namespace fa
