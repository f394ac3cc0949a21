// The warpgroup operations of the vocabulary (Hopper, sm_90a): Q·Kᵀ and P·V as wgmma, issued by
// the four warps of a warpgroup together for its 64 query rows.
//
//   wgmma_begin(s);                                   order the registers' earlier writes first
//   mma_qk_async(s, q_tile, wg_row0, k_tile);         S = Q·Kᵀ        (64, BLOCK_N) per warpgroup
//   ptx::wgmma_commit();  wait_for<0>(s);             S is ready
//   ... the softmax of device/warp_tile.h, per warp on its 16 rows ...
//   wgmma_begin(o_i, p);
//   mma_pv_async(o_i, p, v_tile);                     O += P·V        (64, HEAD_DIM) per warpgroup
//   ptx::wgmma_commit();  wait_for<0>(o_i);
//
// The backward (step 24) uses the same two products with other operands (Sᵀ = K·Qᵀ is
// mma_qk_async with K in Q's place; dV += Pᵀ·dO is mma_pv_async with dO in V's place), and one more:
//   mma_at_b_async(dq, ds_t_tile, q_panel, k_tile, d_panel);   dQ = dS·K  (64, 64) per warpgroup
// whose A, dS, is stored transposed (dSᵀ, rows are keys): both of its operands are MN-major.
//
// The point of the design: a warpgroup's wgmma accumulator is, warp by warp, exactly the Acc of
// the warp's own 16 rows (device/ptx/wgmma.h), and the A registers of P·V are exactly the warp's
// FragA. So every softmax operation of the warp-tile vocabulary (row_max, exp2_rows, rescale,
// to_bf16, store_rows, ...) works unchanged on what wgmma produces; only the two products change.
// As there, a product's element type (bf16 or fp16) is its shared tiles' (SmemTile's Elem).
//
// Shared tiles are WgmmaLayout (device/smem_tile.h), each starting at a 1024-byte boundary. Q and
// K are K-major operands (their rows run along the head dim, the K of Q·Kᵀ); V is MN-major (its
// rows run along the keys, the K of P·V, and a row's HEAD_DIM values are contiguous).
#pragma once

#include <cstdint>

#include "device/ptx/wgmma.h"
#include "device/smem_tile.h"
#include "device/warp_tile.h"

namespace fa::tile {

#if defined(__CUDACC__)

template <int COLS>
__device__ __forceinline__ void fence_operand(Acc<COLS>& t) {
  ptx::wgmma_fence_operands(t.c);
}
template <int K>
__device__ __forceinline__ void fence_operand(FragA<K>& t) {
  ptx::wgmma_fence_operands(t.a);
}

/// Before a wgmma: the compiler finishes every ordinary write of these registers (the softmax's
/// P, the rescale's O) first, then wgmma.fence orders them before the tensor cores read them.
template <typename... Tiles>
__device__ __forceinline__ void wgmma_begin(Tiles&... tiles) {
  (fence_operand(tiles), ...);
  ptx::wgmma_fence();
}

/// Waits until at most IN_FLIGHT committed wgmma groups are still running, and keeps every
/// ordinary read or write of these accumulators after the wait (registers are not memory: without
/// the operand fence the compiler could move a read of S above wgmma.wait_group).
template <int IN_FLIGHT, typename... Tiles>
__device__ __forceinline__ void wait_for(Tiles&... tiles) {
  ptx::wgmma_wait<IN_FLIGHT>();
  (fence_operand(tiles), ...);
}

/// S = Q·Kᵀ for the warpgroup's 64 query rows [wg_row0, wg_row0 + 64) of `q_tile` (wg_row0 a
/// multiple of 64) and the N keys of `k_tile`: D / 16 wgmmas, one per 16 head dims. Issued, not
/// waited for; S needs no zeros first (the first wgmma does not accumulate).
template <int D, int N, int QROWS, typename Elem>
__device__ __forceinline__ void mma_qk_async(Acc<N>& s, SmemTile<QROWS, WgmmaLayout<QROWS, D>, Elem> q_tile,
                                             int wg_row0, SmemTile<N, WgmmaLayout<N, D>, Elem> k_tile) {
  const uint32_t q = q_tile.addr() + uint32_t(wg_row0) * 128, k = k_tile.addr();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    // 16 head dims: panel kk / 4, and 32 bytes further along its 128-byte rows per step inside it.
    const uint32_t panel = kk / 4, step = (kk % 4) * 32;
    ptx::wgmma_ss<N, Elem>(s.c, ptx::smem_desc_k_major(q + panel * QROWS * 128 + step),
                           ptx::smem_desc_k_major(k + panel * N * 128 + step), kk > 0);
  }
}

