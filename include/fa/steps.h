/// @file steps.h
/// @brief Direct entry points of every step. Most callers go through the registry instead.
#pragma once

#include <cuda_runtime_api.h>

#include "fa/params.h"

/// @brief Step 00: naive attention with the full score matrix in global memory.
namespace fa::step00 {
/// @brief Runs step 00 on `stream`; validates first and writes nothing on bad input.
Status forward(const AttentionParams& params, cudaStream_t stream);
}  // namespace fa::step00

/// @brief Step 01: one fused kernel; each query row streams over the keys with the online-softmax
/// recurrence (running max, sum and output in fp32), so no N_q × N_kv buffer exists.
namespace fa::step01 {
/// @brief Runs step 01 on `stream`; validates first and writes nothing on bad input.
Status forward(const AttentionParams& params, cudaStream_t stream);
}  // namespace fa::step01

/// @brief Step 02: FlashAttention-1; K/V tiles in shared memory, KV loop outside and Q loop
/// inside, the running O, m and l kept in an fp32 global-memory workspace.
namespace fa::step02 {
/// @brief Runs step 02 on `stream`; validates first and writes nothing on bad input.
Status forward(const AttentionParams& params, cudaStream_t stream);
}  // namespace fa::step02

/// @brief Step 03: FlashAttention-2; one block per (Q tile, batch·head), the running state in
/// registers, one deferred division by l.
namespace fa::step03 {
/// @brief Runs step 03 on `stream`; validates first and writes nothing on bad input.
Status forward(const AttentionParams& params, cudaStream_t stream);
}  // namespace fa::step03

/// @brief Step 04: FlashAttention-2 forward on tensor cores (mma.sync bf16, fp32 accumulate),
/// ldmatrix, cp.async double buffering; no causal mask, no LSE.
namespace fa::step04 {
/// @brief Where the softmax scale is applied (the experiment of step 04's lesson).
enum class ScalePlacement {
  q_bf16,       ///< (a) Q multiplied by the scale and rounded to bf16 before the loop
  scores_fp32,  ///< (b) the fp32 scores multiplied by the scale, then exp2(log2(e)·(s − m))
  folded_exp2,  ///< (c) exp2(c·s − c·m) with c = log2(e)·scale: one FFMA per score (the default)
};
/// @brief Runs step 04 on `stream`; validates first and writes nothing on bad input.
Status forward(const AttentionParams& params, cudaStream_t stream);
/// @brief Runs step 04 with the scale applied at `placement`; `forward` is `folded_exp2`.
Status forward_with_scale_placement(const AttentionParams& params, ScalePlacement placement, cudaStream_t stream);
}  // namespace fa::step04
