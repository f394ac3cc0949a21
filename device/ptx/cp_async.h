// cp.async: copies global → shared memory without passing through registers, asynchronously
// (PTX `cp.async.cg.shared.global`, sm_80+; shows up as LDGSTS in SASS). A thread issues copies,
// closes them into a "group" with commit, and later waits until at most N of its groups are
// still in flight. That is what lets a kernel load tile j+1 while it computes on tile j.
//
// Two rules the kernels rely on:
//  - wait_group only covers the calling thread's own copies. Other threads' copies become visible
//    after every thread has waited AND a __syncthreads() has passed.
//  - a copy with `valid == false` reads nothing and writes 16 zero bytes, so rows past the end of
//    a tensor arrive as zeros (never stale or NaN data), without a branch around the copy.
#pragma once

#include <cstdint>

namespace fa::ptx {

#if defined(__CUDACC__)

/// Copies 16 bytes from `gmem` to shared address `smem_addr`, or writes 16 zeros when !valid.
/// Both addresses must be 16-byte aligned. `.cg` caches in L2 only: each tile is read once per
/// block, so L1 would only be polluted.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes)
               : "memory");
}

/// Copies 4 bytes from `gmem` to shared address `smem_addr`, or writes 4 zeros when !valid: for
/// arrays of one float per row, whose rows need not start 16-byte aligned. `.ca` (the only caching
/// a copy under 16 bytes may ask for).
__device__ __forceinline__ void cp_async_4(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes) : "memory");
}

/// Closes all copies issued since the previous commit into one group.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/// Blocks until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif  // __CUDACC__

}  // namespace fa::ptx
