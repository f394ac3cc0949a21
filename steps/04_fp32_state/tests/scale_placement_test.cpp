// Step 04's experiment (seed bug #2): where should the softmax scale go? The same kernel runs with
// the scale in three places and each output is compared with the fp64 CPU reference:
//   (a) Q·scale rounded to bf16 before the loop (the seed's advice)
//   (b) fp32 scores multiplied by the scale, then exp
//   (c) log2(e)·scale folded into the exponent: p = 2^(c·s − c·m), one FFMA per score
// The printed table is the one in steps/04_fp32_state/README.md.
#include <gtest/gtest.h>

#include <cstdio>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "fa/steps.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

using step04::ScalePlacement;

const char* placement_name(ScalePlacement p) {
  switch (p) {
    case ScalePlacement::q_bf16:
      return "(a) Q·scale in bf16";
    case ScalePlacement::scores_fp32:
      return "(b) fp32 scores·scale";
    case ScalePlacement::folded_exp2:
      return "(c) folded into exp2";
  }
  return "?";
}

TEST(ScalePlacement, MeasureErrorsAgainstFp64Reference) {
  FA_REQUIRE_GPU();
  std::printf("\n| D | input | placement | max abs err | rel norm err |\n|---|---|---|---|---|\n");
  for (int d : {64, 128}) {
    for (InputKind input : {InputKind::random, InputKind::large_logits}) {
      ProblemShape s;
      s.batch = 1;
      s.heads_q = s.heads_kv = 2;
      s.seqlen_q = s.seqlen_kv = 1024;
      s.head_dim = d;
      s.input = input;
      s.with_lse = false;
      s.seed = 4000 + d + int(input);
      AttentionProblem prob(s);
      ReferenceData ref = compute_reference(prob, ReferenceKind::cpu);
      for (ScalePlacement pl : {ScalePlacement::q_bf16, ScalePlacement::scores_fp32, ScalePlacement::folded_exp2}) {
        prob.poison_outputs();
        Status st = step04::forward_with_scale_placement(prob.params(), pl, nullptr);
        ASSERT_TRUE(st.ok()) << st.message();
        FA_CUDA_CHECK(cudaDeviceSynchronize());
        CompareResult r = compare(prob.output_bhnd(), ref.o, bf16_tolerance());
        std::printf("| %d | %s | %s | %.3e | %.3e |\n", d, to_string(input).c_str(), placement_name(pl), r.max_abs_err,
                    r.rel_norm);
        EXPECT_EQ(r.nonfinite, 0) << placement_name(pl);
        // (b) and (c) keep the scores in fp32 and must pass the bf16 tolerance; (a) is measured only.
        if (pl != ScalePlacement::q_bf16) {
          EXPECT_TRUE(r.ok) << placement_name(pl) << ": " << r.summary();
        }
      }
    }
  }
}

}  // namespace
}  // namespace fa
