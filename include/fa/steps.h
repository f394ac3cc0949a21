/// @file steps.h
/// @brief Direct entry points of every step. Most callers go through the registry instead.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

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

/// @brief Step 05: step 04 plus the causal mask (top-left or bottom-right aligned): applied before
/// the row max with -inf, the KV loop ends at the diagonal, only diagonal tiles are masked.
namespace fa::step05 {
/// @brief Runs step 05 on `stream`; validates first and writes nothing on bad input.
Status forward(const AttentionParams& params, cudaStream_t stream);
}  // namespace fa::step05

/// @brief Step 06: step 05 with a compile-time list of kernel configurations and a run-time
/// tuner that times them once per problem key and caches the winner (FA_AUTOTUNE,
/// FA_AUTOTUNE_CACHE; see common/autotune.h).
namespace fa::step06 {
/// @brief Runs step 06 on `stream`; validates first and writes nothing on bad input. The first
/// call for a new problem key times every configuration on scratch outputs and synchronises
/// `stream`; later calls reuse the cached choice.
Status forward(const AttentionParams& params, cudaStream_t stream);
/// @brief The tuning-cache key of `params`: shape, GPU and this build's id, as one line of text.
std::string tuning_key(const AttentionParams& params);
/// @brief The id of this build of step 06's kernels (part of every tuning key).
std::string build_id();
/// @brief Names of the compiled configurations for `head_dim` (empty if unsupported).
std::vector<std::string> config_names(int head_dim);
/// @brief Runs one named configuration, bypassing the tuner (for tests and experiments).
Status forward_with_config(const AttentionParams& params, const std::string& config, cudaStream_t stream);
}  // namespace fa::step06

/// @brief Step 07: step 06 plus the log-sum-exp per query row, LSE = scale·m + log(l) (fp32,
/// natural log, -inf for a row that sees no key), written to `params.lse` when it is non-null.
namespace fa::step07 {
/// @brief Runs step 07 on `stream`; validates first and writes nothing on bad input. Tunes like
/// step 06 on the first call for a new problem key.
Status forward(const AttentionParams& params, cudaStream_t stream);
/// @brief The tuning-cache key of `params`: shape, GPU and this build's id, as one line of text.
std::string tuning_key(const AttentionParams& params);
/// @brief The id of this build of step 07's kernels (part of every tuning key).
std::string build_id();
/// @brief Names of the compiled configurations for `head_dim` (empty if unsupported).
std::vector<std::string> config_names(int head_dim);
/// @brief Runs one named configuration, bypassing the tuner (for tests and experiments).
Status forward_with_config(const AttentionParams& params, const std::string& config, cudaStream_t stream);
}  // namespace fa::step07
