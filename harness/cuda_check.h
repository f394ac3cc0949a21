// Checking every CUDA call in the harness (tests, CLI, benchmark): a failure throws, and the test
// or the CLI reports it. The library's launchers return a Status instead (library/cuda_status.h).
#pragma once

#include <stdexcept>

#include "library/cuda_status.h"

#define FA_CUDA_CHECK(call)                                                                                            \
  do {                                                                                                                 \
    cudaError_t fa_err_ = (call);                                                                                      \
    if (fa_err_ != cudaSuccess) throw std::runtime_error(::fa::cuda_error_string(fa_err_, #call, __FILE__, __LINE__)); \
  } while (0)
