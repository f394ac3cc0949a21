// The production kernels' ScoreMod policies: a hook on each score tile S = Q·Kᵀ (raw, before the
// softmax scale) after the product and before the mask and the row max. A policy is a functor
// called as score_mod(s, row0, col0) on a warp's (16, N) tile whose first row is query row `row0`
// and first column key `col0`, in the fragment layout of device/warp_tile.h (wgmma's accumulators
// share it). Softcap and ALiBi are ScoreMods; Identity compiles to no instruction.
#pragma once

#include "device/warp_tile.h"

namespace fa::kernels {

struct Identity {
#if defined(__CUDACC__)
  template <int N>
  __device__ __forceinline__ void operator()(tile::Acc<N>&, int /*row0*/, int /*col0*/) const {}
#endif
};

}  // namespace fa::kernels
