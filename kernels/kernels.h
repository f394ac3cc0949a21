// The production kernels' registry numbers. They register beside the steps (one registry, one
// validation, one tuner), numbered above every step so that a step number never collides with
// them; the lessons never include this layer.
#pragma once

namespace fa::kernels {

/// The forward on mma.sync (kernels/fwd_mma.cu), generalised from step 10.
constexpr int kProductionMma = 100;
/// The forward on Hopper (kernels/fwd_hopper.cu, sm_90a), generalised from step 16.
constexpr int kProductionHopper = 101;

}  // namespace fa::kernels
