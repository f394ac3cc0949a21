// Merging the partial results of split-KV attention (Flash-Decoding, Part V): the keys of one
// query row are split into S disjoint ranges, each computed by its own block, which writes its
// partial output O_s (normalised over its own keys, fp32) and its log-sum-exp lse_s. The row's
// result is the LSE-weighted sum (device/lse_merge.h, for two parts; here for S at once):
//   lse = log Σ_s e^lse_s            computed as m + log Σ_s e^(lse_s − m), m = max_s lse_s
//   O   = Σ_s e^(lse_s − lse) · O_s
// A split that saw no key (past the end of a short sequence, or wholly masked) has lse_s = −inf
// and must weigh 0. If every split is empty, m = −inf and lse_s − m would be −inf − (−inf) = NaN:
// the guard makes lse = −inf and every weight 0, so the row's O is 0, as an unsplit kernel gives.
//
// __host__ __device__: the combine kernel calls it per row, and the CPU test checks it against
// fp64 softmax over all the keys (tests/cpu/split_combine_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "device/mask.h"  // FA_HD

namespace fa {

/// The log-sum-exp of S partial results, lse_s = lse[s · stride]: −inf when every one is −inf.
FA_HD float combined_lse(const float* lse, int splits, int64_t stride) {
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, lse[s * stride]);
  if (m == -INFINITY) return -INFINITY;  // every split empty: no NaN from −inf − (−inf)
  float sum = 0.0f;
  for (int s = 0; s < splits; ++s) sum += expf(lse[s * stride] - m);  // the largest term is exactly 1
  return m + logf(sum);
}

/// The weight of a partial result with log-sum-exp lse_s in a row whose combined_lse is lse:
/// e^(lse_s − lse), and 0 for an empty split or an empty row.
FA_HD float split_weight(float lse_s, float lse) {
  return lse == -INFINITY ? 0.0f : expf(lse_s - lse);
}

}  // namespace fa
