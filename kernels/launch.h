// What every production kernel's host side shares: the softmax scale in exp2 units, and a tuner
// entry built from a kernel's Config type. The lessons spell these out in each step; the
// production kernels take them from here.
#pragma once

#include <string>

#include "fa/params.h"
#include "library/tuner.h"

namespace fa::kernels {

/// P = 2^(scale_log2 · (s − m)): the call's softmax scale times log2(e).
inline float scale_log2(const AttentionParams& p) {
  constexpr float kLog2e = 1.4426950408889634f;
  return p.effective_scale() * kLog2e;
}

/// The tuner's entry for configuration `Cfg` at `HEAD_DIM` (BLOCK_M, BLOCK_N, NUM_WARPS, STAGES and
/// smem_bytes<HEAD_DIM>() from Cfg), launched by `launch`; `variant` names what else tells it apart.
template <int HEAD_DIM, typename Cfg>
tuner::KernelConfig kernel_config(tuner::LaunchFn launch, std::string variant = {}) {
  return {HEAD_DIM, Cfg::BLOCK_M,      Cfg::BLOCK_N, Cfg::NUM_WARPS, Cfg::STAGES, Cfg::template smem_bytes<HEAD_DIM>(),
          launch,   std::move(variant)};
}

}  // namespace fa::kernels
