// RAII device memory for the harness (tests, CLI, benchmark). Steps never allocate through this.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "harness/cuda_check.h"

namespace fa {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0) FA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), count_ * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFree(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  void upload(const std::vector<T>& host) {
    FA_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), std::min(host.size(), count_) * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_) FA_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  // Every byte 0xFF: a NaN in bf16 (0xFFFF) and in fp32 (0xFFFFFFFF). An element the kernel never
  // writes stays NaN and fails the comparison.
  void poison() {
    if (count_) FA_CUDA_CHECK(cudaMemset(ptr_, 0xFF, bytes()));
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

}  // namespace fa
