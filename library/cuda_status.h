// Turning CUDA errors into a Status: the library never throws across its API, so every CUDA call
// of a launcher is checked and a failure becomes an error Status that names the call and the place.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "fa/params.h"

namespace fa {

inline std::string cuda_error_string(cudaError_t err, const char* what, const char* file, int line) {
  return std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " + cudaGetErrorName(err) + " (" +
         cudaGetErrorString(err) + ")";
}

}  // namespace fa

// Library code: turn a CUDA error into an error Status and return it.
#define FA_CUDA_RETURN(call)                                                                   \
  do {                                                                                         \
    cudaError_t fa_err_ = (call);                                                              \
    if (fa_err_ != cudaSuccess)                                                                \
      return ::fa::Status::Error(::fa::cuda_error_string(fa_err_, #call, __FILE__, __LINE__)); \
  } while (0)

// After every kernel launch: a bad launch configuration shows up here, not three calls later.
#define FA_LAUNCH_RETURN() FA_CUDA_RETURN(cudaGetLastError())
