// The tensor memory accelerator's tile copy (sm_90): `cp.async.bulk.tensor`. One thread names a
// tensor map (library/tma.h), the box's coordinates and a shared-memory destination; the copy
// engine moves the whole box, applies the map's swizzle on the way, fills positions outside the
// tensor with zeros, and reports the bytes it delivered to an mbarrier (device/ptx/mbarrier.h),
// whose phase completes when all the bytes announced with arrive_expect_tx have landed. No
// register, no address arithmetic and no instruction of any other thread is involved.
//
// Its writes are made by the async proxy, the same proxy wgmma reads through: the mbarrier's
// completion is all the ordering a consumer needs (no fence.proxy.async, unlike cp.async).
#pragma once

#include <cstdint>

#include "device/ptx/sm90.h"

namespace fa::ptx {

#if defined(__CUDACC__)

/// Copies the box at (c0, c1, c2, c3) (innermost first: column, row, head, batch for the course's
/// maps) of the 4-D tensor map `map` (the address of a __grid_constant__ kernel parameter) to
/// shared address `dst`, completing `bytes` of transaction count on the mbarrier at `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
  FA_SM90_ASM(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// ---- the other direction: shared memory to global (step 16) -----------------------------------
// A store is issued by one thread and tracked by bulk *groups*, like cp.async's: the issuing
// thread commits its stores into a group and may wait until at most N of its groups are still
// reading shared memory (wait_group.read: the buffer may be rewritten) or still in flight at all
// (wait_group: the global writes are done). The copy engine reads shared memory through the
// async proxy: ordinary writes of the tile need fence_proxy_async_shared() (device/ptx/sm90.h)
// and a barrier before the store is issued. Boxes that reach past the tensor are clipped: rows
// past N are not written.

/// Copies shared address `src` to the box at (c0, c1, c2, c3) of the 4-D tensor map `map`.
__device__ __forceinline__ void tma_store_4d(const void* map, int c0, int c1, int c2, int c3, uint32_t src) {
  FA_SM90_ASM("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                  reinterpret_cast<uint64_t>(map)),
              "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
              : "memory");
}

// ---- the copy engine's reduce (step 26) ----------------------------------------------------------
// The same shared-to-global move as a store, but each element of the box is ADDED into global
// memory (an atomic add per element, made in L2; fp32 for the course's dQ accumulator), and
// tracked by the same bulk groups. Rows of the box past the tensor are clipped, as in a store.

/// Adds the box at shared address `src` into the box at (c0, c1, c2) of the 3-D tensor map `map`.
__device__ __forceinline__ void tma_reduce_add_3d(const void* map, int c0, int c1, int c2, uint32_t src) {
  FA_SM90_ASM("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                  reinterpret_cast<uint64_t>(map)),
              "r"(c0), "r"(c1), "r"(c2), "r"(src)
              : "memory");
}

/// Closes this thread's bulk stores issued so far into one group.
__device__ __forceinline__ void bulk_commit_group() {
  FA_SM90_ASM("cp.async.bulk.commit_group;\n" ::: "memory");
}

/// Waits until at most N of this thread's committed groups still read their shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  FA_SM90_ASM("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  FA_SM90_ASM("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif  // __CUDACC__

}  // namespace fa::ptx
