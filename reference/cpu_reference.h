// The ground truth: attention in fp64 on the CPU, written as plainly as possible.
#pragma once

#include <vector>

#include "fa/params.h"

namespace fa {

// The host copies of the score modifications' arrays (AttentionParams::alibi_slopes and ::sinks
// are device pointers, which the reference does not read): given whenever p sets the pointer.
struct ReferenceScoreMods {
  const float* alibi_slopes = nullptr;  // laid out as p.alibi_slopes (p.alibi_slopes_stride_batch)
  const float* sinks = nullptr;         // H_q floats
};

struct ReferenceOutput {
  std::vector<double> o;    // contiguous (B, H_q, N_q, D)
  std::vector<double> lse;  // contiguous (B, H_q, N_q), natural log; -inf for a row with no visible key
};

// Computes O = softmax(scale·Q·Kᵀ + mask)·V and LSE for the shapes, strides, scale, causal flag
// and alignment of `p`. The device pointers in `p` are ignored: q, k and v are host arrays laid
// out with p's strides. Every feature of AttentionParams is honoured (GQA, N_q != N_kv, any
// strides, both causal alignments, the sliding window, and the score modifications: softcap,
// ALiBi and sinks, their arrays from `mods`). A row that sees no key gets O = 0 and LSE = -inf, or
// LSE = its sink with sinks. Throws std::invalid_argument when p sets alibi_slopes or sinks and
// `mods` lacks the host copy.
ReferenceOutput cpu_reference(const AttentionParams& p, const float* q, const float* k, const float* v,
                              const ReferenceScoreMods& mods = {});

struct ReferenceGradients {
  std::vector<double> dq;      // contiguous (B, H_q, N_q, D)
  std::vector<double> dk;      // contiguous (B, H_kv, N_kv, D): summed over the query heads of each KV head
  std::vector<double> dv;      // contiguous (B, H_kv, N_kv, D): likewise
  std::vector<double> delta;   // contiguous (B, H_q, N_q): D_i = rowsum(dO ∘ O), the backward's preprocess
  std::vector<double> dsinks;  // (H_q), summed over batch and rows; empty without sinks
};

// The backward of cpu_reference: the gradients of a loss L with dL/dO = `d_o` (a host array laid
// out with O's strides, p.o_stride) with respect to Q, K and V, in fp64, for the same features
// (GQA, N_q != N_kv, any strides, both causal alignments, the softmax scale). With P the softmax
// of row i (c = the scale):
//   dV_j += P_ij dO_i          dP_ij = dO_i · V_j          D_i = Σ_j P_ij dP_ij = dO_i · O_i
//   dS_ij = P_ij (dP_ij − D_i) dQ_i += c Σ_j dS_ij K_j     dK_j += c dS_ij Q_i
// A row that sees no key contributes nothing: its dQ is 0, and it adds nothing to dK or dV.
// The score modifications: with softcap, dS_ij is multiplied by the cap's derivative
// 1 − tanh²(s_ij / softcap) (s the scaled score before the cap) before it reaches dQ and dK; ALiBi's
// bias is a constant (no slope gradient); a sink's gradient is −Σ_i P_i,sink · D_i over the rows
// of its head, P_i,sink = e^(sink − LSE_i), and D_i sums over the keys alone (the sink adds nothing
// to O).
ReferenceGradients cpu_reference_backward(const AttentionParams& p, const float* q, const float* k, const float* v,
                                          const float* d_o, const ReferenceScoreMods& mods = {});

}  // namespace fa
