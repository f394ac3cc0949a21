// The production kernels' registry numbers. They register beside the steps (one registry, one
// validation, one tuner), numbered above every step so that a step number never collides with
// them; the lessons never include this layer.
#pragma once

#include "fa/registry.h"

namespace fa::kernels {

/// The forward on mma.sync (kernels/fwd_mma.cu), generalised from step 10.
constexpr int kProductionMma = 100;
/// The forward on Hopper (kernels/fwd_hopper.cu, sm_90a), generalised from step 16.
constexpr int kProductionHopper = 101;

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
