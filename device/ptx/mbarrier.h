// Shared-memory barriers with transaction counts (sm_90): the completion signal of the tensor
// memory accelerator's copies, and the full/empty handshake between producer and consumer warps.
//
// An mbarrier is a 64-bit word in shared memory. It is initialised with an expected arrival
// count; a phase completes when that many arrivals have happened AND the transaction count it was
// told to expect (bytes, for TMA copies: arrive_expect_tx) has been delivered. Phases alternate
// 0, 1, 0, ...: a waiter names the parity of the phase it waits for, and waiting on the parity of
// the phase before the current one returns at once. Getting the parity wrong therefore does not
// hang on the first use, it returns early, before the data is there (step 12's mutant
// bugs/wrong_phase_parity.patch).
//
// A ring slot used for the k-th time (k = 0, 1, ...) completes phase k of its barrier: its
// consumers wait for parity k % 2.
#pragma once

#include <cstdint>

#include "device/ptx/sm90.h"

namespace fa::ptx {

#if defined(__CUDACC__)

/// Initialises the barrier at shared address `bar` for `count` arrivals per phase. One thread
/// does it, then a fence (fence_mbarrier_init) and a block barrier before anyone uses it.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  FA_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/// Makes barrier initialisations visible to the async proxy (the TMA unit) and the cluster.
__device__ __forceinline__ void fence_mbarrier_init() {
  FA_SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/// One arrival, and `bytes` more transaction bytes expected in the current phase (the producer's
/// call before it issues the copies that will deliver them).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  FA_SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/// One plain arrival (a consumer releasing a buffer).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  FA_SM90_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/// Blocks until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  FA_SM90_ASM(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

#endif  // __CUDACC__

}  // namespace fa::ptx
