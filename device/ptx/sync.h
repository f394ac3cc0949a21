// Ordering between blocks through global memory (sm_70+): one thread of a block waits for a flag
// another block sets, with the PTX memory model's acquire and release.
//
// The pattern the deterministic backward uses (a turnstile: block n may add into a row only after
// block n − 1 has):
//   waiter:  one thread spins on ld_acquire_gpu(flag) until it reads its turn, then __syncthreads():
//            every thread of the block is now ordered after the writes that preceded the release.
//   writer:  __syncthreads() (every thread's writes are done, in the block's order), then one thread
//            st_release_gpu(flag, next): those writes are visible, at GPU scope, to whoever
//            acquires the flag. The barrier makes the other threads' writes part of what it releases.
#pragma once

#include <cstdint>

namespace fa::ptx {

#if defined(__CUDACC__)

/// Loads `*flag` with acquire semantics at GPU scope: reads and writes after it in this thread (and,
/// after a barrier, in its block) are not moved before it, and see what the releasing thread saw.
__device__ __forceinline__ int ld_acquire_gpu(const int* flag) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

/// Stores `value` to `*flag` with release semantics at GPU scope: every write before it in this
/// thread (and, after a barrier, in its block) is visible to a thread that acquires the flag.
__device__ __forceinline__ void st_release_gpu(int* flag, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
}

#endif  // __CUDACC__

}  // namespace fa::ptx
