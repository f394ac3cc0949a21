// RAII device memory for the harness (tests, CLI, benchmark). Steps never allocate through this.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
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

// A device buffer with guard regions before and after its body, so that a kernel writing (or
// reading) past either end of a tensor touches memory the harness owns and watches. The whole
// allocation starts poisoned (0xFF bytes, NaN); get() is the body. guards_intact() says whether
// anything wrote a guard since the last poison().
template <typename T>
class GuardedBuffer {
 public:
  /// Guard elements on each side: 128 rows of D = 128, more than a kernel's largest tile overshoots.
  static constexpr size_t kGuard = 128 * 128;

  GuardedBuffer() = default;
  explicit GuardedBuffer(size_t count) : all_(count > 0 ? count + 2 * kGuard : 0), count_(count) { poison(); }

  T* get() const { return count_ > 0 ? all_.get() + kGuard : nullptr; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_) FA_CUDA_CHECK(cudaMemcpy(host.data(), get(), bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  /// Poisons the body and both guards.
  void poison() { all_.poison(); }
  /// True when both guards still hold the poison; otherwise `why` says where the first change is.
  bool guards_intact(std::string* why = nullptr) const {
    if (count_ == 0) return true;
    std::vector<unsigned char> g(kGuard * sizeof(T));
    const unsigned char* starts[2] = {reinterpret_cast<const unsigned char*>(all_.get()),
                                      reinterpret_cast<const unsigned char*>(get() + count_)};
    for (int side = 0; side < 2; ++side) {
      FA_CUDA_CHECK(cudaMemcpy(g.data(), starts[side], g.size(), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < g.size(); ++i)
        if (g[i] != 0xFF) {
          if (why)
            *why =
                std::string(side == 0 ? "the guard before the tensor" : "the guard after the tensor") +
                " was written: element " +
                std::to_string(side == 0 ? int64_t(i / sizeof(T)) - int64_t(kGuard) : int64_t(count_ + i / sizeof(T))) +
                " of a tensor of " + std::to_string(count_);
          return false;
        }
    }
    return true;
  }

 private:
  DeviceBuffer<T> all_;
  size_t count_ = 0;
};

}  // namespace fa
