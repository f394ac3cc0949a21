/// @file registry.h
/// @brief The list of course steps. Each step registers itself, so the CLI, the tests and the
/// benchmark iterate over every step without per-step code.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "fa/params.h"

namespace fa {

/// @brief What a step supports. Inputs outside this set are refused with a clear `Status`.
struct Capabilities {
  std::vector<int> head_dims{64, 128};  ///< head dims the step is compiled for
  /// Element types of Q, K, V and O (AttentionParams::dtype) the step is compiled for: bf16 for
  /// every lesson; the production forwards add fp16 where the build compiles it (FA_DTYPES).
  std::vector<DType> dtypes{DType::bf16};
  bool causal = false;        ///< supports `AttentionParams::causal`
  bool lse = false;           ///< writes `AttentionParams::lse` when it is non-null
  bool gqa = true;            ///< supports H_kv < H_q
  bool tensor_cores = false;  ///< its matmuls run on tensor cores (informational)
  /// Largest element count of any one tensor the step indexes correctly (0: no limit).
  int64_t max_tensor_elements = 0;
  /// Largest N_q and N_kv the step's kernels index (0: no limit), e.g. 32-bit row indices.
  int64_t max_seqlen = 0;
  /// Largest B·H_q the step's grid spreads (0: no limit).
  int64_t max_batch_heads = 0;
  /// Largest number of work tiles, B·H_q·⌈N_q / work_tile_rows⌉, the step numbers (0: no limit):
  /// a grid of one block per tile, or a persistent grid's 32-bit tile counter.
  int64_t max_work_tiles = 0;
  /// Query rows of one work tile for `max_work_tiles`: the smallest BLOCK_M of the step's configs,
  /// so that the check holds whichever the tuner picks.
  int work_tile_rows = 1;
  /// Its tensors are read (or written) through TMA tensor maps: sizes are 32-bit coordinates there,
  /// strides 40-bit byte counts, so validate refuses sizes past 2^31 − 1 and strides past 2^39 − 8.
  bool tma = false;
  /// Accepts a zero stride on an input dimension longer than 1 (one K/V shared by every batch
  /// entry, say). The TMA steps do not: their tensor maps step every dimension they index.
  bool broadcast = true;
  /// The one compute capability (major · 10 + minor) the step's kernels are built for, e.g. 90
  /// for the sm_90a instructions of Hopper (wgmma); 0: every GPU the build targets.
  int only_sm = 0;
  /// Its backward honours BackwardParams::deterministic (bitwise-identical gradients run to run).
  bool deterministic_backward = false;
  /// The head dims its backward has, where they are fewer than the forward's (Part VI's production
  /// kernels, built with FA_HEAD_DIMS=all); empty: every one of head_dims.
  std::vector<int> backward_head_dims;
  /// Splits the keys across blocks when asked (AttentionParams::num_splits > 1, or 0 with a
  /// workspace): Part V's split-KV forward.
  bool split_kv = false;
  /// Takes a length per sequence (AttentionParams::seqlens_kv): Part V's ragged KV caches.
  bool seqlens_kv = false;
  /// Reads K and V through a block table (AttentionParams::block_table): Part V's paged KV cache.
  bool paged_kv = false;
  /// Takes packed sequences of different lengths (AttentionParams::cu_seqlens_q, cu_seqlens_kv).
  bool varlen = false;
  /// Appends new keys and values to the cache in the call (AttentionParams::k_new, v_new).
  bool kv_append = false;
  /// Takes a sliding window (AttentionParams::window_left, window_right), in the forward.
  bool sliding_window = false;
  /// Takes AttentionParams::softcap > 0 (Part VI's score modifications, params.h).
  bool softcap = false;
  /// Takes AttentionParams::alibi_slopes.
  bool alibi = false;
  /// Takes AttentionParams::sinks.
  bool sinks = false;
  /// Where split-KV, lengths per sequence and paged caches are a decode kernel's (the production forwards): only
  /// for calls with N_q·H_q/H_kv at most this many query rows per KV head. 0: any call.
  int64_t decode_max_packed_rows = 0;
  /// Where those options are a decode kernel's (decode_max_packed_rows > 0): the element types it
  /// is compiled for. A call of another of `dtypes` that asks for split-KV, a length per sequence or
  /// a paged cache is refused by name. Empty: all of `dtypes`.
  std::vector<DType> decode_dtypes;
};

/// @brief Signature of every step's forward function. Runs asynchronously on `stream`.
using ForwardFn = Status (*)(const AttentionParams& params, cudaStream_t stream);

/// @brief Signature of a step's backward function (steps that teach or carry the backward).
using BackwardFn = Status (*)(const BackwardParams& params, cudaStream_t stream);

/// @brief One registered step.
struct StepInfo {
  int number = -1;              ///< the NN of steps/NN_name
  std::string name;             ///< the folder name without the number, e.g. "naive"
  int base = -1;                ///< the step it grew from (scripts/diff_steps.sh NN diffs against it); -1 for none
  std::string lesson;           ///< one line: what this step teaches
  Capabilities caps;            ///< what it supports
  ForwardFn forward = nullptr;  ///< the step's forward function
  /// Its one kernel configuration, e.g. "BLOCK_M=64 BLOCK_N=64 warps=4"; empty for a tuned step,
  /// whose configuration depends on the problem (see describe_config).
  std::string config;
  BackwardFn backward = nullptr;  ///< the step's backward, or nullptr: it has none
  /// What runs call p, where its own tuner does not say: a production forward hands decode calls to
  /// the decode kernel. nullptr: the tuner's choice (or `config`) describes it (describe_config).
  std::string (*describe)(const AttentionParams& params) = nullptr;
};

/// @brief All registered steps, sorted by number.
const std::vector<StepInfo>& steps();

/// @brief The step with this number, or nullptr.
const StepInfo* find_step(int number);

/// @brief "unknown step N; registered steps: 0 1 ...": the one message every entry point gives for
/// a step number that is not registered.
std::string unknown_step_message(int number);

/// @brief The library's choice for `params` on the current GPU: the fastest kernel that accepts it
/// (the highest-numbered one that validates, GPU check included: the production kernels, numbered
/// 100 on, before the steps). The one dispatcher behind
/// FA_STEP_AUTO in the C interface and `step=None` in the package.
/// @return Ok and `*number`; or, when no step accepts `params`, the most general step's refusal.
Status choose_step(const AttentionParams& params, int* number);

/// @brief Runs the library's choice (`choose_step`) on `params`. A step that refuses at launch
/// (its configurations do not fit this GPU) hands over to the next. `*number` gets the step that ran.
Status forward_auto(const AttentionParams& params, cudaStream_t stream, int* number);

/// @brief The backward's library choice: the highest-numbered step with a backward that accepts
/// `params` runs it; `*number` gets that step. With none: the last refusal.
Status backward_auto(const BackwardParams& params, cudaStream_t stream, int* number);

/// @brief Runs `forward` of step `number`; an unknown step gives an error `Status`.
Status run_step(int number, const AttentionParams& params, cudaStream_t stream);

/// @brief The kernel configuration step `info` uses (or would use) for `params`: its fixed
/// config, or for a tuned step the tuner's current choice and how it was made.
std::string describe_config(const StepInfo& info, const AttentionParams& params);

/// @brief Registers a step at static-initialisation time (see FA_REGISTER_STEP).
struct StepRegistrar {
  /// @brief Adds `info` to the registry.
  explicit StepRegistrar(StepInfo info);
};

/// @brief The one registration declaration of a step's attention.cu:
/// `FA_REGISTER_STEP({number, "name", base, "one-line lesson", caps, &forward, "config"});`
#define FA_REGISTER_STEP(...)                                               \
  namespace {                                                               \
  const ::fa::StepRegistrar fa_step_registrar_{::fa::StepInfo __VA_ARGS__}; \
  }

/// @brief Checks `params` against `caps` and the rules every step shares: non-null pointers, an
/// element type of the DType enum that the step is compiled for (`caps.dtypes`),
/// positive sizes whose products fit (computed in 128 bits), divisible head groups, unit dim
/// stride, 16-byte aligned rows, tensors inside the address space, an output whose elements never
/// share an address and that shares no byte with the inputs, the step's launch limits
/// (`max_seqlen`, `max_batch_heads`, `max_work_tiles`, TMA's coordinates and strides), and last
/// `check_device`. Every step's forward calls it first, and so does `fa_validate`: what it
/// accepts, forward runs. It queries the current device's compute capability (once per device)
/// for a step pinned to one GPU generation, and launches nothing.
/// @return Ok, or an Unsupported status naming the first problem and what is supported.
Status validate(const AttentionParams& params, const Capabilities& caps);

/// @brief Every rule of `validate` but the last, the GPU check: for tools that judge a call before
/// they judge the machine (the fa2 tool reports bad input the same way with or without a GPU, and
/// plans a benchmark sweep on any machine). A step's forward and the C interface use `validate`.
Status validate_input(const AttentionParams& params, const Capabilities& caps);

/// @brief The backward's rules: `validate(params.fwd, caps)` (the forward call as it was made, LSE
/// required), then dO, dQ, dK and dV as rank-4 tensors of their shapes with the same stride rules
/// (dQ, dK, dV as outputs: no overlap with each other, the inputs or the workspace), and a
/// workspace of at least backward_workspace_bytes(params.fwd) bytes, 16-byte aligned.
Status validate_backward(const BackwardParams& params, const Capabilities& caps);

/// @brief Can the current CUDA device run a step with these capabilities (`only_sm`)? The last rule
/// of `validate`, also callable alone. Without a usable CUDA device a pinned step is refused.
/// @return Ok, or an error naming the GPU's compute capability and the one the step needs.
Status check_device(const Capabilities& caps);

}  // namespace fa
