// The warp-tile vocabulary: the tiles one warp holds in registers, and the named operations of
// FlashAttention on them, so that a tensor-core kernel's KV loop reads like the algorithm:
//
//   s = mma_qk(q, k_tile);                            S = Q·Kᵀ             (16, BLOCK_N) fp32
//   apply_mask(s, row0, col0, mask);                  masked scores = -inf
//   m_new = row_max(s, m_i);                          running row max
//   p = exp2_rows(s, scale_log2, m_scaled);           P = 2^(c·s − c·m)
//   rescale(o_i, alpha);                              O ← α·O
//   mma_pv(o_i, to_bf16(p), v_tile);                  O += P·V             (16, HEAD_DIM) fp32
//
// The products take their element type from the shared tiles they read (SmemTile's Elem: bf16, or
// fp16 in the production forwards' fp16 kernels), and P is rounded to the same type (to_a<Elem>;
// to_bf16 is to_a<bf16>): the instructions are mma.sync's .bf16 or .f16 form, everything else alike.
//
// Every operation is a loop over mma fragments, fully unrolled: it compiles to exactly the
// instructions the hand-written fragment code would (the steps' SASS checks count them), and it
// is tested on the GPU against a CPU model of the fragment layout (steps/04_fp32_state/tests).
//
// One warp owns 16 query rows. With g = lane / 4 and t = lane % 4 (device/ptx/mma.h), a lane
// holds, of every 16-row tile, the elements of rows g and g + 8: those are the two entries of a
// `Rows`. Element e (0..3) of 8-column fragment f of an `Acc` is row g + 8·(e / 2), column
// 8·f + 2t + e % 2 (ptx::mma_c_row / mma_c_col). A row's COLS columns are spread over the 4
// lanes of its quad, COLS / 4 each, so a full-row reduction (row_max, quad_sum) ends with two
// shuffles.
#pragma once

#include <cmath>
#include <cstdint>

#include "device/mask.h"  // FA_HD
#include "device/ptx/ldmatrix.h"
#include "device/ptx/mma.h"
#include "device/smem_tile.h"

namespace fa::tile {

/// The two rows of a 16-row tile that one lane holds: index 0 is row g = lane / 4, index 1 is
/// row g + 8. m_i, l_i, alpha and 1/l of the softmax are `Rows`.
struct Rows {
  float r[2];
};
FA_HD Rows rows(float x) {
  return {{x, x}};
}
FA_HD Rows operator+(Rows a, Rows b) {
  return {{a.r[0] + b.r[0], a.r[1] + b.r[1]}};
}
FA_HD Rows operator*(Rows a, Rows b) {
  return {{a.r[0] * b.r[0], a.r[1] * b.r[1]}};
}
FA_HD Rows operator*(Rows a, float c) {
  return {{a.r[0] * c, a.r[1] * c}};
}

/// Row (0..15) of entry `r` of a lane's Rows.
FA_HD int rows_row(int lane, int r) {
  return lane / 4 + 8 * r;
}

/// A (16, COLS) fp32 tile of one warp as COLS / 8 mma accumulator fragments: S, P and O.
template <int COLS>
struct Acc {
  static_assert(COLS % 16 == 0, "whole 16-column blocks");
  static constexpr int kFrags = COLS / 8;
  float c[COLS / 8][4];
};

/// A (16, K) 16-bit tile of one warp as K / 16 mma A-operand fragments: Q, and P for P·V. The
/// registers hold bf16 or fp16 pairs; which is the product's to know (its shared operand's Elem).
template <int K>
struct FragA {
  static_assert(K % 16 == 0, "whole 16-column blocks");
  static constexpr int kFrags = K / 16;
  uint32_t a[K / 16][4];
};

#if defined(__CUDACC__)

__device__ __forceinline__ int lane_id() {
  return int(threadIdx.x) % 32;
}

/// threadIdx.x, opaque to the compiler: whatever is computed from it is computed where it is used,
/// every time, instead of once before a loop and kept in registers across it (step 33: the dQ
/// atomics' per-thread addresses, hoisted, took the registers the loop needed, and it spilled).
__device__ __forceinline__ unsigned opaque_thread_index() {
  unsigned t = threadIdx.x;
  asm volatile("" : "+r"(t));
  return t;
}

/// An accumulator tile of zeros.
template <int COLS>
__device__ __forceinline__ Acc<COLS> zeros() {
  Acc<COLS> t;
#pragma unroll
  for (int f = 0; f < COLS / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) t.c[f][e] = 0.0f;
  return t;
}

/// Rows [row0, row0 + 16) of a shared tile as A fragments (ldmatrix x4 per 16 columns): Q.
template <int K, int ROWS, typename Layout, typename Elem>
__device__ __forceinline__ FragA<K> load_a(SmemTile<ROWS, Layout, Elem> tile, int row0) {
  static_assert(Layout::kCols == K, "the tile's width is the operand's K");
  const int lane = lane_id();
  const unsigned lane_bytes = 2 * Layout::offset(row0 + ptx::ldsm_a_row(lane), ptx::ldsm_a_colblock(lane) * 8);
  FragA<K> q;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) ptx::ldmatrix_x4(q.a[kk], tile.addr() + Layout::move(lane_bytes, 0, kk));
  return q;
}

