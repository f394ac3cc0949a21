// Merging two partial attention results computed over disjoint sets of keys, A and B.
//
// A step that stores LSE (step 07) returns, per query row, O_A = Σ_{j∈A} e^{s_j} v_j / Σ_{j∈A} e^{s_j}
// and lse_A = log Σ_{j∈A} e^{s_j} (s already scaled). The full result over A ∪ B follows from the
// two parts alone:
//   lse = log(e^lse_A + e^lse_B)                       (computed as max + log(1 + e^(min − max)))
//   O   = e^(lse_A − lse) · O_A + e^(lse_B − lse) · O_B
// This is what split-KV decoding, ring attention and the backward pass build on, and why an LSE
// that is just the row max (missing log l) is a bug: the weights come out wrong.
// A part that saw no key has lse = -inf and weight 0; if neither did, lse = -inf and O = 0.
#pragma once

#include <cmath>

#include "device/mask.h"  // FA_HD

namespace fa {

struct LseMergeWeights {
  float lse;  // log-sum-exp of the union
  float w_a;  // weight of O_A in the merged O
  float w_b;  // weight of O_B
};

FA_HD LseMergeWeights merge_lse(float lse_a, float lse_b) {
  const float hi = fmaxf(lse_a, lse_b);
  if (hi == -INFINITY) return {-INFINITY, 0.0f, 0.0f};
  const float ea = expf(lse_a - hi), eb = expf(lse_b - hi);  // one of them is exactly 1
  const float sum = ea + eb;
  return {hi + logf(sum), ea / sum, eb / sum};
}

/// One merged output element from the two parts' elements and their row's weights.
FA_HD float merge_output(float o_a, float o_b, const LseMergeWeights& w) {
  return w.w_a * o_a + w.w_b * o_b;
}

}  // namespace fa
