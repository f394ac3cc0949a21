#include "library/launch_limits.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>

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
  // A block that needs more than this GPU gives one (99 KB on sm_86 and sm_89, 163 KB on sm_80,
  // 227 KB on sm_90) is an unsupported call, not a CUDA error: the library's choice then moves on
  // to a kernel that fits.
  int limit = 0;
  FA_CUDA_RETURN(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > limit)
    return Status::Unsupported("this kernel needs " + std::to_string(bytes) +
                               " bytes of shared memory per block; this GPU allows " + std::to_string(limit));
  FA_CUDA_RETURN(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  std::lock_guard<std::mutex> lock(mu);
  done.insert(key);
  return Status::Ok();
}

bool early_launch_allowed(const void* kernel) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, bool> known;  // (device, kernel)
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const auto key = std::make_pair(device, kernel);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  int major = 0;
  cudaFuncAttributes a{};
  const bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                   major >= 9 && cudaFuncGetAttributes(&a, kernel) == cudaSuccess && a.ptxVersion >= 90;
  cudaGetLastError();  // a failed query leaves no error behind: the kernel is then launched in order
  std::lock_guard<std::mutex> lock(mu);
  known[key] = yes;
  return yes;
}

Status resident_blocks(const void* kernel, int threads, int smem_bytes, int* blocks) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int>, int> known;  // (device, kernel, threads, smem)
  int device = 0;
  FA_CUDA_RETURN(cudaGetDevice(&device));
  const auto key = std::make_tuple(device, kernel, threads, smem_bytes);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(key); it != known.end()) {
      *blocks = it->second;
      return Status::Ok();
    }
  }
  int per_sm = 0, sms = 0;
  FA_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  FA_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (per_sm < 1) return Status::Unsupported("this kernel configuration does not fit on one SM of this GPU");
  *blocks = per_sm * sms;
  std::lock_guard<std::mutex> lock(mu);
  known[key] = *blocks;
  return Status::Ok();
}

}  // namespace fa