/// S = Q·Kᵀ: (16, D) Q fragments times the (N, D) key tile, transposed: a (16, N) fp32 tile.
/// Per 16 dims, the B fragments of all N keys are loaded (ldmatrix, no .trans: K's rows are
/// already the "col" operand) before the 2·N/16 mmas that use them.
template <int D, int N, typename Layout, typename Elem>
__device__ __forceinline__ Acc<N> mma_qk(const FragA<D>& q, SmemTile<N, Layout, Elem> k_tile) {
  static_assert(Layout::kCols == D, "keys are rows of D elements");
  const int lane = lane_id();
  const unsigned lane_bytes = 2 * Layout::offset(ptx::ldsm_k_row(lane), ptx::ldsm_k_colblock(lane) * 8);
  Acc<N> s = zeros<N>();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t k_frag[N / 16][4];  // B fragments of key blocks 2nn and 2nn+1 (16 keys × 16 dims)
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) ptx::ldmatrix_x4(k_frag[nn], k_tile.addr() + Layout::move(lane_bytes, nn, kk));
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      ptx::mma_16816<Elem>(s.c[2 * nn], q.a[kk], k_frag[nn][0], k_frag[nn][1]);
      ptx::mma_16816<Elem>(s.c[2 * nn + 1], q.a[kk], k_frag[nn][2], k_frag[nn][3]);
    }
  }
  return s;
}

/// O_t += P_t·V for M row tiles of (16, N) bf16 P fragments and the (N, D) value tile: each
/// accumulates into a (16, D) fp32 tile. V is read with ldmatrix.trans (P·V needs it dim-major; it
/// is stored key-major), and each V fragment is loaded once and feeds M·2 mmas. mma_pv is M = 1;
/// mma_pv_tiles (step 09 on) gives a warp's two row tiles one call.
template <int M, int D, int N, typename Layout, typename Elem>
__device__ __forceinline__ void mma_pv_rows(Acc<D>* o, const FragA<N>* p, SmemTile<N, Layout, Elem> v_tile,
                                            int c0 = 0) {
  // D of V's columns from column c0 (a multiple of 16): all of them but in the backward's dQ = dS·K,
  // which splits them over warps (device/backward_tile.h's mma_pv_cols).
  static_assert(D % 16 == 0 && D <= Layout::kCols, "whole 16-column blocks of V");
  const int lane = lane_id();
  const unsigned lane_bytes = 2 * Layout::offset(ptx::ldsm_v_row(lane), ptx::ldsm_v_colblock(lane) * 8);
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
#pragma unroll
    for (int dd = 0; dd < D / 16; ++dd) {
      uint32_t v_frag[4];  // B fragments of dim blocks 2dd and 2dd+1 (16 keys × 16 dims), transposed
      ptx::ldmatrix_x4_trans(v_frag, v_tile.addr() + Layout::move(lane_bytes, kk, c0 / 16 + dd));
#pragma unroll
      for (int t = 0; t < M; ++t) {
        ptx::mma_16816<Elem>(o[t].c[2 * dd], p[t].a[kk], v_frag[0], v_frag[1]);
        ptx::mma_16816<Elem>(o[t].c[2 * dd + 1], p[t].a[kk], v_frag[2], v_frag[3]);
      }
    }
  }
}

