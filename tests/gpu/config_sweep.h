// Checks every compiled configuration of a tuned step (06, 07) against the reference, not just
// the ones the tuner happens to pick on the test shapes.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "tests/gpu/step_suite.h"

namespace fa::testing {

using ConfigNamesFn = std::vector<std::string> (*)(int head_dim);
using ForwardWithConfigFn = Status (*)(const AttentionParams&, const std::string&, cudaStream_t);

// Ragged sizes, both causal alignments, GQA, (B, N, H, D) layout, more (batch, head) pairs than
// the grid's y dimension holds: each on every configuration.
inline void expect_every_config_matches(ConfigNamesFn names, ForwardWithConfigFn run, bool with_lse) {
  FA_REQUIRE_GPU();
  std::vector<ProblemShape> shapes;
  auto add = [&](int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nkv, bool causal, CausalAlign a, Layout l) {
    ProblemShape s;
    s.batch = b, s.heads_q = h, s.heads_kv = hkv, s.seqlen_q = nq, s.seqlen_kv = nkv;
    s.causal = causal, s.align = a, s.layout = l, s.with_lse = with_lse;
    shapes.push_back(s);
  };
  add(2, 2, 2, 1013, 1024, true, CausalAlign::top_left, Layout::bhnd);
  add(1, 4, 2, 300, 1000, true, CausalAlign::bottom_right, Layout::bnhd);
  add(1, 2, 2, 1000, 300, true, CausalAlign::bottom_right, Layout::bhnd);  // fully masked rows
  add(1, 2, 1, 77, 333, false, CausalAlign::top_left, Layout::bhnd);
  add(1, 65600, 16400, 40, 70, true, CausalAlign::bottom_right, Layout::bhnd);  // B·H past the grid's y limit
  for (int d : {64, 128}) {
    for (const std::string& cfg : names(d)) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        ProblemShape s = shapes[i];
        s.head_dim = d;
        s.seed = 9000 + 17 * i + d;
        AttentionProblem prob(s);
        ReferenceData ref = compute_reference(prob);
        prob.poison_outputs();
        Status st = run(prob.params(), cfg, nullptr);
        if (!st.ok() && st.message().find("shared memory") != std::string::npos) {
          std::cout << "    " << cfg << ": does not fit this GPU, skipped\n";
          break;
        }
        ASSERT_TRUE(st.ok()) << cfg << ": " << st.message();
        FA_CUDA_CHECK(cudaDeviceSynchronize());
        CompareResult o = compare(prob.output_bhnd(), ref.o, bf16_tolerance());
        EXPECT_TRUE(o.ok) << cfg << " on " << to_string(s) << "\n  O: " << o.summary();
        if (with_lse) {
          CompareResult l = compare(prob.lse(), ref.lse, lse_tolerance());
          EXPECT_TRUE(l.ok) << cfg << " on " << to_string(s) << "\n  LSE: " << l.summary();
        }
      }
    }
  }
}

}  // namespace fa::testing
