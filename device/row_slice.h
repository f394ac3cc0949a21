// How steps 01-03 spread a query row over threads, and the loads and stores that go with it.
//
// A quad of kRowLanes = 4 consecutive lanes owns one row of HEAD_DIM values. Lane t of the quad
// holds the 16-byte chunks t, t+4, t+8, ... of the row (8 bf16 values per chunk), so each lane
// keeps HEAD_DIM/4 values in registers: 16 for D = 64, 32 for D = 128. Interleaved chunks rather
// than one contiguous quarter per lane, because then the quad's four lanes read 64 contiguous
// bytes per load instruction: one coalesced segment in global memory, and four different groups
// of banks in shared memory (with contiguous quarters the four lanes' addresses would lie 64 or
// 128 bytes apart, on the same banks: a 2- or 4-way conflict on every load).
// A dot product of two rows is then a per-lane partial sum plus two shuffles (row_sum).
//
// The index math is __host__ __device__ and unit-tested on the CPU; the loads and stores are
// device code.
#pragma once

#include <cstdint>

#include "device/mask.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <type_traits>

#include "device/ptx/mma.h"
#endif

namespace fa {

constexpr int kRowLanes = 4;    // lanes that share one row
constexpr int kChunkElems = 8;  // bf16 values in one 16-byte chunk

// Values of a HEAD_DIM row that one lane holds.
template <int HEAD_DIM>
FA_HD constexpr int row_slice_size() {
  static_assert(HEAD_DIM % (kRowLanes * kChunkElems) == 0, "HEAD_DIM must be a multiple of 32");
  return HEAD_DIM / kRowLanes;
}

// The column of the row that element k of lane `lane`'s slice holds.
FA_HD int slice_column(int lane, int k) {
  return ((k / kChunkElems) * kRowLanes + lane) * kChunkElems + k % kChunkElems;
}

#if defined(__CUDACC__)

// This thread's position inside its quad.
__device__ __forceinline__ int row_lane() {
  return int(threadIdx.x % kRowLanes);
}

// Sum over the four lanes of a quad; every lane gets the total. All 32 lanes of the warp must call
// it together: the kernels keep warps converged (a quad without a real row computes on a
// stand-in row and skips its store) so the shuffles need no divergence handling.
__device__ __forceinline__ float row_sum(float x) {
  x += __shfl_xor_sync(0xFFFFFFFFu, x, 1);
  x += __shfl_xor_sync(0xFFFFFFFFu, x, 2);
  return x;
}

// Two bf16 values packed in a 32-bit word, low half first. Exact: a bf16 is the top half of an
// fp32, so widening is a shift.
__device__ __forceinline__ void unpack_bf16x2(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xFFFF0000u);
}

// The same for T: bf16 as above, or fp16 (the production backward's fp16 path; widening is exact).
template <typename T>
__device__ __forceinline__ void unpack_row_x2(uint32_t w, float& lo, float& hi) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h;
    memcpy(&h, &w, sizeof h);
    const float2 f = __half22float2(h);
    lo = f.x, hi = f.y;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "bf16 or fp16 rows");
    unpack_bf16x2(w, lo, hi);
  }
}

// This lane's slice of a row of 16-bit elements T (bf16 or fp16; global memory), widened to fp32
// and multiplied by `scale`.
template <int N, typename T>
__device__ __forceinline__ void load_row_slice(const T* row, int lane, float (&x)[N], float scale = 1.0f) {
#pragma unroll
  for (int c = 0; c < N / kChunkElems; ++c) {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + (c * kRowLanes + lane) * kChunkElems);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float lo, hi;
      unpack_row_x2<T>(words[w], lo, hi);
      x[c * kChunkElems + 2 * w] = lo * scale;
      x[c * kChunkElems + 2 * w + 1] = hi * scale;
    }
  }
}

