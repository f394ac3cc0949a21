// The deterministic mode: the same backward call, repeated, gives the same bits in dQ, dK and dV.
// (Its gradients are checked against the fp64 reference by step 17's tests, which this step runs
// in both modes.) The shapes are the ones where the default mode's atomics race hardest: many KV
// tiles adding into the same Q tile at once, and a causal GQA call whose blocks meet at the diagonal.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fa/registry.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "harness/problem.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

using bf16 = __nv_bfloat16;

// The bits of dQ, dK and dV after one backward call on `prob`, whose forward has run; the
// gradients and the workspace are poisoned before the call, so nothing carries over between runs.
std::vector<unsigned char> gradient_bits(const AttentionProblem& prob, const DeviceBuffer<bf16>& d_o,
                                         bool deterministic) {
  const AttentionParams p = prob.params();
  const size_t q_elems = size_t(p.batch * p.heads_q * p.seqlen_q * p.head_dim);
  const size_t kv_elems = size_t(p.batch * p.heads_kv * p.seqlen_kv * p.head_dim);
  DeviceBuffer<bf16> dq(q_elems), dk(kv_elems), dv(kv_elems);
  DeviceBuffer<unsigned char> workspace(backward_workspace_bytes(p));
  dq.poison();
  dk.poison();
  dv.poison();
  workspace.poison();
  BackwardParams bp =
      contiguous_backward_params(p, d_o.get(), dq.get(), dk.get(), dv.get(), workspace.get(), workspace.bytes());
  bp.deterministic = deterministic;
  const Status st = testing::the_step().backward(bp, nullptr);
  EXPECT_TRUE(st.ok()) << st.message();
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> bits((q_elems + 2 * kv_elems) * sizeof(bf16));
  FA_CUDA_CHECK(cudaMemcpy(bits.data(), dq.get(), q_elems * sizeof(bf16), cudaMemcpyDeviceToHost));
  FA_CUDA_CHECK(
      cudaMemcpy(bits.data() + q_elems * sizeof(bf16), dk.get(), kv_elems * sizeof(bf16), cudaMemcpyDeviceToHost));
  FA_CUDA_CHECK(cudaMemcpy(bits.data() + (q_elems + kv_elems) * sizeof(bf16), dv.get(), kv_elems * sizeof(bf16),
                           cudaMemcpyDeviceToHost));
  return bits;
}

void expect_repeatable(ProblemShape shape) {
  shape.with_lse = true;
  const std::string where = to_string(shape);
  AttentionProblem prob(shape);
  ASSERT_TRUE(testing::the_step().forward(prob.params(), nullptr).ok()) << where;
  const AttentionParams p = prob.params();
  const size_t q_elems = size_t(p.batch * p.heads_q * p.seqlen_q * p.head_dim);
  DeviceBuffer<bf16> d_o(q_elems);
  std::vector<bf16> host(q_elems);
  for (size_t i = 0; i < q_elems; ++i) host[i] = __float2bfloat16(float((i * 2654435761u) % 2001) / 1000.0f - 1.0f);
  d_o.upload(host);
  const std::vector<unsigned char> first = gradient_bits(prob, d_o, true);
  constexpr int kRuns = 6;
  for (int run = 1; run < kRuns; ++run) {
    const std::vector<unsigned char> again = gradient_bits(prob, d_o, true);
    ASSERT_EQ(again.size(), first.size());
    size_t differing = 0;
    for (size_t i = 0; i < first.size(); ++i) differing += first[i] != again[i];
    EXPECT_EQ(differing, 0u) << where << ": run " << run << " differs from run 0 in " << differing
                             << " bytes of dQ, dK, dV";
  }
}

TEST(Backward, DeterministicModeRepeatsBitForBit) {
  FA_REQUIRE_GPU();
  ASSERT_TRUE(testing::the_step().caps.deterministic_backward);
  // 16 queries against 8192 keys: 128 blocks add into one Q tile of dQ at the same moment.
  expect_repeatable(make_shape(1, 2, 2, 16, 8192, 64, false, CausalAlign::top_left));
  // Non-causal, GQA, ragged, D = 128: 16 KV tiles, 63 Q tiles each.
  expect_repeatable(make_shape(2, 4, 2, 1000, 1000, 128, false, CausalAlign::top_left));
  // Causal bottom-right with more keys than queries, D = 64.
  expect_repeatable(make_shape(1, 4, 1, 700, 1500, 64, true, CausalAlign::bottom_right));
  // Part VI's head dims where the step's backward has them (kernels 100 and 101, FA_HEAD_DIMS=all);
  // 256 on sm_90 alone (elsewhere refused: Backward.HeadDimsBeyondTheLessons).
  const bool on_sm90 = testing::runs_sm90();
  for (int d : testing::backward_head_dims(testing::the_step()))
    if (d == 32 || d == 96 || d == 192 || (d == 256 && on_sm90))
      expect_repeatable(make_shape(1, 2, 2, 16, 4096, d, false, CausalAlign::top_left));
}

}  // namespace
}  // namespace fa
