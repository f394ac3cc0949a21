// The tuner a step calls (step 06 on): it hands over its compiled kernel configurations once, and
// each forward call is one `tuner.run(params, stream)`. A tuned step's attention.cu holds its
// kernels, the list of configurations and
//
//   const fa::tuner::Tuner kTuner(6, FA_BUILD_ID, {configs...});
//
// and its forward validates the params and returns `kTuner.run(params, stream)`.
//
// What run() does, per call:
//   1. The problem key (library/autotune.h: N_q, N_kv, D, B, H_q, H_kv, causal alignment, dtype,
//      layout class, LSE, GPU, the build id of the step's kernels) is built with plain string
//      appends and looked up in the tuner's in-memory map: a hit costs that and the launch.
//   2. On a miss the cache file (FA_AUTOTUNE_CACHE, shared by every tuner of the process) is
//      consulted; a config found there is remembered in memory.
//   3. Still a miss, with FA_AUTOTUNE unset or 1 and the stream not being captured into a CUDA
//      graph: every config for the head dim that fits this GPU's opt-in shared memory is timed
//      (autotune::time_candidates) and the fastest is remembered in memory and appended to the
//      cache file. The candidates write scratch outputs allocated with cudaMallocAsync on
//      `stream` (O contiguous (B, H, N, D), LSE when the call writes it), never the caller's O or
//      LSE, and the first call synchronises `stream`. A problem past kTuneBudgetFlops is timed on
//      a slice of its (batch, head) pairs (tuning_slice), so the first call's time stays bounded;
//      the result is stored under the full problem's key. A single fitting config is taken
//      without timing (and written with 0 ms). A tuner made with kv_buckets keys N_kv by its
//      power-of-two bucket: a decode's cache grows a key per call, and an exact key would tune on
//      every one (on the H200 that made a transformers model generate 34 % slower at batch 32).
//   4. With FA_AUTOTUNE=0, while the stream is being captured, or when tuning is impossible (the
//      scratch allocation fails, no candidate launches), the heuristic (pick_heuristic) chooses
//      without timing anything; that choice is not remembered, so a later call may still tune.
// The GPU's name, SM count and opt-in shared memory per block are queried once per device
// (autotune::current_device). FA_AUTOTUNE_VERBOSE=1 prints every candidate's time when a key is
// tuned.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <utility>
#include <unordered_map>
#include <vector>

#include "fa/params.h"
#include "library/autotune.h"

namespace fa::tuner {

/// Launches one compiled configuration. The params are already validated.
using LaunchFn = Status (*)(const AttentionParams& params, cudaStream_t stream);

/// One compiled kernel configuration of a tuned step.
struct KernelConfig {
  KernelConfig() = default;
  /// The steps' `config<>()` lists: every field but `variant`, which defaults to none.
  KernelConfig(int head_dim_, int block_m_, int block_n_, int num_warps_, int stages_, int smem_bytes_,
               LaunchFn launch_, std::string variant_ = {})
      : head_dim(head_dim_),
        block_m(block_m_),
        block_n(block_n_),
        num_warps(num_warps_),
        stages(stages_),
        smem_bytes(smem_bytes_),
        launch(launch_),
        variant(std::move(variant_)) {}

