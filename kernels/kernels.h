// The production kernels' registry numbers. They register beside the steps (one registry, one
// validation, one tuner), numbered above every step so that a step number never collides with
// them; the lessons never include this layer.
#pragma once

#include <vector>

#include "fa/registry.h"

namespace fa::kernels {

/// The forward on mma.sync (kernels/fwd_mma.cu), generalised from step 10.
constexpr int kProductionMma = 100;
/// The forward on Hopper (kernels/fwd_hopper.cu, sm_90a), generalised from step 16.
constexpr int kProductionHopper = 101;
/// The decode kernel's tuner (kernels/fwd_decode.cu, from step 28): not registered as a step of its
/// own; kernels 100 and 101 hand it the calls it is for.
constexpr int kProductionDecode = 102;

namespace decode {
/// The element types the decode kernel is compiled for: the production forwards' (bf16, and fp16
/// where the build compiles it: FA_DTYPES), so that every call of theirs it takes runs on it.
std::vector<DType> dtypes();
/// Whether the decode kernel takes call p: head dim 64 or 128, and packed sequences (cu_seqlens; any
/// length unless the calling kernel reads them itself, `prefill_varlen`: then those with
/// N_q·(H_q / H_kv) <= 64), or N_q·(H_q / H_kv) <= 64 (a group's rows fit one tile) with a workspace
/// (it can split the keys), a length per sequence (seqlens_kv) or a block table (a paged cache),
/// which only it reads, or B·H_kv blocks that fill the GPU without splitting.
bool accepts(const AttentionParams& p, bool prefill_varlen = false);
/// GQA-packed split-KV attention (validated params; the split from num_splits and the workspace).
Status forward(const AttentionParams& p, cudaStream_t stream);
/// What kernels 100 and 101 say they run for call p: the decode kernel's configuration when it takes
/// p, else `prefill` (their own tuner's description of p).
std::string describe(const AttentionParams& p, const std::string& prefill, bool prefill_varlen = false);
/// What kernels 100 and 101 do first: the decode kernel runs the calls it takes (*taken = true);
/// a split or lengths per sequence asked of a call it does not take are refused, and packed
/// sequences unless the caller reads them (`prefill_varlen`); anything else is the caller's.
Status route(const AttentionParams& p, cudaStream_t stream, bool* taken, bool prefill_varlen = false);
}  // namespace decode

namespace bwd {
/// The production backward on mma.sync (kernels/bwd_mma.cu, generalised from step 23): the
/// mma.sync production kernel's backward, on any sm_80+ GPU.
Status backward(const BackwardParams& bp, cudaStream_t stream);
/// What it supports: the forward's common capabilities and the deterministic mode.
Capabilities backward_caps();
}  // namespace bwd

namespace bwd_hopper {
/// The production backward on Hopper (kernels/bwd_hopper.cu, sm_90a, generalised from step 24):
/// the Hopper production kernel's backward.
Status backward(const BackwardParams& bp, cudaStream_t stream);
/// What it supports: the forward's common capabilities, the deterministic mode, sm_90 only.
Capabilities backward_caps();
}  // namespace bwd_hopper

}  // namespace fa::kernels
