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

struct ReferenceGradients {
  std::vector<double> dq;     // contiguous (B, H_q, N_q, D)
  std::vector<double> dk;     // contiguous (B, H_kv, N_kv, D): summed over the query heads of each KV head
  std::vector<double> dv;     // contiguous (B, H_kv, N_kv, D): likewise
  std::vector<double> delta;  // contiguous (B, H_q, N_q): D_i = rowsum(dO ∘ O), the backward's preprocess
};

// The backward of cpu_reference: the gradients of a loss L with dL/dO = `d_o` (a host array laid
// out with O's strides, p.o_stride) with respect to Q, K and V, in fp64, for the same features
// (GQA, N_q != N_kv, any strides, both causal alignments, the softmax scale). With P the softmax
// of row i (c = the scale):
//   dV_j += P_ij dO_i          dP_ij = dO_i · V_j          D_i = Σ_j P_ij dP_ij = dO_i · O_i
//   dS_ij = P_ij (dP_ij − D_i) dQ_i += c Σ_j dS_ij K_j     dK_j += c dS_ij Q_i
// A row that sees no key contributes nothing: its dQ is 0, and it adds nothing to dK or dV.
ReferenceGradients cpu_reference_backward(const AttentionParams& p, const float* q, const float* k, const float* v,
                                          const float* d_o);

}  // namespace fa