/// O += P·V for one warp's 16 rows.
template <int D, int N, typename Layout, typename Elem>
__device__ __forceinline__ void mma_pv(Acc<D>& o, const FragA<N>& p, SmemTile<N, Layout, Elem> v_tile) {
  static_assert(Layout::kCols == D, "values are rows of D elements");
  mma_pv_rows<1>(&o, &p, v_tile);
}

/// An fp32 accumulator tile rounded to A fragments of Elem (bf16 or fp16), in registers: two
/// adjacent 16×8 accumulator fragments hold exactly one 16×16 A fragment's elements
/// (device/ptx/mma.h). P must be rounded to the type of the V it multiplies: the instruction reads
/// both operands as one type.
template <typename Elem, int N>
__device__ __forceinline__ FragA<N> to_a(const Acc<N>& p) {
  FragA<N> a;
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) ptx::accumulators_to_a<Elem>(a.a[kk], p.c[2 * kk], p.c[2 * kk + 1]);
  return a;
}

/// to_a in bf16, the lessons' one type.
template <int N>
__device__ __forceinline__ FragA<N> to_bf16(const Acc<N>& p) {
  return to_a<bf16>(p);
}

/// S_t = Q_t·Kᵀ for the M row tiles t of a warp (step 09 on): tile t is rows
/// [row0 + 16·t, row0 + 16·t + 16) of the shared Q tile. Per 16 dims, the A fragments of the M row
/// tiles (ldmatrix from shared memory: Q is not kept in registers) and the B fragments of all N
/// keys are loaded once, then each K fragment feeds M·2 mmas instead of 2. D < the tiles' columns:
/// the products over the first D (the decode kernel's D = 32, 96, 192 in wider tiles).
template <int M, int N, int QROWS, typename QLayout, typename KLayout, typename Elem, int D = KLayout::kCols>
__device__ __forceinline__ void mma_qk_tiles(Acc<N> (&s)[M], SmemTile<QROWS, QLayout, Elem> q_tile, int row0,
                                             SmemTile<N, KLayout, Elem> k_tile) {
  static_assert(QLayout::kCols == KLayout::kCols && D <= KLayout::kCols && D % 16 == 0,
                "queries and keys are rows of the same tile width, D of them multiplied");
  const int lane = lane_id();
  const unsigned q_bytes = 2 * QLayout::offset(row0 + ptx::ldsm_a_row(lane), ptx::ldsm_a_colblock(lane) * 8);
  const unsigned k_bytes = 2 * KLayout::offset(ptx::ldsm_k_row(lane), ptx::ldsm_k_colblock(lane) * 8);
#pragma unroll
  for (int t = 0; t < M; ++t) s[t] = zeros<N>();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t q_frag[M][4];       // A fragments of the M row tiles, dims 16kk .. 16kk + 15
    uint32_t k_frag[N / 16][4];  // B fragments of key blocks 2nn and 2nn+1 (16 keys × 16 dims)
#pragma unroll
    for (int t = 0; t < M; ++t) ptx::ldmatrix_x4(q_frag[t], q_tile.addr() + QLayout::move(q_bytes, t, kk));
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) ptx::ldmatrix_x4(k_frag[nn], k_tile.addr() + KLayout::move(k_bytes, nn, kk));
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn)
#pragma unroll
      for (int t = 0; t < M; ++t) {
        ptx::mma_16816<Elem>(s[t].c[2 * nn], q_frag[t], k_frag[nn][0], k_frag[nn][1]);
        ptx::mma_16816<Elem>(s[t].c[2 * nn + 1], q_frag[t], k_frag[nn][2], k_frag[nn][3]);
      }
  }
}

