// The ground truth: attention in fp64 on the CPU, written as plainly as possible.
#pragma once

#include <vector>

#include "fa/params.h"

namespace fa {

struct ReferenceOutput {
  std::vector<double> o;    // contiguous (B, H_q, N_q, D)
  std::vector<double> lse;  // contiguous (B, H_q, N_q), natural log; -inf for a row with no visible key
};

// Computes O = softmax(scale·Q·Kᵀ + mask)·V and LSE for the shapes, strides, scale, causal flag
// and alignment of `p`. The device pointers in `p` are ignored: q, k and v are host arrays laid
// out with p's strides. Every feature of AttentionParams is honoured (GQA, N_q != N_kv, any
// strides, both causal alignments). A row that sees no key gets O = 0 and LSE = -inf.
ReferenceOutput cpu_reference(const AttentionParams& p, const float* q, const float* k, const float* v);

}  // namespace fa
