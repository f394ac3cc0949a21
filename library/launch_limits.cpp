#include "library/launch_limits.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <set>
#include <tuple>

#include "library/cuda_status.h"

namespace fa {

Status opt_in_shared_memory(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::set<std::tuple<int, const void*, int>> done;  // (device, kernel, bytes) already set
  int device = 0;
  FA_CUDA_RETURN(cudaGetDevice(&device));
  const auto key = std::make_tuple(device, kernel, bytes);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done.count(key)) return Status::Ok();
  }
  FA_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  std::lock_guard<std::mutex> lock(mu);
  done.insert(key);
  return Status::Ok();
}

}  // namespace fa