/// O_t += P_t·V for the M row tiles t of a warp (step 09 on), each V fragment loaded once.
template <int M, int D, int N, typename Layout, typename Elem>
__device__ __forceinline__ void mma_pv_tiles(Acc<D> (&o)[M], const FragA<N> (&p)[M], SmemTile<N, Layout, Elem> v_tile) {
  static_assert(Layout::kCols == D, "values are rows of D elements");
  mma_pv_rows<M>(o, p, v_tile);
}

/// Sets every score whose (row, col) the mask hides to -inf. `row0` is the global query row of
/// the tile's row 0, `col0` the global key of its column 0; mask(row, col) is true when visible.
template <int N, typename Mask>
__device__ __forceinline__ void apply_mask(Acc<N>& s, int row0, int col0, const Mask& mask) {
  const int lane = lane_id();
#pragma unroll
  for (int f = 0; f < N / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (!mask(row0 + ptx::mma_c_row(lane, e), col0 + f * 8 + ptx::mma_c_col(lane, e))) s.c[f][e] = -INFINITY;
}

/// Sum of the four lanes of each quad: a row's total from the lanes' partial values.
__device__ __forceinline__ Rows quad_sum(Rows x) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    x.r[r] += __shfl_xor_sync(0xffffffffu, x.r[r], 1);
    x.r[r] += __shfl_xor_sync(0xffffffffu, x.r[r], 2);
  }
  return x;
}

/// max(m, the largest score of each row of s), over the whole row (all four lanes of the quad).
template <int N>
__device__ __forceinline__ Rows row_max(const Acc<N>& s, Rows m) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int f = 0; f < N / 8; ++f) m.r[r] = fmaxf(m.r[r], fmaxf(s.c[f][2 * r], s.c[f][2 * r + 1]));
    m.r[r] = fmaxf(m.r[r], __shfl_xor_sync(0xffffffffu, m.r[r], 1));
    m.r[r] = fmaxf(m.r[r], __shfl_xor_sync(0xffffffffu, m.r[r], 2));
  }
  return m;
}

/// This lane's part of each row's sum of p (its N/4 columns); quad_sum completes it. The
/// softmax keeps l_i as these partial sums and completes them once, after the KV loop.
template <int N>
__device__ __forceinline__ Rows row_sum(const Acc<N>& p) {
  Rows l;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l.r[r] = p.c[0][2 * r] + p.c[0][2 * r + 1];
#pragma unroll
    for (int f = 1; f < N / 8; ++f) l.r[r] += p.c[f][2 * r] + p.c[f][2 * r + 1];
  }
  return l;
}

/// The exp2 offset of a row whose running max is m: c·m, or 0 while m is still -inf (every key
/// seen so far masked), so that -inf − (−inf) never makes a NaN.
__device__ __forceinline__ Rows exp2_offset(Rows m, float scale_log2) {
  Rows o;
#pragma unroll
  for (int r = 0; r < 2; ++r) o.r[r] = m.r[r] == -INFINITY ? 0.0f : m.r[r] * scale_log2;
  return o;
}

/// alpha = 2^(c·m_old − offset): what the running sum and output are multiplied by when the row
/// max moves from m_old to the max whose exp2_offset is `offset`. 0 on the first tile (m_old = -inf).
__device__ __forceinline__ Rows rescale_factor(Rows m_old, float scale_log2, Rows offset) {
  Rows a;
#pragma unroll
  for (int r = 0; r < 2; ++r) a.r[r] = ptx::exp2_approx(m_old.r[r] * scale_log2 - offset.r[r]);
  return a;
}

