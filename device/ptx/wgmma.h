// Warpgroup matrix multiply (Hopper, sm_90a): four consecutive warps, a "warpgroup" of 128 threads
// starting at a warp index divisible by 4, issue one `wgmma.mma_async` together, and the tensor
// cores compute D = A·B + D for a 64 × N tile with K = 16 (bf16 or fp16 inputs, fp32 accumulators
// in registers). Unlike mma.sync the instruction is asynchronous: it returns before the product is
// done, and its accumulators may be read (or its shared operands overwritten) only after
// `wgmma.wait_group`.
//
// Operands. B always comes from shared memory, through a 64-bit matrix descriptor: the tile's
// address, two strides, and its swizzle. A comes from shared memory too (Q·Kᵀ) or from registers
// (P·V: P never leaves the registers it was computed in). The descriptors here describe the
// 128-byte swizzle: a tile is cut into panels 64 bf16 (128 bytes) wide, a panel's rows are 128
// bytes apart, and 16-byte chunk c of row r is stored at chunk c ^ (r % 8) (device/ptx/swizzle.h;
// device/smem_tile.h's WgmmaLayout). Eight rows make one 1024-byte swizzle atom, which must
// start at a 1024-byte boundary, because the hardware takes r % 8 from the address bits.
//
//   K-major operand (the 16 K values of a row are contiguous: Q, and K for Q·Kᵀ)
//     start  = the tile's row 0 at column k0 (a multiple of 16 inside one panel: + 32 bytes per
//              16 columns; the hardware applies the XOR to the address it forms)
//     stride byte offset (SBO) = 1024: from one 8-row group to the next
//     leading byte offset (LBO): unused (16 columns never leave their panel)
//   MN-major operand (the N values of a row are contiguous: V, whose rows are the K of P·V; and
//   an A stored transposed, its M values contiguous: the backward's dSᵀ, read as dS)
//     start  = row k0 of panel 0 (a multiple of 16 rows: + 16 · 128 bytes per 16 rows)
//     SBO = 1024: from one group of 8 K-rows to the next
//     LBO = the panel size: from N columns 0-63 to 64-127
//
// Accumulators of m64nNk16, per thread of the warpgroup (w = warp in the group, 0..3, g = lane / 4,
// t = lane % 4): N / 2 fp32 registers; register i holds row 16w + g + 8·((i / 2) % 2), column
// 8·(i / 4) + 2t + i % 2. So each warp holds its own 16 rows exactly as mma.sync's 16×8 C
// fragments (device/ptx/mma.h), one per 8 columns side by side: what the warp-tile vocabulary
// calls an Acc. The A registers of the register form are likewise mma.sync's A fragment of the
// warp's 16 rows.
//
//   rows 0-15   warp 0   | f0 | f1 | f2 | ... | f(N/8-1) |    f = one 16×8 fragment,
//   rows 16-31  warp 1   | f0 | f1 | f2 | ... |          |        4 registers per lane
//   rows 32-47  warp 2   |    ...                        |
//   rows 48-63  warp 3   |    ...                        |
//
// Ordering (the lesson of step 11 explains each):
//   wgmma_fence()     before the first wgmma that reads accumulator or A registers this thread
//                     wrote otherwise (the softmax writes P, the rescale writes O)
//   wgmma_commit()    closes the wgmmas issued so far into a group
//   wgmma_wait<N>()   waits until at most N groups are in flight: only then are their
//                     accumulators valid, and their shared operands free to be overwritten
//   fence_proxy_async_shared()  (device/ptx/sm90.h) after ordinary (generic-proxy) writes to
//                     shared memory that a wgmma (the async proxy) reads next: cp.async copies too
#pragma once

#include <cstdint>

#include "device/mask.h"     // FA_HD
#include "device/ptx/mma.h"  // kIsFp16
#include "device/ptx/sm90.h"

namespace fa::ptx {

/// Where accumulator register i of thread `tid` (0..127 in the warpgroup) sits in the 64×N tile.
FA_HD int wgmma_c_row(int tid, int i) {
  return 16 * (tid / 32) + (tid % 32) / 4 + 8 * ((i / 2) % 2);
}
FA_HD int wgmma_c_col(int tid, int i) {
  return 8 * (i / 4) + 2 * (tid % 4) + i % 2;
}

/// A matrix descriptor for a bf16 operand in the 128-byte swizzle at shared address `smem_addr`.
/// Fields: start address >> 4 (bits 0-13), leading byte offset >> 4 (bits 16-29), stride byte
/// offset >> 4 (bits 32-45), base offset 0 (bits 49-51: the atoms are 1024-byte aligned), layout
/// (bits 62-63: 1 = 128-byte swizzle).
FA_HD uint64_t smem_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}
/// The K-major descriptor (LBO unused: 1 by convention; SBO 1024 bytes between 8-row groups).
FA_HD uint64_t smem_desc_k_major(uint32_t smem_addr) {
  return smem_desc_sw128(smem_addr, 16, 1024);
}
/// The MN-major descriptor, with `panel_bytes` between the 64-column panels along N.
FA_HD uint64_t smem_desc_mn_major(uint32_t smem_addr, uint32_t panel_bytes) {
  return smem_desc_sw128(smem_addr, panel_bytes, 1024);
}

