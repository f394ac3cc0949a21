// A simple, obviously correct fp32 GPU reference for shapes too large for the CPU reference.
#pragma once

#include <cuda_runtime_api.h>

#include "fa/params.h"

namespace fa {

// One thread per query row, two passes over the visible keys (max, then exp-sum and P·V).
// Reads q/k/v in p.dtype (bf16 or fp16) through p's strides; writes fp32 o_out as contiguous (B, H_q, N_q, D) and
// lse_out as contiguous (B, H_q, N_q) (lse_out may be null). p.o and p.lse are ignored.
// A row with no visible key gets O = 0 and LSE = -inf (LSE = its sink with sinks). Head dims up
// to 256. The score modifications (softcap, ALiBi, sinks) as the CPU reference applies them, the
// device arrays read from p.
Status gpu_reference(const AttentionParams& p, float* o_out, float* lse_out, cudaStream_t stream);

}  // namespace fa