  int head_dim = 0;           ///< the head dim it is compiled for
  int block_m = 0;            ///< query rows per block
  int block_n = 0;            ///< keys per K/V tile
  int num_warps = 0;          ///< warps per block
  int stages = 0;             ///< K/V tiles in flight (0: the step has no pipeline)
  int smem_bytes = 0;         ///< dynamic shared memory per block
  LaunchFn launch = nullptr;  ///< runs this configuration
  /// What else tells two compiled configurations apart, when the tiles do not (e.g. where O
  /// leaves from: "O=smem" or "O=registers"); empty when nothing does. Part of the name.
  std::string variant;
  /// "BLOCK_M=64 BLOCK_N=64 warps=4" (plus " stages=S" for a pipelined step, " <variant>" when
  /// set): the config's name in the cache file, in test output and in `fa2 run`'s output. Two
  /// configurations of one head dim never share a name (the tuner refuses to run if they do).
  std::string name() const;
};

/// A problem's FLOPs past which the tuner times a slice of the (batch, head) pairs instead of the
/// whole problem: about 10 ms per timed run at 500 TFLOP/s.
constexpr double kTuneBudgetFlops = 5e12;

/// Timed rounds per tuning (each times every fitting config once, after one warm-up run each).
constexpr int kTuneRounds = 7;

/// The FLOPs the tuner budgets for one call: 4·B·H_q·N_q·N_kv·D (the two matmuls, causal or not).
double tuning_flops(const AttentionParams& params);

/// The problem the tuner times for `params`: `params` itself when within `budget_flops`; else
/// its leading batch entries (as many as fit, at least one); if one batch entry is still over,
/// its leading KV-head groups (H_kv' >= 1 of them, H_q' = H_kv'·(H_q / H_kv), so the GQA group
/// size is kept). Pointers and strides stay the caller's: the leading batch entries and heads of
/// a tensor are a valid view of it. One KV-head group still over the budget is timed as it is.
AttentionParams tuning_slice(const AttentionParams& params, double budget_flops = kTuneBudgetFlops);

/// The heuristic: among `configs` for `params.head_dim` with smem_bytes <= `smem_limit`, the first
/// in order whose grid, cdiv(N_q, block_m)·B·H_q blocks, has at least two blocks per SM
/// (2·`sm_count`); if none has, the one with the most blocks (the first of equals): a small
/// problem is limited by how many SMs it fills. nullptr if none fits.
const KernelConfig* pick_heuristic(const std::vector<KernelConfig>& configs, const AttentionParams& params,
                                   int sm_count, int smem_limit);

/// A step's compiled configurations and the choice among them (see the header comment). Thread-safe.
class Tuner {
 public:
  /// `configs` in order of preference per head dim: the heuristic's order. `build_id` identifies
  /// what was compiled (the build system passes a hash of the step's sources and flags as
  /// FA_BUILD_ID); it is part of every key, so a rebuilt kernel never reuses old timings.
  /// Registers the tuner under `step` for find_tuner, until it is destroyed.
  /// `kv_buckets`: key calls by the power of two at or above their N_kv (autotune::kv_bucketed),
  /// for a kernel whose calls' caches grow by a key at a time (the production decode kernel).
  Tuner(int step, std::string build_id, std::vector<KernelConfig> configs, bool kv_buckets = false);
  ~Tuner();
  Tuner(const Tuner&) = delete;  // find_tuner holds its address
  Tuner& operator=(const Tuner&) = delete;

  /// Chooses a config for `params` (memory, cache file, tuning or heuristic) and launches it.
  /// `params` must already be validated. An error if no config fits, or the launch's error.
  Status run(const AttentionParams& params, cudaStream_t stream) const;

  /// What the heuristic picks for `params` on the current GPU (pick_heuristic with its SM count and
  /// opt-in shared memory). nullptr if no config for the head dim fits.
  const KernelConfig* heuristic(const AttentionParams& params) const;

  /// The fewest query rows per block of any config: a persistent step's work tiles are counted
  /// with it (Capabilities::work_tile_rows), so that its limit holds whichever config runs.
  int min_block_m() const;
  /// Names of the configs compiled for `head_dim`, in preference order.
  std::vector<std::string> config_names(int head_dim) const;
  /// Runs the named config for `params.head_dim`, bypassing the choice (tests and experiments).
  /// Does not validate `params`. An error "step NN has no config '<name>' for head dim D", or, if
  /// the config does not fit this GPU, one that says it "needs more shared memory".
  Status run_config(const AttentionParams& params, const std::string& name, cudaStream_t stream) const;
  /// The cache key of `params` on the current GPU, as one line of text.
  std::string key(const AttentionParams& params) const;
  /// What run() would use for `params` now: "<name> (tuned)", "<name> (heuristic, FA_AUTOTUNE=0)"
  /// or "<name> (not tuned yet; heuristic)".
  std::string describe(const AttentionParams& params) const;
  /// The build id every key of this tuner carries.
  const std::string& build_id() const { return build_id_; }
  /// The step number it was registered under.
  int step() const { return step_; }

 private:
  const KernelConfig* choose(const AttentionParams& params, cudaStream_t stream) const;
  autotune::Key make_key(const AttentionParams& params) const;
  const KernelConfig* remembered(const autotune::Key& key, const std::string& key_text) const;
  void remember(const std::string& key_text, const KernelConfig* config) const;
  const KernelConfig* tune(const AttentionParams& params, const autotune::Key& key, cudaStream_t stream) const;
  const KernelConfig* find_config(int64_t head_dim, const std::string& name) const;
  std::vector<const KernelConfig*> fitting(int64_t head_dim) const;
  std::string step_label() const;

  int step_;
  std::string build_id_;
  std::vector<KernelConfig> configs_;
  bool kv_buckets_ = false;
  std::string duplicate_;  // "…" when two configs of one head dim share a name: every run refuses
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, const KernelConfig*> chosen_;  // key → config, this process
};

/// The tuner registered under `step` (the latest one, if several), or nullptr if the step has none.
const Tuner* find_tuner(int step);

}  // namespace fa::tuner
