// Tensor maps for the tensor memory accelerator (TMA), the copy engine of Hopper (host code).
//
// A tensor map is a 128-byte descriptor of a tensor in global memory: its base address, sizes and
// strides, the box one copy moves, the shared-memory swizzle the box lands in, and what fills the
// positions outside the tensor. The launcher builds it on the host (the driver's
// cuTensorMapEncodeTiled, found at run time through the CUDA runtime, so nothing links libcuda) and
// passes it to the kernel by value as a `const __grid_constant__ CUtensorMap`; one thread then
// moves a whole tile with one instruction (device/ptx/tma.h).
//
// The course's maps: a (B, H, N, D) bf16 (or fp16) tensor with any element strides the validation
// accepts (rows 16-byte aligned), as a 4-D map with dims (D, N, H, B) innermost first. One box is
// (rows, 64): 64 16-bit values = 128 bytes, one panel of WgmmaLayout (device/smem_tile.h), landing in the
// 128-byte swizzle that wgmma reads; a D = 128 tile is two boxes. Rows at and past N lie outside
// the tensor and arrive as zeros: a ragged last tile needs no mask on its loads, and never reads
// the next head's rows.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; the function is looked up at run time)

#include <cstdint>

#include "fa/params.h"

namespace fa {

/// Columns of one box: one 128-byte swizzle panel of bf16.
constexpr int kTmaBoxCols = 64;

/// Fills `map` for the (batch, heads, seqlen, head_dim) tensor of `dtype` (bf16 unless asked) at
/// `base` with element strides `strides`, read in boxes of (box_rows, 64) in the 128-byte swizzle.
/// Returns an error that names the tensor (`what`) when the driver cannot be reached or cannot
/// describe it, and for a stride of 0 on a dimension longer than 1 (a broadcast), which is refused
/// before the driver sees it.
Status make_tile_map(CUtensorMap* map, const char* what, const void* base, int64_t batch, int64_t heads, int64_t seqlen,
                     int64_t head_dim, const Strides& strides, int box_rows, DType dtype = DType::bf16);

/// Columns of one fp32 box: 32 floats = 128 bytes, one 128-byte swizzle span.
constexpr int kTmaAccumBoxCols = 32;

/// Fills `map` for a contiguous (planes, seqlen, head_dim) fp32 array at `base` (the backward's dQ
/// accumulator: planes = B·H_q), as a 3-D map with dims (D, N, planes) innermost first, written in
/// boxes of (box_rows, 32) floats in the 128-byte swizzle (step 26's bulk reduce-add). Rows at
/// and past N lie outside the map: a box reaching past them is clipped.
Status make_accum_map(CUtensorMap* map, const float* base, int64_t planes, int64_t seqlen, int64_t head_dim,
                      int box_rows);

/// The tensor maps of one attention call, as the TMA steps (12 on) take them: Q in boxes of
/// `block_m` rows, K and V in boxes of `block_n` rows, each through its own strides.
struct QkvTileMaps {
  CUtensorMap q, k, v;
};

/// make_tile_map for Q, K and V of `p` in `p.dtype` (packed sequences: one batch entry of total_q /
/// total_kv rows); the first error, naming its tensor.
Status make_qkv_tile_maps(QkvTileMaps* maps, const AttentionParams& p, int block_m, int block_n);

}  // namespace fa
