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