/// A descriptor as its two 32-bit halves, to be advanced by addition (step 33). The address field is
/// bits 0-13 of the low half: the address over 16, and a shared address is below 2^18. So for
/// `bytes` a multiple of 16, with a + bytes still below 2^18, the descriptor of a + bytes is that of
/// a with bytes / 16 added to its low half (no carry reaches the LBO at bit 16): one integer add per
/// k-step, where smem_desc_sw128 masks, shifts and ors the address anew. The high half (SBO and the
/// swizzle) is the same constant for every descriptor of a kind, which the compiler keeps as one.
struct SmemDesc {
  uint32_t lo, hi;
  FA_HD SmemDesc operator+(uint32_t bytes) const { return {lo + (bytes >> 4), hi}; }
  FA_HD uint64_t bits() const { return (uint64_t(hi) << 32) | lo; }
};
FA_HD SmemDesc split_desc(uint64_t desc) {
  return {uint32_t(desc), uint32_t(desc >> 32)};
}

#if defined(__CUDACC__)

__device__ __forceinline__ void wgmma_fence() {
  FA_SM90A_ASM("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  FA_SM90A_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  FA_SM90A_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Warpgroup register reconfiguration (`setmaxnreg`, sm_90a): every thread of the calling
/// warpgroup gives registers back (dealloc) or takes more (alloc) so that it holds N per thread.
/// All four warps of the group execute it. The kernel must start with a register cap
/// (__launch_bounds__(threads, 1)), and each role's code must be one branch, or ptxas ignores it
/// (warning C7508) and every warp keeps the cap. N is a multiple of 8 in [24, 256].
template <int N>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
  FA_SM90A_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void warpgroup_reg_alloc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
  FA_SM90A_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/// Tells the compiler that the accumulators `d` are written by a wgmma still in flight: no read
/// or write of them may be moved across this point (it emits no instruction).
template <int F>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[F][4]) {
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[f][e])::"memory");
}
/// The same for A-operand registers (P of P·V): they too must not be rewritten while a wgmma reads them.
template <int F>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&a)[F][4]) {
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[f][e])::"memory");
}

// The wrappers, one function per operand form, for each wrapped N and each element type of A and B:
// bf16 (`.f32.bf16.bf16`) and fp16 (`.f32.f16.f16`) take the same descriptors, registers and
// accumulator layout, so only the instruction's name differs. Each form's asm is written once, as a
// macro of the type's name (TY) spliced into the string; the function picks the one its N and Elem
// ask for at compile time.

// The operand lists, written once: the accumulator registers of fragments f .. f + 7 ("+f": the
// wgmma reads and writes them), and the asm names of the first and the second 32 of them.
#define FA_WG_ACC4(f) "+f"(d[f][0]), "+f"(d[f][1]), "+f"(d[f][2]), "+f"(d[f][3])
#define FA_WG_ACC32(f)                                                                                          \
  FA_WG_ACC4(f), FA_WG_ACC4(f + 1), FA_WG_ACC4(f + 2), FA_WG_ACC4(f + 3), FA_WG_ACC4(f + 4), FA_WG_ACC4(f + 5), \
      FA_WG_ACC4(f + 6), FA_WG_ACC4(f + 7)
#define FA_WG_REGS_0_31                                                                                            \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31"
#define FA_WG_REGS_32_63                                                                                           \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, " \
  "%54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FA_WG_REGS_32_39 "%32, %33, %34, %35, %36, %37, %38, %39"
// scale-d comes from a predicate: 0 on the first k step overwrites d instead of accumulating.
#define FA_WG_PRED(k) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #k ", 0;\n"
// The instruction for shape m64nNk16 with A and B of type TY ("bf16" or "f16"), fp32 accumulators.
#define FA_WG_MMA(n, TY) "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." TY "." TY " {"

#define FA_WG_SS_64(TY)                                                                            \
  FA_SM90A_ASM(FA_WG_PRED(34) FA_WG_MMA(64, TY) FA_WG_REGS_0_31 "}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
               : FA_WG_ACC32(0)                                                                    \
               : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)))