/// O's columns [C0, D) += P's 16 keys at `a` times V's 16 rows at `v`: one wgmma per 128 columns (the
/// widest the wrappers issue) and one of 64 for what is left (D = 192), each reading V from the
/// chunk's first 64-column panel on and accumulating into its own Acc registers. Elem: V's and P's type.
template <int C0, int D, int N, typename Elem>
__device__ __forceinline__ void mma_pv_columns(Acc<D>& o, const uint32_t (&a)[4], uint32_t v) {
  constexpr int W = D - C0 < 128 ? D - C0 : 128;
  static_assert(W == 64 || W == 128, "whole 64-column panels");
  ptx::wgmma_rs_mn<W, Elem>(*reinterpret_cast<float(*)[W / 8][4]>(&o.c[C0 / 8]), a,
                            ptx::smem_desc_mn_major(v + (C0 / 64) * N * 128, N * 128), true);
  if constexpr (C0 + W < D) mma_pv_columns<C0 + W, D, N, Elem>(o, a, v);
}

/// O += P·V for the warpgroup's 64 rows: P (64, N) in registers, one FragA per warp (rounded to
/// V's element type), and the N value rows of `v_tile`: N / 16 wgmmas, one per 16 keys (16 rows of
/// 128 bytes further down); past D = 128 each of those is two: 128 + 64 columns of O at D = 192,
/// 128 + 128 at 256. O holds every column of V's panels (OC): at D = 32 and 96 that is 64 and 128,
/// the last 32 the zeros the copy engine put past the tensor's columns (wgmma reads an MN-major
/// operand in whole 64-column panels).
template <int OC, int D, int N, typename Elem>
__device__ __forceinline__ void mma_pv_async(Acc<OC>& o, const FragA<N>& p,
                                             SmemTile<N, WgmmaLayout<N, D>, Elem> v_tile) {
  static_assert(OC == WgmmaLayout<N, D>::kRowElems, "O holds every column of V's panels");
  const uint32_t v = v_tile.addr();
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    if constexpr (OC <= 128)
      ptx::wgmma_rs_mn<OC, Elem>(o.c, p.a[kk], ptx::smem_desc_mn_major(v + kk * 16 * 128, N * 128), true);
    else
      mma_pv_columns<0, OC, N, Elem>(o, p.a[kk], v + kk * 16 * 128);
  }
}

/// The first D columns of O (the head dim's), from an accumulator that holds whole panels (OC).
template <int D, int OC>
__device__ __forceinline__ Acc<D> head_columns(const Acc<OC>& o) {
  static_assert(D <= OC && D % 8 == 0, "whole 8-column fragments of O");
  if constexpr (D == OC) {
    return o;
  } else {
    Acc<D> out;
#pragma unroll
    for (int f = 0; f < D / 8; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) out.c[f][e] = o.c[f][e];
    return out;
  }
}

