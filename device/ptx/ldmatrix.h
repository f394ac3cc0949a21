// ldmatrix: a warp loads up to four 8×8 matrices of 16-bit elements from shared memory straight
// into mma fragment layout (PTX `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`, sm_75+).
//
// Each lane passes the shared-memory address of ONE 16-byte row: lanes 0..7 the rows of matrix
// 0, lanes 8..15 of matrix 1, 16..23 of matrix 2, 24..31 of matrix 3. Register r of every lane
// receives two elements of matrix r:
//
//   plain:  lane holds row lane/4, columns 2·(lane%4) and 2·(lane%4)+1   (the mma C/A pattern)
//   .trans: lane holds column lane/4, rows 2·(lane%4) and 2·(lane%4)+1  (the matrix transposed)
//
// So one x4 replaces eight 16-bit shared loads per lane and no lane ever computes where "its"
// elements are: the rows it points at decide which fragment comes out. Which row each lane points
// at for the three operands of FlashAttention:
//
//   A operand (Q, 16×16 row-major):  lane → row lane%16, column block (lane/16)·8
//      matrices: rows 0-7|cols 0-7 = a[0], rows 8-15|0-7 = a[1], rows 0-7|8-15 = a[2], 8-15|8-15 = a[3]
//   B operand from K (keys × d, row-major; QKᵀ needs K as the "col" operand, which it already is):
//      lane → key (lane/16)·8 + lane%8, d block ((lane/8)%2)·8
//      matrices: keys 0-7|d 0-7 = b0 of n-tile 0, keys 0-7|d 8-15 = b1 of n-tile 0,
//                keys 8-15|d 0-7 = b0 of n-tile 1, keys 8-15|d 8-15 = b1 of n-tile 1
//   B operand from V (keys × d row-major, but P·V needs it d-major): the same 8×8 blocks loaded
//      with .trans; lane → key ((lane/8)%2)·8 + lane%8, d block (lane/16)·8
//      matrices: keys 0-7|d 0-7 = b0 of d-tile 0, keys 8-15|d 0-7 = b1 of d-tile 0,
//                keys 0-7|d 8-15 = b0 of d-tile 1, keys 8-15|d 8-15 = b1 of d-tile 1
#pragma once

#include <cstdint>

#include "device/mask.h"  // FA_HD

namespace fa::ptx {

/// Row (within a 16×16 block) and 8-column block whose address lane `lane` passes, per operand.
FA_HD int ldsm_a_row(int lane) {
  return lane % 16;
}
FA_HD int ldsm_a_colblock(int lane) {
  return lane / 16;
}
FA_HD int ldsm_k_row(int lane) {
  return (lane / 16) * 8 + lane % 8;
}
FA_HD int ldsm_k_colblock(int lane) {
  return (lane / 8) % 2;
}
FA_HD int ldsm_v_row(int lane) {
  return ((lane / 8) % 2) * 8 + lane % 8;
}
FA_HD int ldsm_v_colblock(int lane) {
  return lane / 16;
}

#if defined(__CUDACC__)

/// Shared-memory pointer → the 32-bit address the shared-state-space instructions take.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Four 8×8 b16 matrices; `addr` is this lane's row address (16-byte aligned).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// The same, each matrix transposed on the way into registers.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// The other direction, one register: a 4-byte store to shared address `addr` (a 32-bit
/// shared-window address, as the loads above take), for writers that compute their own swizzled
/// offsets (step 16's O tile).
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

#endif  // __CUDACC__

}  // namespace fa::ptx
