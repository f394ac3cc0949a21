// Exact FLOP count of one attention forward: two matmuls of 2·D FLOPs per visible (query, key)
// pair, i.e. 4·D per pair. With the causal mask only the pairs the mask lets through count.
#pragma once

#include "device/mask.h"
#include "fa/params.h"

namespace fa {

// Visible (query, key) pairs of one head.
inline double visible_pairs(int64_t n_q, int64_t n_kv, bool causal, int64_t offset) {
  if (!causal) return double(n_q) * double(n_kv);
  double pairs = 0;
  for (int64_t i = 0; i < n_q; ++i) pairs += double(visible_keys(i, n_kv, true, offset));
  return pairs;
}

// The same under a sliding window too (either side −1: unbounded): each row's visible_key_range.
inline double visible_pairs(int64_t n_q, int64_t n_kv, bool causal, int64_t offset, int64_t left, int64_t right) {
  if (left < 0 && right < 0) return visible_pairs(n_q, n_kv, causal, offset);
  double pairs = 0;
  for (int64_t i = 0; i < n_q; ++i) {
    const KeyRange keys = visible_key_range(i, n_kv, offset, causal, left, right);
    pairs += double(keys.end - keys.begin);
  }
  return pairs;
}

inline double attention_flops(const AttentionParams& p) {
  return 4.0 * double(p.batch) * double(p.heads_q) * double(p.head_dim) *
         visible_pairs(p.seqlen_q, p.seqlen_kv, p.causal, p.causal_offset(), p.window_left, p.window_right);
}

// The backward's, as flash-attention counts them: five matmuls to the forward's two, 2.5 × its FLOPs.
inline double attention_backward_flops(const AttentionParams& p) {
  return 2.5 * attention_flops(p);
}

}  // namespace fa
