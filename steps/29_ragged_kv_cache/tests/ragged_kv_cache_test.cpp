// Step 29's ragged KV caches against the fp64 reference, sequence by sequence: each sequence b of
// a (B, capacity) cache attends to its first seqlens_kv[b] keys, with the causal diagonal aligned
// to that length. The rows past each length are poisoned (NaN) in K and V, so a kernel that reads
// one key too many shows; O, the LSE, their guards and the workspace start poisoned too. Lengths:
// the capacity, one key, none, a ragged tile, an exact tile, and out-of-range values (clamped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "reference/cpu_reference.h"
#include "tests/gpu/split_kv_check.h"

namespace fa {
namespace {

// Runs the step on `s` (N_kv = the capacity) with `lengths` and num_splits (0: its choice, with a
// workspace of kMaxKvSplits), and checks every sequence against the reference on its own keys.
void expect_ragged_matches(ProblemShape s, const std::vector<int32_t>& lengths, int num_splits) {
  ASSERT_EQ(int64_t(lengths.size()), s.batch);
  s.with_lse = true;
  AttentionProblem prob(s);
  AttentionParams p = prob.params();
  // NaN (0xFFFF) in every K and V row past each sequence's length.
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t len = std::clamp<int64_t>(lengths[size_t(b)], 0, s.seqlen_kv);
    for (int64_t h = 0; h < s.heads_kv; ++h)
      for (int64_t j = len; j < s.seqlen_kv; ++j)
        for (const auto& [t, st] : {std::pair{p.k, p.k_stride}, std::pair{p.v, p.v_stride}})
          FA_CUDA_CHECK(
              cudaMemset(static_cast<__nv_bfloat16*>(const_cast<void*>(t)) + b * st.batch + h * st.head + j * st.seq,
                         0xFF, size_t(s.head_dim) * sizeof(__nv_bfloat16)));
  }
  std::vector<double> ref_o, ref_lse;
  testing::per_sequence_reference(
      p, prob.host_q(), prob.host_k(), prob.host_v(),
      [&](int64_t b) { return std::clamp<int64_t>(lengths[size_t(b)], 0, s.seqlen_kv); }, &ref_o, &ref_lse,
      ReferenceScoreMods{prob.alibi_slopes_host.data(), prob.sinks_host.data()});
  DeviceBuffer<int32_t> seqlens(lengths.size());
  seqlens.upload(lengths);
  p.seqlens_kv = seqlens.get();
  std::string lens;
  for (int32_t l : lengths) lens += std::to_string(l) + " ";
  testing::expect_cache_call_matches(prob, p, num_splits, ref_o, ref_lse, "lengths " + lens);
}

ProblemShape shape(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t capacity, int64_t d, bool causal) {
  ProblemShape s;
  s.batch = b, s.heads_q = h, s.heads_kv = hkv, s.seqlen_q = nq, s.seqlen_kv = capacity, s.head_dim = d;
  s.causal = causal, s.align = CausalAlign::bottom_right;
  s.seed = uint64_t(29000 + b * 7 + h * 11 + nq * 13 + capacity * 17 + d + causal);
  return s;
}

TEST(RaggedCache, DecodeEachSequenceItsOwnLength) {
  FA_REQUIRE_GPU();
  // The capacity, one key, none, a ragged tile, exactly one tile.
  for (int64_t d : {64, 128})
    for (int splits : {1, 3, 0})
      expect_ragged_matches(shape(5, 8, 2, 1, 1000, d, false), {1000, 1, 0, 513, 64}, splits);
}

// The score modifications on a ragged cache (the production kernels'): ALiBi's diagonal is each
// sequence's own length, a row's sink is added once (a sequence of no key: O = 0, LSE = the sink),
// split or not. A step without them refuses the call, with nothing written.
TEST(RaggedCache, ScoreModsToEachLength) {
  FA_REQUIRE_GPU();
  ProblemShape s = shape(4, 16, 4, 2, 800, 128, true);
  s.softcap = 20.0f;
  s.alibi = ProblemShape::Alibi::per_batch_head;
  s.sinks = true;
  const Capabilities& caps = testing::the_step().caps;
  if (caps.softcap && caps.alibi && caps.sinks) {
    for (int splits : {1, 4}) expect_ragged_matches(s, {2, 100, 0, 777}, splits);
    return;
  }
  testing::expect_step_refuses(s, "softcap");
}

// A sliding window on a ragged cache (the production kernels'): each sequence's window ends at its
// own length's diagonal, split or not; lengths shorter than the window, and none. A step without a
// window refuses the call by name, with nothing written.
TEST(RaggedCache, SlidingWindowToEachLength) {
  FA_REQUIRE_GPU();
  ProblemShape s = shape(4, 16, 4, 2, 800, 128, true);
  s.window_left = 50, s.window_right = 0;
  if (testing::the_step().caps.sliding_window) {
    for (int splits : {1, 4}) expect_ragged_matches(s, {2, 100, 0, 777}, splits);
    return;
  }
  testing::expect_step_refuses(s, "sliding window");
}

TEST(RaggedCache, SpeculativeRowsBottomRightToEachLength) {
  FA_REQUIRE_GPU();
  // 4 new rows per sequence: row i sees keys up to i + len − 4. With len = 3 the first row sees none.
  for (int splits : {1, 4}) expect_ragged_matches(shape(4, 16, 4, 4, 800, 128, true), {4, 100, 3, 777}, splits);
}

TEST(RaggedCache, LengthsOutsideTheCapacityAreClamped) {
  FA_REQUIRE_GPU();
  expect_ragged_matches(shape(3, 4, 4, 1, 300, 64, true), {5000, -7, 300}, 2);
}

}  // namespace
}  // namespace fa
