// The warp-tile vocabulary of the backward pass (step 17 on): what the backward does to a tile
// that the forward never did. A warp of the backward owns 16 KEYS, so its score tile is
// transposed: Sᵀ = K·Qᵀ, rows are keys and columns are queries, in the same fragment layout as
// every Acc (device/warp_tile.h: element e of fragment f of a lane is row g + 8·(e / 2), column
// 8·f + 2t + e % 2, g = lane / 4, t = lane % 4). The per-query values the softmax needs (the LSE,
// and D = rowsum(dO∘O)) are therefore per COLUMN here, read from shared memory by column.
//
//   exp2_cols          Pᵀ = 2^(c·Sᵀ − lse₂[col]): the probabilities, recomputed from the stored LSE
//   ds_cols            dSᵀ = Pᵀ ∘ (dPᵀ − D[col])
//   store_transposed   a warp's (16, N) tile written to shared memory as the (N, 16) block of a
//                      (queries, keys) tile: dS for dQ = dS·K, whose rows are queries
//   mma_pv_cols        O += P·V[:, c0 .. c0 + C): the P·V product on a slice of V's columns
//   atomic_add_rows    a warp's fp32 rows added into global memory with atomics (dQ's accumulator)
//   atomic_add_rows_x2 the same sum, two adjacent columns per 8-byte vector atomic (sm_90)
//   store_tile_rows    a warp's (16, N) tile written to shared memory as it is (rows, columns),
//                      bf16 pairs: Pᵀ and dSᵀ for the products that need all of a block's queries
//   load_a_trans       A fragments of the TRANSPOSE of a shared tile (ldmatrix.trans): dS for
//                      dQ = dS·K, read from the (keys, queries) tile that holds dSᵀ
//   store_rows_f32     a warp's (16, C) fp32 tile into a plain fp32 shared tile (step 24: dQ
//                      staged, so that its atomics leave from shared memory, not from registers)
//   store_rows_f32_swizzled  the same, into the 128-byte-swizzled boxes a TMA bulk reduce reads
//                      (step 26: dQ added into its accumulator by the copy engine)
//   atomic_add_tile_x4 a (ROWS, COLS) fp32 shared tile added into global rows by THREADS threads
//                      together, 16-byte vector atomics (sm_90), consecutive threads on consecutive
//                      16 bytes of a row
#pragma once

#include <cstdint>

#include "device/ptx/ldmatrix.h"
#include "device/ptx/mma.h"
#include "device/smem_tile.h"
#include "device/warp_tile.h"