/// P = 2^(c·s − offset) per element (one FFMA and one MUFU.EX2 each), offset per row.
template <int N>
__device__ __forceinline__ Acc<N> exp2_rows(const Acc<N>& s, float scale_log2, Rows offset) {
  Acc<N> p;
#pragma unroll
  for (int f = 0; f < N / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) p.c[f][e] = ptx::exp2_approx(s.c[f][e] * scale_log2 - offset.r[e / 2]);
  return p;
}

/// True for the whole warp when, in any of the 16 rows of the tile, the new max is more than
/// `threshold` above the old one in exp2 units (c·(m_new − m_old) > threshold): the rows' state
/// must then be rescaled. Otherwise every row may keep its old max, and its p = 2^(c·s − c·m_old)
/// stays ≤ 2^threshold. A row whose old max is -inf and new one finite has moved (+inf); a row
/// still at -inf has not (-inf − −inf is NaN, and NaN > threshold is false). The answer is
/// warp-uniform (one vote), so the rescale it guards is a branch no lane diverges on.
__device__ __forceinline__ bool any_max_moved(Rows m_old, Rows m_new, float scale_log2, float threshold) {
  const bool moved = (m_new.r[0] - m_old.r[0]) * scale_log2 > threshold ||  //
                     (m_new.r[1] - m_old.r[1]) * scale_log2 > threshold;
  return __any_sync(0xffffffffu, moved);
}

/// Multiplies each row of o by its factor.
template <int D>
__device__ __forceinline__ void rescale(Acc<D>& o, Rows alpha) {
#pragma unroll
  for (int f = 0; f < D / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) o.c[f][e] *= alpha.r[e / 2];
}

/// The natural-log LSE of each row from the final softmax state: ln Σ_j e^(scale·s_ij) =
/// scale·m + ln(l), with scale = ln(2)·scale_log2 (m is in raw score units, l the full row sum).
/// -inf for a row that saw no key (l = 0): e^LSE = 0 is exactly its empty sum.
__device__ __forceinline__ Rows log_sum_exp(Rows m, Rows l, float scale_log2) {
  constexpr float kLn2 = 0.6931471805599453f;
  Rows lse;
#pragma unroll
  for (int r = 0; r < 2; ++r) lse.r[r] = l.r[r] > 0.0f ? m.r[r] * (scale_log2 * kLn2) + logf(l.r[r]) : -INFINITY;
  return lse;
}

/// 1/l per row, and 0 where l = 0 (a row that saw no key: O = 0, not NaN).
__device__ __forceinline__ Rows safe_inverse(Rows l) {
  Rows inv;
#pragma unroll
  for (int r = 0; r < 2; ++r) inv.r[r] = l.r[r] > 0.0f ? 1.0f / l.r[r] : 0.0f;
  return inv;
}

/// Two adjacent columns of a row, stored as the destination's element type: a bf16 or fp16 pair in
/// one 4-byte store, or an fp32 pair in one 8-byte store.
__device__ __forceinline__ void store_pair(bf16* dst, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(dst) = ptx::pack_bf16x2(lo, hi);
}
__device__ __forceinline__ void store_pair(fp16* dst, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(dst) = ptx::pack_f16x2(lo, hi);
}
__device__ __forceinline__ void store_pair(float* dst, float lo, float hi) {
  *reinterpret_cast<float2*>(dst) = make_float2(lo, hi);
}

/// Writes the warp's 16 rows of o, each multiplied by its scale, to global memory as T (bf16 or
/// fp16: the output; float: step 27's partial outputs in the workspace): row r of o goes to
/// dst + (row0 + r)·stride, and rows with row0 + r >= valid_rows (past N_q) are not written.
/// Two adjacent columns per store, straight from the accumulators.
template <int D, typename T>
__device__ __forceinline__ void store_rows(T* dst, int64_t stride, const Acc<D>& o, Rows scale, int row0,
                                           int valid_rows) {
  const int lane = lane_id();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + rows_row(lane, r);
    if (row >= valid_rows) continue;
    T* dst_row = dst + row * stride;
#pragma unroll
    for (int f = 0; f < D / 8; ++f)
      store_pair(dst_row + f * 8 + ptx::mma_c_col(lane, 0), o.c[f][2 * r] * scale.r[r], o.c[f][2 * r + 1] * scale.r[r]);
  }
}