#define FA_WG_SS_80(TY)                                                                            \
  FA_SM90A_ASM(FA_WG_PRED(42) FA_WG_MMA(80, TY) FA_WG_REGS_0_31 ", " FA_WG_REGS_32_39              \
                                                                "}, %40, %41, p, 1, 1, 0, 0;\n}\n" \
               : FA_WG_ACC32(0), FA_WG_ACC4(8), FA_WG_ACC4(9)                                      \
               : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)))
#define FA_WG_SS_128(TY)                                                                            \
  FA_SM90A_ASM(FA_WG_PRED(66) FA_WG_MMA(128, TY) FA_WG_REGS_0_31 ", " FA_WG_REGS_32_63              \
                                                                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
               : FA_WG_ACC32(0), FA_WG_ACC32(8)                                                     \
               : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)))
#define FA_WG_RS_MN_64(TY)                                                                                       \
  FA_SM90A_ASM(FA_WG_PRED(37) FA_WG_MMA(64, TY) FA_WG_REGS_0_31 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n" \
               : FA_WG_ACC32(0)                                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)))
#define FA_WG_RS_MN_128(TY)                                                                                       \
  FA_SM90A_ASM(FA_WG_PRED(69) FA_WG_MMA(128, TY) FA_WG_REGS_0_31 ", " FA_WG_REGS_32_63                            \
                                                                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n" \
               : FA_WG_ACC32(0), FA_WG_ACC32(8)                                                                   \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)))
#define FA_WG_SS_MN_64(TY)                                                                         \
  FA_SM90A_ASM(FA_WG_PRED(34) FA_WG_MMA(64, TY) FA_WG_REGS_0_31 "}, %32, %33, p, 1, 1, 1, 1;\n}\n" \
               : FA_WG_ACC32(0)                                                                    \
               : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)))

/// d (64 × N fp32, N / 2 registers per thread as N / 8 fragments of 4) = A·B (+ d when
/// `accumulate`): A 64×16 and B 16×N, both K-major Elem (bf16 or fp16) in shared memory, given by
/// descriptors. N = 64, 80 (the forward's 80-key tiles at D = 256) or 128.
template <int N, typename Elem = __nv_bfloat16>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 64 || N == 80 || N == 128, "the wgmma shapes wrapped: N = 64, 80, 128");
  if constexpr (N == 64 && kIsFp16<Elem>)
    FA_WG_SS_64("f16");
  else if constexpr (N == 64)
    FA_WG_SS_64("bf16");
  else if constexpr (N == 80 && kIsFp16<Elem>)
    FA_WG_SS_80("f16");
  else if constexpr (N == 80)
    FA_WG_SS_80("bf16");
  else if constexpr (kIsFp16<Elem>)
    FA_WG_SS_128("f16");
  else
    FA_WG_SS_128("bf16");
}

/// The same with A (64×16 of Elem, mma.sync's A fragment per warp) in registers and B MN-major.
template <int N, typename Elem = __nv_bfloat16>
__device__ __forceinline__ void wgmma_rs_mn(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                            bool accumulate) {
  static_assert(N == 64 || N == 128, "the wgmma shapes wrapped: N = 64, 128");
  if constexpr (N == 64 && kIsFp16<Elem>)
    FA_WG_RS_MN_64("f16");
  else if constexpr (N == 64)
    FA_WG_RS_MN_64("bf16");
  else if constexpr (kIsFp16<Elem>)
    FA_WG_RS_MN_128("f16");
  else
    FA_WG_RS_MN_128("bf16");
}

/// The same with both A and B MN-major in shared memory (imm-trans-a = imm-trans-b = 1): A is
/// stored as its transpose, 16 K-rows of 64 M values each (the backward's dSᵀ, read as dS). N = 64.
template <int N, typename Elem = __nv_bfloat16>
__device__ __forceinline__ void wgmma_ss_mn(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 64, "the wgmma shape wrapped: N = 64");
  if constexpr (kIsFp16<Elem>)
    FA_WG_SS_MN_64("f16");
  else
    FA_WG_SS_MN_64("bf16");
}

#undef FA_WG_SS_64
#undef FA_WG_SS_80
#undef FA_WG_SS_128
#undef FA_WG_RS_MN_64
#undef FA_WG_RS_MN_128
#undef FA_WG_SS_MN_64
#undef FA_WG_MMA
#undef FA_WG_ACC4
#undef FA_WG_ACC32
#undef FA_WG_REGS_0_31
#undef FA_WG_REGS_32_63
#undef FA_WG_REGS_32_39
#undef FA_WG_PRED

#endif  // __CUDACC__

}  // namespace fa::ptx
