// What the Hopper wrappers share: the guards that keep sm_90 and sm_90a instructions out of code
// for older targets, and the fence between the two proxies that write and read shared memory.
//
//   FA_SM90_ASM(...)   an instruction of sm_90 and later (mbarrier transaction counts, TMA, the
//                      proxy fence)
//   FA_SM90A_ASM(...)  an instruction of the sm_90a target alone (wgmma, setmaxnreg)
//
// Compiled for an older or plainer target, a guarded wrapper traps instead: a file that includes
// one of these headers by mistake still builds, and fails loudly if it ever runs. The Hopper steps
// are built for sm_90a alone (their step.cmake); host passes see the asm and never compile it.
#pragma once

#if defined(__CUDACC__)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FA_SM90_ASM(...) __trap()
#else
#define FA_SM90_ASM(...) asm volatile(__VA_ARGS__)
#endif

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_SM90A_ASM(...) __trap()
#else
#define FA_SM90A_ASM(...) asm volatile(__VA_ARGS__)
#endif

namespace fa::ptx {

/// Orders this thread's ordinary (generic-proxy) shared-memory writes, cp.async copies included,
/// before later reads of the same memory by the async proxy (wgmma operands, TMA). Each writing
/// thread issues it, then the block barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
  FA_SM90_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/// Orders this thread's global-memory accesses of one proxy against its later ones of the other:
/// between a bulk reduce's completion (async proxy) and a release store that publishes it, and
/// between an acquire and the bulk reduce that must come after it (step 26's deterministic mode).
__device__ __forceinline__ void fence_proxy_async_global() {
  FA_SM90_ASM("fence.proxy.async.global;\n" ::: "memory");
}

/// A barrier for `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is
/// __syncthreads'): one warpgroup waits for its own four warps, the rest of the block runs on.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// Arrives on hardware barrier `id` for `threads` threads without waiting: the producer's half of
/// a one-way handshake whose consumers call named_barrier_sync with the same count (step 36: one
/// warpgroup's stores, read next by the other's).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace fa::ptx

#endif  // __CUDACC__
