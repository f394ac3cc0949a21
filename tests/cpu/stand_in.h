// Stand-in device pointers for the CPU tests of validation (no GPU): 16 TiB apart, so that two of
// them never overlap, and never dereferenced.
#pragma once

#include <cstdint>

#include "fa/params.h"

namespace fa {

inline void* stand_in(uintptr_t slot) {
  return reinterpret_cast<void*>(slot << 44);
}

/// A forward call of these sizes, contiguous (B, H, N, D), on stand-ins 1-5 for Q, K, V, O, LSE.
inline AttentionParams stand_in_params(int64_t b, int64_t h_q, int64_t h_kv, int64_t n_q, int64_t n_kv, int64_t d) {
  AttentionParams p;
  p.batch = b, p.heads_q = h_q, p.heads_kv = h_kv, p.seqlen_q = n_q, p.seqlen_kv = n_kv, p.head_dim = d;
  set_bhnd_strides(p);
  p.q = stand_in(1), p.k = stand_in(2), p.v = stand_in(3), p.o = stand_in(4);
  p.lse = static_cast<float*>(stand_in(5));
  return p;
}

}  // namespace fa
