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

#endif  // __CUDACC__

}  // namespace fa::ptx
