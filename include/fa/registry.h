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
  bool causal = false;                  ///< supports `AttentionParams::causal`
  bool lse = false;                     ///< writes `AttentionParams::lse` when it is non-null
  bool gqa = true;                      ///< supports H_kv < H_q
  bool tensor_cores = false;            ///< its matmuls run on tensor cores (informational)
  /// Largest element count of any one tensor the step indexes correctly (0: no limit).
  int64_t max_tensor_elements = 0;
};

/// @brief Signature of every step's forward function. Runs asynchronously on `stream`.
using ForwardFn = Status (*)(const AttentionParams& params, cudaStream_t stream);

/// @brief Signature of an optional hook that describes the kernel configuration a step would use
/// (or last used) for `params`, e.g. "BLOCK_M=128 BLOCK_N=64 warps=4". May return "".
using DescribeFn = std::string (*)(const AttentionParams& params);

/// @brief One registered step.
struct StepInfo {
  int number = -1;                ///< the NN of steps/NN_name
  std::string name;               ///< the folder name without the number, e.g. "naive"
  std::string lesson;             ///< one line: what this step teaches
  Capabilities caps;              ///< what it supports
  ForwardFn forward = nullptr;    ///< the step's forward function
  DescribeFn describe = nullptr;  ///< optional configuration description
};

/// @brief All registered steps, sorted by number.
const std::vector<StepInfo>& steps();

/// @brief The step with this number, or nullptr.
const StepInfo* find_step(int number);

/// @brief "unknown step N; registered steps: 0 1 ...": the one message every entry point gives for
/// a step number that is not registered.
std::string unknown_step_message(int number);

/// @brief Runs `forward` of step `number`; an unknown step gives an error `Status`.
Status run_step(int number, const AttentionParams& params, cudaStream_t stream);

/// @brief Registers a step at static-initialisation time. Each step's attention.cu defines one.
struct StepRegistrar {
  /// @brief Adds `info` to the registry.
  explicit StepRegistrar(StepInfo info);
};

/// @brief Checks `params` against `caps` and the rules every step shares (non-null pointers,
/// positive sizes, divisible head groups, unit dim stride, 16-byte aligned rows).
/// @return Ok, or an error naming the first problem and what is supported.
Status validate(const AttentionParams& params, const Capabilities& caps);

}  // namespace fa