/// d (64, 64) = Aᵀ·B, where A and B are stored with the product's K as their rows: A = columns
/// [64·a_panel, +64) of `a_tile` (K, ACOLS) and B = columns [64·b_panel, +64) of `b_tile` (K, BCOLS),
/// one 64-column panel each. Both are MN-major operands (their 64 M or N values of a K row are one
/// 128-byte row of the panel), so per 16 K rows the descriptors move 16 rows of 128 bytes down, as
/// mma_pv_async's V does: K / 16 wgmmas. In the backward: dQ = dS·K, from the dSᵀ tile (keys,
/// queries) and the K tile (keys, D). Issued, not waited for; d needs no zeros first.
template <int K, int ACOLS, int BCOLS, typename Elem>
__device__ __forceinline__ void mma_at_b_async(Acc<64>& d, SmemTile<K, WgmmaLayout<K, ACOLS>, Elem> a_tile, int a_panel,
                                               SmemTile<K, WgmmaLayout<K, BCOLS>, Elem> b_tile, int b_panel) {
  const uint32_t a = a_tile.addr() + uint32_t(a_panel) * K * 128, b = b_tile.addr() + uint32_t(b_panel) * K * 128;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    ptx::wgmma_ss_mn<64, Elem>(d.c, ptx::smem_desc_mn_major(a + kk * 16 * 128, K * 128),
                               ptx::smem_desc_mn_major(b + kk * 16 * 128, K * 128), kk > 0);
}

// ---- The same three products with their descriptors advanced by addition (step 33).
// Each form above builds two descriptors per k-step from addresses: the address plus the k-step's
// offset, masked, shifted and or-ed into the fields, then moved into the uniform registers wgmma
// reads them from (about 12 integer instructions a wgmma in the backward's SASS). The forms below
// take the same arguments after the tag `by_addition`, build each operand's descriptor once per
// call, and add the k-step's offset over 16 to its low half (ptx::SmemDesc): one add per operand
// and k-step. The products are bit for bit the same; the forward keeps the forms above.
struct ByAddition {};
inline constexpr ByAddition by_addition{};

template <int D, int N, int QROWS, typename Elem>
__device__ __forceinline__ void mma_qk_async(ByAddition, Acc<N>& s, SmemTile<QROWS, WgmmaLayout<QROWS, D>, Elem> q_tile,
                                             int wg_row0, SmemTile<N, WgmmaLayout<N, D>, Elem> k_tile) {
  const ptx::SmemDesc q = ptx::split_desc(ptx::smem_desc_k_major(q_tile.addr() + uint32_t(wg_row0) * 128));
  const ptx::SmemDesc k = ptx::split_desc(ptx::smem_desc_k_major(k_tile.addr()));
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t panel = kk / 4, step = (kk % 4) * 32;
    ptx::wgmma_ss<N, Elem>(s.c, (q + (panel * QROWS * 128 + step)).bits(), (k + (panel * N * 128 + step)).bits(),
                           kk > 0);
  }
}

template <int OC, int D, int N, typename Elem>
__device__ __forceinline__ void mma_pv_async(ByAddition, Acc<OC>& o, const FragA<N>& p,
                                             SmemTile<N, WgmmaLayout<N, D>, Elem> v_tile) {
  static_assert(OC == WgmmaLayout<N, D>::kRowElems && OC <= 128, "O holds every column of V's panels");
  const ptx::SmemDesc v = ptx::split_desc(ptx::smem_desc_mn_major(v_tile.addr(), N * 128));
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) ptx::wgmma_rs_mn<OC, Elem>(o.c, p.a[kk], (v + kk * 16 * 128).bits(), true);
}

template <int K, int ACOLS, int BCOLS, typename Elem>
__device__ __forceinline__ void mma_at_b_async(ByAddition, Acc<64>& d, SmemTile<K, WgmmaLayout<K, ACOLS>, Elem> a_tile,
                                               int a_panel, SmemTile<K, WgmmaLayout<K, BCOLS>, Elem> b_tile,
                                               int b_panel) {
  const ptx::SmemDesc a =
      ptx::split_desc(ptx::smem_desc_mn_major(a_tile.addr() + uint32_t(a_panel) * K * 128, K * 128));
  const ptx::SmemDesc b =
      ptx::split_desc(ptx::smem_desc_mn_major(b_tile.addr() + uint32_t(b_panel) * K * 128, K * 128));
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    ptx::wgmma_ss_mn<64, Elem>(d.c, (a + kk * 16 * 128).bits(), (b + kk * 16 * 128).bits(), kk > 0);
}

#endif  // __CUDACC__

}  // namespace fa::tile
