// What every production kernel's host side shares: the head dims and element types this build compiles, the softmax
// scale in exp2 units, and the tuner's configuration list built from a kernel's Config types. The
// lessons spell these out in each step; the production kernels take them from here.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "fa/params.h"
#include "fa/registry.h"
#include "library/launch_limits.h"
#include "library/tuner.h"

// The head dims this build instantiates the production kernels for: CMake's FA_HEAD_DIMS, passed
// as FA_KERNEL_HEAD_DIM_MASK, bit d/8 set for head dim d (a list would not survive nvcc, which
// splits -D values at commas). A configuration at any other head dim is not compiled.
#ifndef FA_KERNEL_HEAD_DIM_MASK
#define FA_KERNEL_HEAD_DIM_MASK ((1ull << (64 / 8)) | (1ull << (128 / 8)))
#endif

// The element types this build instantiates the production kernels for (both forwards, the decode
// kernel, both backwards): CMake's FA_DTYPES, passed as FA_KERNEL_DTYPE_MASK, bit t set for DType
// value t (bf16 = 0 always: the lessons are bf16). An fp16 kernel is not compiled without bit 1.
#ifndef FA_KERNEL_DTYPE_MASK
#define FA_KERNEL_DTYPE_MASK (1u << 0)
#endif

namespace fa::kernels {

/// Whether this build compiles the production kernels at head dim `d`.
constexpr bool head_dim_built(int d) {
  return d > 0 && d % 8 == 0 && d / 8 < 64 && ((uint64_t(FA_KERNEL_HEAD_DIM_MASK) >> (d / 8)) & 1) != 0;
}

/// Whether this build compiles the production forwards for element type `t`.
constexpr bool dtype_built(DType t) {
  return int(t) >= 0 && int(t) < 32 && ((unsigned(FA_KERNEL_DTYPE_MASK) >> int(t)) & 1u) != 0;
}

/// The launchers' one dispatch on the element type: `launch.template operator()<T>()` with T = Fp16
/// for an fp16 call where the build compiles fp16, else Bf16 (validation has refused every type the
/// build left out), e.g. `with_element_type<bf16, fp16>(p.dtype, [&]<typename T>() { ... })`.
template <typename Bf16, typename Fp16, typename Launch>
Status with_element_type(DType dtype, Launch&& launch) {
  if constexpr (dtype_built(DType::fp16))
    if (dtype == DType::fp16) return launch.template operator()<Fp16>();
  return launch.template operator()<Bf16>();
}

/// The element types this build compiles the production forwards for (their Capabilities::dtypes).
inline std::vector<DType> built_dtypes() {
  std::vector<DType> out;
  for (DType t : {DType::bf16, DType::fp16})
    if (dtype_built(t)) out.push_back(t);
  return out;
}

/// Of the head dims a kernel implements, those this build compiles (its Capabilities::head_dims).
inline std::vector<int> built_head_dims(std::initializer_list<int> implemented) {
  std::vector<int> out;
  for (int d : implemented)
    if (head_dim_built(d)) out.push_back(d);
  return out;
}

/// What every production forward supports: the head dims this build compiles of those it
/// implements, causal (both alignments), LSE, GQA, on tensor cores, with 32-bit row indices and
/// B·H_q over a grid's y and z (a kernel adds what is its own: TMA limits, a GPU, a work counter).
inline Capabilities forward_caps(std::initializer_list<int> implemented_head_dims) {
  Capabilities c;
  c.head_dims = built_head_dims(implemented_head_dims);
  c.causal = true;
  c.lse = true;
  c.gqa = true;
  c.tensor_cores = true;
  c.max_seqlen = kTileMaxSeqlen;
  c.max_batch_heads = kTileMaxBatchHeads;
  return c;
}

/// log2(e): e^x = 2^(x · log2 e), so the kernels' exp2 takes the softmax scale times this, and an
/// LSE in exp2 units is the natural one times this.
constexpr float kLog2e = 1.4426950408889634f;

/// P = 2^(scale_log2 · (s − m)): the call's softmax scale times log2(e).
inline float scale_log2(const AttentionParams& p) {
  return p.effective_scale() * kLog2e;
}

/// The tuner's entry for configuration `Cfg` at `HEAD_DIM` (BLOCK_M, BLOCK_N, NUM_WARPS, STAGES and
/// smem_bytes<HEAD_DIM>() from Cfg), launched by `launch`; `variant` names what else tells it apart.
template <int HEAD_DIM, typename Cfg>
tuner::KernelConfig kernel_config(tuner::LaunchFn launch, std::string variant = {}) {
  return {HEAD_DIM, Cfg::BLOCK_M,      Cfg::BLOCK_N, Cfg::NUM_WARPS, Cfg::STAGES, Cfg::template smem_bytes<HEAD_DIM>(),
          launch,   std::move(variant)};
}

/// An entry of a configuration list: Cfg at HEAD_DIM.
template <int HEAD_DIM, typename Cfg>
struct At {};

template <typename Launcher, int HEAD_DIM, typename Cfg>
void add_config(std::vector<tuner::KernelConfig>& list) {
  if constexpr (head_dim_built(HEAD_DIM))
    list.push_back(kernel_config<HEAD_DIM, Cfg>(&Launcher::template launch<HEAD_DIM, Cfg>, Cfg::VARIANT));
}

/// A kernel's configuration list, `configs<Launcher>(At<64, Config<...>>{}, ...)` in order of
/// preference: each entry launched by `Launcher::launch<HEAD_DIM, Cfg>` and named with
/// `Cfg::VARIANT` besides its sizes. An entry at a head dim the build leaves out is not compiled.
template <typename Launcher, int... HEAD_DIM, typename... Cfg>
std::vector<tuner::KernelConfig> configs(At<HEAD_DIM, Cfg>...) {
  std::vector<tuner::KernelConfig> list;
  (add_config<Launcher, HEAD_DIM, Cfg>(list), ...);
  return list;
}

}  // namespace fa::kernels