namespace fa::tile {

#if defined(__CUDACC__)

/// Pᵀ = 2^(c·s − lse2[col]) per element, where lse2[col] is column col's LSE in exp2 units
/// (LSE·log2 e), in shared memory, indexed by the tile's column (0 .. N). A column whose row saw no
/// key must hold +inf there (0 for every element, never −inf − (−inf) = NaN).
template <int N>
__device__ __forceinline__ Acc<N> exp2_cols(const Acc<N>& s, float scale_log2, const float* lse2) {
  const int lane = lane_id();
  Acc<N> p;
#pragma unroll
  for (int f = 0; f < N / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      p.c[f][e] = ptx::exp2_approx(s.c[f][e] * scale_log2 - lse2[f * 8 + ptx::mma_c_col(lane, e)]);
  return p;
}

/// dSᵀ = Pᵀ ∘ (dPᵀ − D[col]) per element, D in shared memory by column.
template <int N>
__device__ __forceinline__ Acc<N> ds_cols(const Acc<N>& p, const Acc<N>& dp, const float* delta) {
  const int lane = lane_id();
  Acc<N> ds;
#pragma unroll
  for (int f = 0; f < N / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) ds.c[f][e] = p.c[f][e] * (dp.c[f][e] - delta[f * 8 + ptx::mma_c_col(lane, e)]);
  return ds;
}

/// Writes the warp's (16, N) tile x, rounded to bf16, transposed into `tile`: x's row r, column c
/// goes to tile row c, column col0 + r. One 16-bit store per element (a lesson's simplicity, not
/// conflict-free).
template <int N, int ROWS, typename Layout>
__device__ __forceinline__ void store_transposed(SmemTile<ROWS, Layout> tile, const Acc<N>& x, int col0) {
  const int lane = lane_id();
#pragma unroll
  for (int f = 0; f < N / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      tile.ptr[Layout::offset(f * 8 + ptx::mma_c_col(lane, e), col0 + ptx::mma_c_row(lane, e))] =
          __float2bfloat16(x.c[f][e]);
}

/// O += P·V[:, c0 .. c0 + C) for one warp's 16 rows: mma_pv on C of V's columns from c0 (a multiple
/// of 16). Elem: V's type (bf16 or fp16), P's too.
template <int C, int N, typename Layout, typename Elem>
__device__ __forceinline__ void mma_pv_cols(Acc<C>& o, const FragA<N>& p, SmemTile<N, Layout, Elem> v_tile, int c0) {
  mma_pv_rows<1>(&o, &p, v_tile, c0);
}

/// dst[(row0 + r)·stride + col0 + c] += scale · x[r][c] for the warp's (16, C) tile, with fp32
/// atomics; rows at or past valid_rows are skipped.
template <int C>
__device__ __forceinline__ void atomic_add_rows(float* dst, int64_t stride, const Acc<C>& x, float scale, int row0,
                                                int col0, int valid_rows) {
  const int lane = lane_id();
#pragma unroll
  for (int f = 0; f < C / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + ptx::mma_c_row(lane, e);
      if (row < valid_rows) atomicAdd(dst + row * stride + col0 + f * 8 + ptx::mma_c_col(lane, e), scale * x.c[f][e]);
    }
}

/// atomic_add_rows with half the atomic instructions: a lane's elements e and e + 1 of a fragment
/// are one row's columns 2t and 2t + 1, so on sm_90 they go out as one 8-byte vector atomic
/// (REDG.E.ADD.F32x2: `atomicAdd(float2*, float2)`); before sm_90, which has no vector float
/// atomic, as two scalar ones. dst + row·stride + col0 must be 8-byte aligned for every row
/// (dst 8-byte aligned, stride and col0 even).
template <int C>
__device__ __forceinline__ void atomic_add_rows_x2(float* dst, int64_t stride, const Acc<C>& x, float scale, int row0,
                                                   int col0, int valid_rows) {
  const int lane = lane_id();
#pragma unroll
  for (int f = 0; f < C / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int row = row0 + ptx::mma_c_row(lane, e);
      float* const d = dst + row * stride + col0 + f * 8 + ptx::mma_c_col(lane, e);
      if (row < valid_rows) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2*>(d), make_float2(scale * x.c[f][e], scale * x.c[f][e + 1]));
#else
        atomicAdd(d, scale * x.c[f][e]);
        atomicAdd(d + 1, scale * x.c[f][e + 1]);
#endif
      }
    }
}

/// Writes the warp's (16, N) tile x, rounded to the tile's Elem (bf16 or fp16), into rows [row0, row0 + 16) and columns
/// [col0, col0 + N) of `tile`, as it is (no transpose): element (r, c) goes to (row0 + r, col0 + c).
/// A lane's elements e and e + 1 are adjacent columns, so each pair is one 4-byte store; col0 is a
/// multiple of 8, so a pair never straddles a 16-byte chunk of the swizzle.
/// `lane` is the caller's lane_id(); a kernel short of registers passes one the compiler cannot see
/// through (opaque_thread_index() % 32), so that the 2·N/8 addresses are computed at the stores
/// instead of being held in registers across its loop.
template <int N, int ROWS, typename Layout, typename Elem>
__device__ __forceinline__ void store_tile_rows(SmemTile<ROWS, Layout, Elem> tile, const Acc<N>& x, int row0, int col0,
                                                int lane = lane_id()) {
#pragma unroll
  for (int f = 0; f < N / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; e += 2)
      if constexpr (ptx::kIsFp16<Elem>)
        *reinterpret_cast<__half2*>(
            &tile.ptr[Layout::offset(row0 + ptx::mma_c_row(lane, e), col0 + f * 8 + ptx::mma_c_col(lane, e))]) =
            __floats2half2_rn(x.c[f][e], x.c[f][e + 1]);
      else
        *reinterpret_cast<__nv_bfloat162*>(
            &tile.ptr[Layout::offset(row0 + ptx::mma_c_row(lane, e), col0 + f * 8 + ptx::mma_c_col(lane, e))]) =
            __floats2bfloat162_rn(x.c[f][e], x.c[f][e + 1]);
}

/// The A fragments of rows [col0, col0 + 16) of Xᵀ, where X is the (K, ·) shared tile: A(r, k) =
/// X(k, col0 + r), K = X's rows (ldmatrix.trans, one x4 per 16 rows of X). The four 8×8 blocks a0..a3
/// of a 16×16 A fragment (rows 0-7|k 0-7, rows 8-15|k 0-7, rows 0-7|k 8-15, rows 8-15|k 8-15) are
/// X's blocks (k 0-7|c 0-7), (k 0-7|c 8-15), (k 8-15|c 0-7), (k 8-15|c 8-15), transposed: lane →
/// X row (lane/16)·8 + lane%8, column block (lane/8)%2, the K operand's addressing (device/ptx/ldmatrix.h).
template <int K, int ROWS, typename Layout, typename Elem>
__device__ __forceinline__ FragA<K> load_a_trans(SmemTile<ROWS, Layout, Elem> tile, int col0) {
  static_assert(ROWS == K, "the tile's rows are the operand's K");
  const int lane = lane_id();
  const unsigned lane_bytes = 2 * Layout::offset(ptx::ldsm_k_row(lane), ptx::ldsm_k_colblock(lane) * 8);
  FragA<K> a;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    ptx::ldmatrix_x4_trans(a.a[kk], tile.addr() + Layout::move(lane_bytes, kk, col0 / 16));
  return a;
}

/// Rows [row0, row0 + 16) of a plain fp32 shared tile (rows `pitch` floats apart) = the warp's
/// (16, C) tile x, as it is: a lane's elements e and e + 1 are adjacent columns, one 8-byte store.
/// pitch ≡ 8 (mod 32) keeps a warp's stores at two wavefronts (the minimum for 256 bytes): rows
/// g and g + 1 land 8 banks apart.
template <int C>
__device__ __forceinline__ void store_rows_f32(float* tile, int pitch, const Acc<C>& x, int row0) {
  const int lane = lane_id();
#pragma unroll
  for (int f = 0; f < C / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; e += 2)
      *reinterpret_cast<float2*>(tile + (row0 + ptx::mma_c_row(lane, e)) * pitch + f * 8 + ptx::mma_c_col(lane, e)) =
          make_float2(x.c[f][e], x.c[f][e + 1]);
}

/// Rows [row0, row0 + 16) of a (ROWS, C) fp32 shared tile laid out as the copy engine reads it for
/// a bulk reduce (step 26) = scale · the warp's (16, C) tile x. The tile is C / 32 boxes of
/// (ROWS, 32) floats, one after the other; in each, row r is 128 bytes and its 16-byte chunk k sits
/// at chunk k ^ (r % 8) (the 128-byte swizzle, library/tma.h's make_accum_map). Rows g and g + 1
/// of a store land on different chunks, so a warp's 8-byte stores take two wavefronts, the minimum
/// for 256 bytes, with no padding (a TMA box has none). `tile` must be 1024-byte aligned, and row0
/// a multiple of 8 (the lane's rows then sit at swizzle row g). ACCUMULATE: += instead of =, each
/// lane reading back only what it writes (step 36 sums two warpgroups' partial products this way,
/// the second one's lanes on the first one's elements).
template <int ROWS, bool ACCUMULATE = false, int C>
__device__ __forceinline__ void store_rows_f32_swizzled(float* tile, const Acc<C>& x, int row0, float scale) {
  static_assert(C % 32 == 0, "whole 32-column boxes");
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  // Fragment f's pair (columns 8f + 2t, + 1) of row row0 + g: chunk (2f + t / 2) % 8 of its box's
  // row, at chunk ((2f + t / 2) % 8) ^ g. As 2f only sets the chunk's bits 1 and 2, that is the
  // lane's own offset for f = 0 with bits 3 and 4 of the float index flipped by 8·(f % 4): one
  // offset per lane, an XOR per fragment, the box and the row g + 8 as constants.
  const int base = (row0 + g) * 32 + ((t / 2) ^ g) * 4 + 2 * (t % 2);
#pragma unroll
  for (int f = 0; f < C / 8; ++f) {
    const int at = (base ^ (8 * (f % 4))) + (f / 4) * ROWS * 32;
    float2* const upper = reinterpret_cast<float2*>(tile + at);
    float2* const lower = reinterpret_cast<float2*>(tile + at + 8 * 32);
    float2 a = make_float2(scale * x.c[f][0], scale * x.c[f][1]), b = make_float2(scale * x.c[f][2], scale * x.c[f][3]);
    if constexpr (ACCUMULATE) {
      const float2 a0 = *upper, b0 = *lower;
      a = make_float2(a0.x + a.x, a0.y + a.y);
      b = make_float2(b0.x + b.x, b0.y + b.y);
    }
    *upper = a;
    *lower = b;
  }
}

/// dst[r·stride + c] += scale · tile[r·pitch + c] for the (ROWS, COLS) fp32 shared tile, rows at or
/// past valid_rows skipped, by THREADS threads (index `tid` among them) together. With SUMMANDS > 1,
/// the sum of that many tiles, `summand_stride` floats apart, is added. Thread tid takes
/// 16-byte chunks tid, tid + THREADS, ... in row order, one vector atomic each (sm_90:
/// `atomicAdd(float4*, float4)`; before sm_90, four scalar ones). Few registers, whatever the
/// tile's size: a kernel whose accumulators fill the register file adds its dQ this way (step 24).
/// dst and the stride must keep every row 16-byte aligned, the tile's rows too (pitch % 4 == 0).
template <int ROWS, int COLS, int THREADS, int SUMMANDS = 1>
__device__ __forceinline__ void atomic_add_tile_x4(float* dst, int64_t stride, const float* tile, int pitch,
                                                   float scale, int valid_rows, int tid, int summand_stride = 0) {
  constexpr int kChunksPerRow = COLS / 4, kChunks = ROWS * kChunksPerRow;
  static_assert(COLS % 4 == 0 && kChunks % THREADS == 0, "whole 16-byte chunks, evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / THREADS; ++i) {
    const int chunk = tid + i * THREADS, row = chunk / kChunksPerRow, col = 4 * (chunk % kChunksPerRow);
    if (row >= valid_rows) continue;
    float4 v = *reinterpret_cast<const float4*>(tile + row * pitch + col);
#pragma unroll
    for (int k = 1; k < SUMMANDS; ++k) {
      const float4 w = *reinterpret_cast<const float4*>(tile + k * summand_stride + row * pitch + col);
      v = make_float4(v.x + w.x, v.y + w.y, v.z + w.z, v.w + w.w);
    }
    float* const d = dst + row * stride + col;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(d), make_float4(scale * v.x, scale * v.y, scale * v.z, scale * v.w));
#else
    atomicAdd(d, scale * v.x);
    atomicAdd(d + 1, scale * v.y);
    atomicAdd(d + 2, scale * v.z);
    atomicAdd(d + 3, scale * v.w);
#endif
  }
}

#endif  // __CUDACC__

}  // namespace fa::tile
