// Ordering between blocks through global memory (sm_70+): one thread of a block waits for a flag
// another block sets, with the PTX memory model's acquire and release; and between two kernels of
// a stream (sm_90+): programmatic dependent launch.
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

/// Programmatic dependent launch (sm_90+), between two kernels of one stream, the second launched
/// with cudaLaunchAttributeProgrammaticStreamSerialization: the second may start while the first
/// still runs, and waits here until the first has finished and its writes are visible. What a
/// thread does before the wait must not read the first kernel's results. No-op below sm_90, where
/// the launch attribute is not given (the stream orders the kernels as usual).
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/// The first kernel's side: once every block of the grid has called it (or exited), the dependent
/// kernel may be launched. It orders nothing: the dependent's wait_for_prior_grid() still waits for
/// the whole grid to finish.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

#endif  // __CUDACC__

}  // namespace fa::ptx
