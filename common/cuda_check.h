// Checking every CUDA call. Two flavours: the harness throws (a test or the CLI reports it), a
// step's launcher returns a Status (the library never throws across its API).
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "fa/params.h"

namespace fa {

inline std::string cuda_error_string(cudaError_t err, const char* what, const char* file, int line) {
  return std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " + cudaGetErrorName(err) + " (" +
         cudaGetErrorString(err) + ")";
}

}  // namespace fa

// Harness code: throw on any CUDA error.
#define FA_CUDA_CHECK(call)                                                                                            \
  do {                                                                                                                 \
    cudaError_t fa_err_ = (call);                                                                                      \
    if (fa_err_ != cudaSuccess) throw std::runtime_error(::fa::cuda_error_string(fa_err_, #call, __FILE__, __LINE__)); \
  } while (0)

// Library code: turn a CUDA error into an error Status and return it.
#define FA_CUDA_RETURN(call)                                                                   \
  do {                                                                                         \
    cudaError_t fa_err_ = (call);                                                              \
    if (fa_err_ != cudaSuccess)                                                                \
      return ::fa::Status::Error(::fa::cuda_error_string(fa_err_, #call, __FILE__, __LINE__)); \
  } while (0)

// After every kernel launch: a bad launch configuration shows up here, not three calls later.
#define FA_LAUNCH_RETURN() FA_CUDA_RETURN(cudaGetLastError())
