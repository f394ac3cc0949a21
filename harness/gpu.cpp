#include "harness/gpu.h"

#include <cuda_runtime_api.h>

#include <sstream>

namespace fa {

bool gpu_available(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why)
      *why =
          std::string("no CUDA GPU available (") + (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + ")";
    cudaGetLastError();  // clear the sticky-free error so later checks start clean
    return false;
  }
  return true;
}

std::string gpu_name() {
  if (!gpu_available()) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "";
  return prop.name;
}

int gpu_sm_clock_mhz() {
  int khz = 0;
  if (!gpu_available() || cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) != cudaSuccess) return 0;
  return khz / 1000;
}

std::string gpu_description() {
  if (!gpu_available()) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "";
  std::ostringstream os;
  os << prop.name << ", sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount << " SMs, max SM clock "
     << gpu_sm_clock_mhz() << " MHz";
  return os.str();
}

}  // namespace fa
