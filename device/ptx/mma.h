// Tensor-core matrix multiply: one warp computes D = A·B + C for a 16×8 tile with K = 16,
// bf16 inputs and fp32 accumulators (PTX `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`,
// available from sm_80). fp16 inputs (`.f16.f16`) take the same instruction shape, the same
// fragments and the same fp32 accumulators: only the meaning of each 16-bit half changes, so a
// kernel written for one is the other's with two functions swapped, the multiply and the rounding
// of fp32 values into operands (mma_16816<Elem>, pack_x2<Elem>; Elem = __nv_bfloat16 or __half).
//
// Nobody holds a whole matrix: each of the 32 lanes holds a few elements of A, B and C in
// registers, in a fixed pattern (the "fragment layout"). With g = lane / 4 (the group, 0..7) and
// t = lane % 4 (the thread in the group, 0..3):
//
//   A, 16×16 row-major, 4 registers of 2 bf16 each         B, 16×8 (K×N), 2 registers
//             k: 0..7        8..15                               n: 0..7
//   row g     a[0]={2t,2t+1} a[2]={2t+8,2t+9}               k 0..7   b[0] = rows {2t,2t+1}, col g
//   row g+8   a[1]={2t,2t+1} a[3]={2t+8,2t+9}               k 8..15  b[1] = rows {2t+8,2t+9}, col g
//
//   C and D, 16×8 fp32, 4 registers
//   row g     c[0] col 2t, c[1] col 2t+1
//   row g+8   c[2] col 2t, c[3] col 2t+1
//
// Two C tiles side by side (columns 0..7 and 8..15) hold, per lane, exactly the elements an A
// fragment of the next multiply needs: row g cols {2t, 2t+1} and {2t+8, 2t+9}, row g+8 the same.
// That is why FlashAttention can turn its scores S into the left operand P of P·V without
// touching shared memory (see `accumulators_to_a`).
//
// The functions a_row/a_col/... describe the layout once, for the kernels, the CPU model in the
// tests and the lesson alike.
#pragma once

#include <cstdint>

#include "device/mask.h"  // FA_HD

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>
#endif

namespace fa::ptx {

/// Where element i (0..7, two per register, low half first) of lane `lane`'s A fragment sits.
FA_HD int mma_a_row(int lane, int i) {
  return lane / 4 + ((i / 2) % 2) * 8;
}
FA_HD int mma_a_col(int lane, int i) {
  return (lane % 4) * 2 + i % 2 + (i / 4) * 8;
}
/// Where element i (0..3) of lane `lane`'s B fragment sits (B is K×N; k is the row).
FA_HD int mma_b_row(int lane, int i) {
  return (lane % 4) * 2 + i % 2 + (i / 2) * 8;
}
FA_HD int mma_b_col(int lane, int /*i*/) {
  return lane / 4;
}
/// Where accumulator i (0..3) of lane `lane` sits in the 16×8 C/D tile.
FA_HD int mma_c_row(int lane, int i) {
  return lane / 4 + (i / 2) * 8;
}
FA_HD int mma_c_col(int lane, int i) {
  return (lane % 4) * 2 + i % 2;
}

#if defined(__CUDACC__)

/// d += a · b for one 16×8×16 tile. `d` is both the accumulator input and the result.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// The same multiply with fp16 A and B (`.f16.f16`): same fragments, same fp32 accumulators.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Whether Elem is fp16 (__half); the element types are that and bf16 (__nv_bfloat16).
template <typename Elem>
inline constexpr bool kIsFp16 = std::is_same_v<Elem, __half>;

/// d += a · b with A and B of element type Elem: the bf16 or the fp16 instruction.
template <typename Elem>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(kIsFp16<Elem> || std::is_same_v<Elem, __nv_bfloat16>, "bf16 or fp16 operands");
  if constexpr (kIsFp16<Elem>)
    mma_f16_16816(d, a, b0, b1);
  else
    mma_bf16_16816(d, a, b0, b1);
}

/// Two floats rounded to bf16 (round to nearest even) in one register, `lo` in the low half:
/// the low half is the element with the smaller column index in every fragment above.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

/// The inverse of pack_bf16x2.
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t r) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&r));
}

/// Two floats rounded to fp16 (round to nearest even; past 65504 they become ±inf) in one
/// register, `lo` in the low half, as pack_bf16x2.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

/// Two floats rounded to Elem (bf16 or fp16) in one register, `lo` in the low half.
template <typename Elem>
__device__ __forceinline__ uint32_t pack_x2(float lo, float hi) {
  if constexpr (kIsFp16<Elem>)
    return pack_f16x2(lo, hi);
  else
    return pack_bf16x2(lo, hi);
}

/// Two adjacent 16×8 fp32 accumulator tiles (columns 0..7 in c0, 8..15 in c1) → one 16×16 A
/// fragment of Elem (bf16 unless asked). No data moves between lanes: the layouts line up (see the
/// picture above).
template <typename Elem = __nv_bfloat16>
__device__ __forceinline__ void accumulators_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_x2<Elem>(c0[0], c0[1]);  // row g,   cols 2t, 2t+1
  a[1] = pack_x2<Elem>(c0[2], c0[3]);  // row g+8, cols 2t, 2t+1
  a[2] = pack_x2<Elem>(c1[0], c1[1]);  // row g,   cols 2t+8, 2t+9
  a[3] = pack_x2<Elem>(c1[2], c1[3]);  // row g+8, cols 2t+8, 2t+9
}

/// 2^x on the special-function unit (`ex2.approx.ftz.f32`, about 2 ulp; -inf gives +0). The
/// softmax calls it once per score, so it is written as one instruction rather than exp2f's
/// slower, denormal-correct path.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

#endif  // __CUDACC__

}  // namespace fa::ptx
