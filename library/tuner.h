// The tuner a step calls (step 06 on): it hands over its compiled kernel configurations once, and
// each forward call is one `tuner.run(params, stream)`.
//
// What run() does, per call:
//   1. The problem key (library/autotune.h: shape, head counts, layout class, causal alignment,
//      LSE, GPU, the build id of the step's kernels) is looked up in an in-memory cache: a
//      hit costs a hash-map lookup and the launch (the lesson of step 06 has the measured cost).
//   2. On a miss, with FA_AUTOTUNE unset or 1 and the stream not being captured: every config that
//      fits this GPU is timed on scratch outputs (never the caller's O or LSE) and the fastest is
//      cached in memory and in the cache file. This first call synchronises `stream` and allocates
//      its scratch with cudaMallocAsync on it. Large problems are timed on a slice of their
//      (batch, head) pairs, so the first call's tuning time stays bounded (kTuneBudgetFlops).
//   3. With FA_AUTOTUNE=0, while the stream is being captured into a CUDA graph, or when tuning is
//      impossible, the shape-aware heuristic (`heuristic`) picks a config without timing anything.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "fa/params.h"

namespace fa::tuner {

/// Launches one compiled configuration. The params are already validated.
using LaunchFn = Status (*)(const AttentionParams& params, cudaStream_t stream);

/// One compiled kernel configuration of a tuned step.
struct KernelConfig {
  int head_dim = 0;    ///< the head dim it is compiled for
  int block_m = 0;     ///< query rows per block
  int block_n = 0;     ///< keys per K/V tile
  int num_warps = 0;   ///< warps per block
  int stages = 0;      ///< K/V tiles in flight (0: the step has no pipeline)
  int smem_bytes = 0;  ///< dynamic shared memory per block
  LaunchFn launch = nullptr;
  /// "BLOCK_M=64 BLOCK_N=64 warps=4" (plus " stages=S" for a pipelined step): the config's name in
  /// the cache file, in test names and in `fa2 run`'s output.
  std::string name() const;
};

/// A problem's FLOPs past which the tuner times a slice of the (batch, head) pairs instead of the
/// whole problem: about 10 ms per timed run at 500 TFLOP/s.
constexpr double kTuneBudgetFlops = 5e12;

class Tuner {
 public:
  /// `configs` in order of preference per head dim: the heuristic's tie-break. `build_id`
  /// identifies what was compiled (the build system passes a hash of the step's sources and
  /// flags as FA_BUILD_ID); it is part of every key, so a rebuilt kernel never reuses old timings.
  /// Registers the tuner under `step` for find_tuner.
  Tuner(int step, std::string build_id, std::vector<KernelConfig> configs);

  /// Chooses a config for `params` (cache, tuning or heuristic, see above) and launches it.
  Status run(const AttentionParams& params, cudaStream_t stream) const;

  /// The config the heuristic picks: among those for the head dim that fit this GPU, the first in
  /// preference order whose grid has at least two blocks per SM; if none has, the one with the
  /// most blocks (small problems are limited by how many SMs they fill). nullptr if none fits.
  const KernelConfig* heuristic(const AttentionParams& params) const;

  /// Names of the configs compiled for `head_dim`, in preference order.
  std::vector<std::string> config_names(int head_dim) const;
  /// Runs the named config, bypassing the choice (tests and experiments). An error if there is no
  /// such config or it does not fit this GPU's shared memory ("needs more shared memory").
  Status run_config(const AttentionParams& params, const std::string& name, cudaStream_t stream) const;
  /// The cache key of `params`, as one line of text.
  std::string key(const AttentionParams& params) const;
  /// What run() would use for `params` now: "<name> (tuned)", "... (heuristic, FA_AUTOTUNE=0)", ...
  std::string describe(const AttentionParams& params) const;
  const std::string& build_id() const { return build_id_; }
  int step() const { return step_; }

 private:
  const KernelConfig* choose(const AttentionParams& params, cudaStream_t stream) const;
  const KernelConfig* tune(const AttentionParams& params, const std::string& key, cudaStream_t stream) const;
  std::vector<const KernelConfig*> fitting(int64_t head_dim) const;

  int step_;
  std::string build_id_;
  std::vector<KernelConfig> configs_;
};

/// The tuner of step `step`, or nullptr if the step has none.
const Tuner* find_tuner(int step);

}  // namespace fa::tuner
