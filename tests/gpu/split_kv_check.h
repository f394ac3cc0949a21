// The split-KV check shared by steps 27 and 28's tests: a shape, and a run with a poisoned
// workspace judged against the reference; and steps 29 and 30's, for caches whose sequences each
// have their own length.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "library/tuner.h"
#include "reference/cpu_reference.h"
#include "tests/gpu/step_suite.h"

namespace fa::testing {

// Bytes of a workspace that no longer hold the poison pattern (0xFF): a split wrote them.
inline size_t bytes_written(const std::vector<unsigned char>& ws) {
  size_t written = 0;
  for (unsigned char c : ws) written += c != 0xFF;
  return written;
}

inline ProblemShape split_shape(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nkv, int64_t d,
                                bool causal = false, CausalAlign align = CausalAlign::bottom_right) {
  ProblemShape s;
  s.batch = b, s.heads_q = h, s.heads_kv = hkv, s.seqlen_q = nq, s.seqlen_kv = nkv, s.head_dim = d;
  s.causal = causal, s.align = align, s.with_lse = true;
  s.seed = uint64_t(27000 + b * 7 + h * 11 + nq * 13 + nkv * 17 + d + causal);
  return s;
}

// Runs the step with num_splits (0: its own choice) and a poisoned workspace of `workspace_splits`
// splits' size; returns the workspace after the call.
// `config`: run that configuration of `tuner` (Tuner::run_config: no routing, no choice), else the
// step's forward.
inline std::vector<unsigned char> expect_split_matches(const ProblemShape& s, int num_splits, int workspace_splits,
                                                       const tuner::Tuner* tuner = nullptr,
                                                       const std::string& config = "") {
  AttentionProblem prob(s);
  const ReferenceData ref = compute_reference(prob);
  AttentionParams p = prob.params();
  const size_t bytes = split_kv_workspace_bytes(p, workspace_splits);
  DeviceBuffer<unsigned char> ws(bytes);
  ws.poison();
  p.num_splits = num_splits;
  p.workspace = bytes ? ws.get() : nullptr;
  p.workspace_bytes = bytes;
  prob.poison_outputs();
  const Status st = tuner ? tuner->run_config(p, config, nullptr) : the_step().forward(p, nullptr);
  EXPECT_TRUE(st.ok()) << st.message();
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  SCOPED_TRACE(to_string(s) + ", num_splits " + std::to_string(num_splits) + (tuner ? ", " + config : ""));
  const CompareResult co = compare(prob.output_bhnd(), ref.o, output_tolerance(s.dtype));
  const CompareResult cl = compare(prob.lse(), ref.lse, lse_tolerance());
  EXPECT_TRUE(co.ok) << "O: " << co.summary();
  EXPECT_TRUE(cl.ok) << "LSE: " << cl.summary();
  std::string why;
  EXPECT_TRUE(prob.memory_intact(&why)) << why;
  std::vector<unsigned char> after = bytes ? ws.download() : std::vector<unsigned char>{};
  if (num_splits > 1) {  // a split writes its partial results: an unsplit run would pass the checks above too
    EXPECT_GT(bytes_written(after), 0u) << "num_splits = " << num_splits
                                        << ": the workspace was not written, the step did not split";
  }
  return after;
}

// The reference of a batch whose sequence b attends to its first length(b) keys (steps 29-30's KV
// caches): each sequence alone, on its own keys, from the problem's host inputs h* and strides p.
// `mods`: the score modifications' host arrays when p has them (ALiBi aligned to each length).
template <typename Length>
void per_sequence_reference(const AttentionParams& p, const std::vector<float>& hq, const std::vector<float>& hk,
                            const std::vector<float>& hv, const Length& length, std::vector<double>* ref_o,
                            std::vector<double>* ref_lse, const ReferenceScoreMods& mods = {}) {
  for (int64_t b = 0; b < p.batch; ++b) {
    AttentionParams one = p;
    one.batch = 1;
    one.seqlen_kv = length(b);
    ReferenceScoreMods m = mods;  // sequence b's slopes, when there is one per (batch, head)
    if (m.alibi_slopes) m.alibi_slopes += b * p.alibi_slopes_stride_batch;
    const ReferenceOutput r = cpu_reference(one, hq.data() + b * p.q_stride.batch, hk.data() + b * p.k_stride.batch,
                                            hv.data() + b * p.v_stride.batch, m);
    ref_o->insert(ref_o->end(), r.o.begin(), r.o.end());
    ref_lse->insert(ref_lse->end(), r.lse.begin(), r.lse.end());
  }
}

// Runs the step on p (prob's call, with whatever lengths or pages the test gave it) with num_splits
// (0: its choice, with a workspace of kMaxKvSplits), O, the LSE, their guards and the workspace
// poisoned, and checks O and the LSE against the reference and the guards intact.
inline void expect_cache_call_matches(AttentionProblem& prob, AttentionParams p, int num_splits,
                                      const std::vector<double>& ref_o, const std::vector<double>& ref_lse,
                                      const std::string& what) {
  const size_t bytes = split_kv_workspace_bytes(p, num_splits == 0 ? kMaxKvSplits : num_splits);
  DeviceBuffer<unsigned char> ws(bytes);
  ws.poison();
  p.num_splits = num_splits;
  p.workspace = bytes ? ws.get() : nullptr;
  p.workspace_bytes = bytes;
  prob.poison_outputs();
  const Status st = the_step().forward(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  SCOPED_TRACE(to_string(prob.shape()) + ", " + what + ", num_splits " + std::to_string(num_splits));
  const CompareResult co = compare(prob.output_bhnd(), ref_o, output_tolerance(prob.shape().dtype));
  const CompareResult cl = compare(prob.lse(), ref_lse, lse_tolerance());
  EXPECT_TRUE(co.ok) << "O: " << co.summary();
  EXPECT_TRUE(cl.ok) << "LSE: " << cl.summary();
  std::string why;
  EXPECT_TRUE(prob.memory_intact(&why)) << why;
}

// A step without an option the production kernels have (score modifications, a window, ...): the
// call of shape s is refused by a message naming `what`, with O as poisoned as before.
inline void expect_step_refuses(ProblemShape s, const std::string& what) {
  s.with_lse = the_step().caps.lse;
  AttentionProblem prob(s);
  const Status st = the_step().forward(prob.params(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_FALSE(st.ok()) << "a step without " << what << " took the call";
  EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  for (float x : prob.output_bhnd()) ASSERT_TRUE(std::isnan(x)) << "a refused call wrote O";
}

}  // namespace fa::testing