// This lane's slice of an fp32 row (shared memory, or an fp32 workspace in global memory).
template <int N>
__device__ __forceinline__ void load_row_slice(const float* row, int lane, float (&x)[N]) {
#pragma unroll
  for (int c = 0; c < N / kChunkElems; ++c) {
    const float4* src = reinterpret_cast<const float4*>(row + (c * kRowLanes + lane) * kChunkElems);
    const float4 a = src[0], b = src[1];
    float* dst = x + c * kChunkElems;
    dst[0] = a.x, dst[1] = a.y, dst[2] = a.z, dst[3] = a.w;
    dst[4] = b.x, dst[5] = b.y, dst[6] = b.z, dst[7] = b.w;
  }
}

// Rounds this lane's slice to T (bf16 or fp16) and writes it into a row of T, 16 bytes per store.
template <int N, typename T>
__device__ __forceinline__ void store_row_slice(T* row, int lane, const float (&x)[N]) {
#pragma unroll
  for (int c = 0; c < N / kChunkElems; ++c) {
    const float* src = x + c * kChunkElems;
    const uint4 raw{ptx::pack_x2<T>(src[0], src[1]), ptx::pack_x2<T>(src[2], src[3]), ptx::pack_x2<T>(src[4], src[5]),
                    ptx::pack_x2<T>(src[6], src[7])};  // rounded to nearest even (device/ptx/mma.h)
    *reinterpret_cast<uint4*>(row + (c * kRowLanes + lane) * kChunkElems) = raw;
  }
}

// Writes this lane's slice into an fp32 row.
template <int N>
__device__ __forceinline__ void store_row_slice(float* row, int lane, const float (&x)[N]) {
#pragma unroll
  for (int c = 0; c < N / kChunkElems; ++c) {
    float4* dst = reinterpret_cast<float4*>(row + (c * kRowLanes + lane) * kChunkElems);
    const float* src = x + c * kChunkElems;
    dst[0] = make_float4(src[0], src[1], src[2], src[3]);
    dst[1] = make_float4(src[4], src[5], src[6], src[7]);
  }
}

// This lane's part of the dot product of two rows; row_sum() of it is the full dot product.
template <int N>
__device__ __forceinline__ float dot_slice(const float (&a)[N], const float (&b)[N]) {
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) acc = fmaf(a[k], b[k], acc);
  return acc;
}

// Copies a (ROWS, HEAD_DIM) bf16 tile whose rows are `row_stride` elements apart into shared
// memory as a dense (ROWS, HEAD_DIM) fp32 array; all THREADS threads of the block take part,
// 16 bytes each per step, so a warp reads whole rows (coalesced). Widening to fp32 here, once
// per tile, saves every quad that reads the tile from doing it again.
// Rows [rows_valid, ROWS) are filled with zeros and nothing is read past the tensor: a V row
// there must be finite because its weight is 0 and 0·NaN = NaN. Zeros do NOT mask the K rows:
// their score would be q·0 = 0, a real logit, so the kernel still sets those scores to -inf.
template <int ROWS, int HEAD_DIM, int THREADS>
__device__ __forceinline__ void load_tile(float* tile, const __nv_bfloat16* src, int64_t row_stride, int rows_valid) {
  constexpr int kChunksPerRow = HEAD_DIM / kChunkElems;
  constexpr int kChunks = ROWS * kChunksPerRow;
#pragma unroll
  for (int step = 0; step < (kChunks + THREADS - 1) / THREADS; ++step) {
    const int c = step * THREADS + int(threadIdx.x);
    if (kChunks % THREADS != 0 && c >= kChunks) break;  // a tile smaller than the block
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * kChunkElems;
    uint4 raw{0u, 0u, 0u, 0u};
    if (r < rows_valid) raw = *reinterpret_cast<const uint4*>(src + r * row_stride + col);
    float v[kChunkElems];
    unpack_bf16x2(raw.x, v[0], v[1]);
    unpack_bf16x2(raw.y, v[2], v[3]);
    unpack_bf16x2(raw.z, v[4], v[5]);
    unpack_bf16x2(raw.w, v[6], v[7]);
    float4* dst = reinterpret_cast<float4*>(tile + r * HEAD_DIM + col);
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

#endif  // __CUDACC__

}  // namespace fa
