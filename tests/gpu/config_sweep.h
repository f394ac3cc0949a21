// Checks every compiled configuration of a tuned step (06 on) against the reference, not just the
// ones the tuner happens to pick on the test shapes.
#pragma once

#include <gtest/gtest.h>

#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "library/tuner.h"
#include "tests/gpu/step_suite.h"

namespace fa::testing {

// The shapes of the sweep: ragged sizes, both causal alignments, fully masked rows, GQA,
// (B, N, H, D) layout, more (batch, head) pairs than the grid's y dimension holds, and the
// structured inputs of the shared suite: large logits (an exp without the max overflows), a
// long sequence (low-precision softmax state drifts), flat scores over large values (fp16 state
// overflows), and strided rows. K and V sit in poisoned memory (harness/problem.h) throughout.
inline std::vector<ProblemShape> config_sweep_shapes(bool with_lse) {
  std::vector<ProblemShape> shapes;
  auto add = [&](int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nkv, bool causal, CausalAlign a, Layout l,
                 InputKind input = InputKind::random) {
    ProblemShape s;
    s.batch = b, s.heads_q = h, s.heads_kv = hkv, s.seqlen_q = nq, s.seqlen_kv = nkv;
    s.causal = causal, s.align = a, s.layout = l, s.input = input, s.with_lse = with_lse;
    shapes.push_back(s);
  };
  add(2, 2, 2, 1013, 1024, true, CausalAlign::top_left, Layout::bhnd);
  add(1, 4, 2, 300, 1000, true, CausalAlign::bottom_right, Layout::bnhd);
  add(1, 2, 2, 1000, 300, true, CausalAlign::bottom_right, Layout::bhnd);  // fully masked rows
  add(1, 2, 1, 77, 333, false, CausalAlign::top_left, Layout::bhnd);
  add(1, 65600, 16400, 40, 70, true, CausalAlign::bottom_right, Layout::bhnd);  // B·H past the grid's y limit
  add(1, 2, 2, 515, 700, false, CausalAlign::top_left, Layout::bhnd, InputKind::large_logits);
  add(1, 2, 2, 515, 700, true, CausalAlign::top_left, Layout::bhnd, InputKind::large_logits);
  add(1, 2, 2, 8192, 8192, false, CausalAlign::top_left, Layout::bhnd);
  add(1, 2, 2, 8192, 8192, true, CausalAlign::top_left, Layout::bhnd);
  add(1, 2, 2, 256, 8192, false, CausalAlign::top_left, Layout::bhnd, InputKind::flat_large_v);
  add(2, 2, 1, 77, 150, true, CausalAlign::bottom_right, Layout::bnhd);
  shapes.back().row_gap = 24;  // strided rows: O's gaps must stay untouched
  return shapes;
}

// Every config of `step`'s tuner on every sweep shape, at every head dim the step has. A config that does not fit
// this GPU's shared memory is not run: the test then ends SKIPPED and names it, never passes. `dtype`: the
// inputs' and O's element type (fp16: the production forwards' other instantiations), O held to its rule.
inline void expect_every_config_matches(const StepInfo& step, DType dtype = DType::bf16) {
  FA_REQUIRE_GPU();
  const tuner::Tuner* tuner = tuner::find_tuner(step.number);
  ASSERT_NE(tuner, nullptr) << "step " << step.number << " registers no tuner";
  const std::vector<ProblemShape> shapes = config_sweep_shapes(step.caps.lse);
  std::set<std::string> not_run;  // "<config> at D=<d>"
  int runs = 0;
  for (int d : step.caps.head_dims) {
    const std::vector<std::string> configs = tuner->config_names(d);
    EXPECT_FALSE(configs.empty()) << "no config for head dim " << d;
    for (size_t i = 0; i < shapes.size(); ++i) {
      ProblemShape s = shapes[i];
      s.head_dim = d;
      s.seed = 9000 + 17 * i + size_t(d) + (dtype == DType::fp16 ? 5000 : 0);
      s.dtype = dtype;
      AttentionProblem prob(s);
      ReferenceData ref = compute_reference(prob);
      const AttentionParams p = prob.params();
      // run_config launches without validating: the shape must be one the step accepts.
      const Status valid = validate(p, step.caps);
      ASSERT_TRUE(valid.ok()) << to_string(s) << ": " << valid.message();
      for (const std::string& cfg : configs) {
        const std::string label = cfg + " at D=" + std::to_string(d);
        if (not_run.count(label)) continue;
        prob.poison_outputs();
        const Status st = tuner->run_config(p, cfg, nullptr);
        if (!st.ok() && st.message().find("needs more shared memory") != std::string::npos) {
          std::cout << "    NOT RUN: " << label << ": " << st.message() << "\n";
          not_run.insert(label);
          continue;
        }
        ASSERT_TRUE(st.ok()) << cfg << " on " << to_string(s) << ": " << st.message();
        FA_CUDA_CHECK(cudaDeviceSynchronize());
        ++runs;
        const CompareResult o = compare(prob.output_bhnd(), ref.o, output_tolerance(dtype));
        EXPECT_TRUE(o.ok) << cfg << " on " << to_string(s) << "\n  O: " << o.summary();
        std::string why;
        EXPECT_TRUE(prob.memory_intact(&why)) << cfg << " on " << to_string(s) << ": " << why;
        if (step.caps.lse) {
          const CompareResult l = compare(prob.lse(), ref.lse, lse_tolerance());
          EXPECT_TRUE(l.ok) << cfg << " on " << to_string(s) << "\n  LSE: " << l.summary();
        }
      }
    }
  }
  std::cout << "    " << runs << " config × shape runs checked\n";
  if (!not_run.empty()) {
    std::string names;
    for (const std::string& n : not_run) names += "\n      " + n;
    GTEST_SKIP() << not_run.size() << " config(s) do not fit this GPU and were NOT RUN:" << names;
  }
}

}  // namespace fa::testing