/// store_rows with each row at its own address: row r of o goes to row_dst(row0 + r), as the
/// element type row_dst points to (step 28's packed rows go to several heads). Kept apart from
/// the strided form for the same reason as load_rows_async: the steps' instructions stay theirs.
template <int D, typename RowDst>
__device__ __forceinline__ void store_rows(const Acc<D>& o, Rows scale, int row0, int valid_rows,
                                           const RowDst& row_dst) {
  const int lane = lane_id();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + rows_row(lane, r);
    if (row >= valid_rows) continue;
    auto* dst_row = row_dst(row);
#pragma unroll
    for (int f = 0; f < D / 8; ++f)
      store_pair(dst_row + f * 8 + ptx::mma_c_col(lane, 0), o.c[f][2 * r] * scale.r[r], o.c[f][2 * r + 1] * scale.r[r]);
  }
}

/// store_rows into shared memory (step 16): rows [row0, row0 + 16) of a WgmmaLayout tile, each
/// value times its row's scale and rounded to the tile's element type. Every row is written; the
/// copy out to global memory is what leaves out rows past N. row0 is a multiple of 8.
///
/// Addresses: in a 64-column panel, (row, col) sits at byte row·128 + ((col/8 ^ row%8)·16) +
/// (col%8)·2. A lane's rows g and g + 8 share row % 8, so every one of its stores is one address
/// `at` (its row g, column 2t, in panel 0) XOR the chunk's 16-byte step, plus a constant: one
/// LOP3 with an immediate per store. The 8 rows of one store land in 8 different chunks: no bank
/// conflicts.
template <int D, int ROWS, typename Elem>
__device__ __forceinline__ void store_rows_to_tile(SmemTile<ROWS, WgmmaLayout<ROWS, D>, Elem> tile, const Acc<D>& o,
                                                   Rows scale, int row0) {
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  uint32_t at = tile.addr() + uint32_t(row0 + g) * 128 + uint32_t(g % 8) * 16 + uint32_t(t) * 4;
  // Computed here, on every call: the compiler would otherwise hoist all of it out of a
  // persistent kernel's tile loop and keep the results live across the KV loop (a spill).
  asm volatile("" : "+r"(at));
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int f = 0; f < D / 8; ++f)
      ptx::st_shared_b32((at ^ uint32_t((f % 8) * 16)) + uint32_t((f / 8) * ROWS * 128 + r * 8 * 128),
                         ptx::pack_x2<Elem>(o.c[f][2 * r] * scale.r[r], o.c[f][2 * r + 1] * scale.r[r]));
  }
}

/// Writes one fp32 value per row, values[row] for rows [row0, row0 + 16) below valid_rows, from
/// the first lane of each quad (the four lanes hold the same row value).
__device__ __forceinline__ void store_row_values(float* dst, Rows x, int row0, int valid_rows) {
  const int lane = lane_id();
  if (lane % 4 != 0) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + rows_row(lane, r);
    if (row < valid_rows) dst[row] = x.r[r];
  }
}

/// store_row_values with each row's value at its own address, row_dst(row).
template <typename RowDst>
__device__ __forceinline__ void store_row_values(Rows x, int row0, int valid_rows, const RowDst& row_dst) {
  const int lane = lane_id();
  if (lane % 4 != 0) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + rows_row(lane, r);
    if (row < valid_rows) *row_dst(row) = x.r[r];
  }
}

#endif  // __CUDACC__

}  // namespace fa::tile
