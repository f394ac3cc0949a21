// The production decode on mma.sync (any sm_80+ GPU), generalised from step 28: GQA-packed Q tiles
// (the query heads of a KV head are the rows of one tile, device/gqa_pack.h), each tile's keys split
// into S ranges computed by blocks of their own (step 27), partial results merged by their LSEs.
// Not a lesson: the steps never include it. Both production forwards (kernels 100 and 101) hand it
// the calls it is for (accepts()): a group's rows fit one tile, N_q·G <= 64 (decode, speculative
// decoding, a short chunk of prefill), and either the caller gave a workspace, so the keys can be
// split, or a length per sequence (step 29's ragged caches) or a block table (step 30's paged
// caches), which only this kernel reads, or the packed grid fills the GPU without splitting; and
// packed sequences (step 31's varlen): every such call of the mma.sync forward, whatever its length,
// since only this kernel reads their offsets there; of the Hopper forward, which reads them too,
// the decode-sized ones. On an H200 it reads the KV cache at the memory's rate, 3× what the Hopper forward's
// 128-row tiles reach on one real row.
//
// What step 28 hard-wired is the production layer's here: the epilogue (PackedStore, O in T or the
// fp32 partials, kernels/epilogue.h) and the tuner's configuration list; the mask is the call's
// causal flag in either alignment, as CausalFlag, on each row's query. The score modifications
// (softcap, ALiBi, sinks; kernels/score_mod.h) run in kernels of their own (MODS), each packed row
// with its own head's slope and sink; with a split, a row's sink is added once, by the combine.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "device/gqa_pack.h"
#include "device/mask.h"
#include "device/paged_kv.h"
#include "device/ptx/cp_async.h"
#include "device/ptx/sync.h"
#include "device/smem_tile.h"
#include "device/split_combine.h"
#include "device/varlen.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "fa/registry.h"
#include "kernels/epilogue.h"
#include "kernels/kernels.h"
#include "kernels/launch.h"
#include "kernels/score_mod.h"
#include "kernels/sequences.h"
#include "library/autotune.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/split_kv.h"
#include "library/tuner.h"

namespace fa::kernels::decode {
namespace {

using namespace fa::tile;
using fa::ptx::cp_async_commit;
using fa::ptx::cp_async_wait;

constexpr int kWarpSize = 32;
constexpr int kMmaRows = 16;
constexpr int kAppendThreads = 128;            // the append: a block copies one new row at a time
constexpr int64_t kAppendMaxBlocks = 1 << 16;  // ... striding over B·seqlen_new rows past this many

// One kernel configuration: query rows per block, keys per K/V tile, K/V tiles in flight, 16-row
// mma tiles per warp (step 28: 16 rows per warp at D = 128, where 32 spilled), and the warps that
// share one row tile, each taking BLOCK_N / KEY_WARPS keys of every K/V tile (KEY_WARPS > 1: a
// decode group of 4 or 8 rows fills a quarter or half of one 16-row tile; with the keys split, the
// block does one warp's mma work per K/V tile instead of four, and its warps merge their partial
// rows at the end by their maxima, as split-KV's combine does).
// The columns of the kernel's tiles at head dim D: the swizzle's power of two of at least 64 (step
// 08's layout, which the paged loads and the GQA-packed Q rows are written for). At D = 32, 96 and
// 192 the last columns of every row are neither copied nor read: Q·Kᵀ multiplies D of them, P·V
// reads D of V's, and the copies stop at D (device/smem_tile.h's COLS).
FA_HD constexpr int decode_tile_cols(int d) {
  return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

// COL_WARPS > 1 (D = 256): O's columns split over that many warps, each holding D / COL_WARPS of
// them. Each computes the whole S = Q·Kᵀ of its rows (the same scores, the same softmax: the product
// is repeated, the memory read is not) and multiplies P by its own columns of V. At D = 256 one warp
// holding all of O (128 fp32 registers a thread) spilled at 255 registers in every configuration;
// decode reads memory, so the repeated product is cheap where registers are not.
template <int BLOCK_M_, int BLOCK_N_, int STAGES_, int M_TILES_, int KEY_WARPS_ = 1, int COL_WARPS_ = 1>
struct Config {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int STAGES = STAGES_;
  static constexpr int M_TILES = M_TILES_;
  static constexpr int KEY_WARPS = KEY_WARPS_;
  static constexpr int COL_WARPS = COL_WARPS_;
  static constexpr const char* VARIANT = KEY_WARPS_ > 1
                                             ? (COL_WARPS_ > 1 ? "keys and O columns over warps" : "keys over warps")
                                             : (COL_WARPS_ > 1 ? "O columns over warps"
                                                               : (M_TILES_ == 1 ? "16 rows/warp" : "32 rows/warp"));
  static constexpr int ROWS_PER_WARP = kMmaRows * M_TILES;
  static constexpr int NUM_WARPS = BLOCK_M / ROWS_PER_WARP * KEY_WARPS * COL_WARPS;
  static constexpr int WARP_N = BLOCK_N / KEY_WARPS;  // keys of a K/V tile one warp multiplies
  static_assert(KEY_WARPS == 1 || (BLOCK_M == ROWS_PER_WARP && M_TILES == 1), "keys split over one row tile's warps");
  static_assert(COL_WARPS == 1 || M_TILES == 1, "O's columns split over warps of 16 rows");
  static_assert(WARP_N % 16 == 0, "whole 16-key blocks per warp");
  // __launch_bounds__'s blocks per SM: 0 says nothing (the compiler's choice); 1 lets the keys-over-
  // warps configurations take the registers their merge needs (left to itself, the compiler
  // capped them at 168 at D = 128 and spilled; shared memory holds two blocks per SM either way).
  static constexpr int MIN_BLOCKS = KEY_WARPS > 1 ? 1 : 0;
  static constexpr int NUM_THREADS = NUM_WARPS * kWarpSize;
  static constexpr float RESCALE_THRESHOLD = 8.0f;  // exp2 units: P <= 2^8 between rescales
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return SwizzledLayout<decode_tile_cols(HEAD_DIM)>::bytes(BLOCK_M + STAGES * 2 * BLOCK_N);
  }
};

// The largest head dim it has: every one the forwards have.
constexpr int64_t kMaxHeadDim = 256;

// The rows of a group that fit one tile of every configuration: accepts() takes no more, except for
// varlen calls (library/split_kv.h sizes the decode workspace from it).
constexpr int kMaxPackedRows = int(kDecodeMaxPackedRows);
static_assert(kDecodeKvTile == 64, "every configuration's BLOCK_N: the workspace bound counts these tiles");

// ---- the kernel --------------------------------------------------------------------------------

// grid = (packed Q tiles × splits, B·H_q / pack over y and z). SPLIT: the block's range of keys
// goes to the workspace as fp32 partials (splits > 1); without, O and the LSE directly. Sequences
// (kernels/sequences.h): Batched, or Packed for a varlen call, one instantiation each, so that a
// plain decode does not carry the offsets (with them, as step 31 does, a plain decode ran 4-8 %
// slower than step 30, which has none).
// The score modifications on a packed tile (kernels/score_mod.h's ScoreMods, whose rows here are
// each their own head: row r is query r / pack of head h0 + r % pack): the cap on every score, and
// ALiBi's bias with each of the lane's two rows' own slope (raw units, 0: none), key col0 + c of the
// sequence, its diagonal alibi_offset = N_kv − N_q of the sequence.
template <int N>
__device__ __forceinline__ void packed_score_mods(Acc<N>& s, const ScoreModArgs& a, Rows slope, int row0, int col0,
                                                  int pack, int alibi_offset) {
  const int lane = lane_id();
#pragma unroll
  for (int f = 0; f < N / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s.c[f][e];
      if (a.cap != 0.0f) x = a.cap * tanh_fast(x * a.inv_cap);
      const int d =
          packed_query(row0 + ptx::mma_c_row(lane, e), pack) + alibi_offset - (col0 + f * 8 + ptx::mma_c_col(lane, e));
      x -= slope.r[e / 2] * float(d < 0 ? -d : d);
      s.c[f][e] = x;
    }
}

// The values of the lane's two rows of the 16-row tile from packed row row0, by head: ALiBi's slope
// or a sink (arr[b·stride + h] · inv_scale), `none` for rows past the group's.
__device__ __forceinline__ Rows packed_head_values(const float* arr, int64_t stride_b, int64_t b, int64_t h0, int row0,
                                                   int n_rows, int pack, float inv_scale, float none) {
  Rows v;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + lane_id() / 4 + 8 * r;
    v.r[r] = row < n_rows ? arr[b * stride_b + h0 + row % pack] * inv_scale : none;
  }
  return v;
}

// T: the element type of Q, K, V and O: bf16, or fp16 where the build compiles it (FA_DTYPES), as the forwards'.
template <int HEAD_DIM, typename Cfg, bool SPLIT, typename Sequences, bool MODS = false, typename T = bf16>
__global__ void __launch_bounds__(Cfg::NUM_THREADS, Cfg::MIN_BLOCKS)
    decode_kernel(const AttentionParams params, const float scale_log2, const int splits, float* o_part,
                  float* lse_part, const int64_t split_rows, const int pack, const ScoreModArgs mods) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, NUM_THREADS = Cfg::NUM_THREADS;
  constexpr int STAGES = Cfg::STAGES, M_TILES = Cfg::M_TILES, ROWS_PER_WARP = Cfg::ROWS_PER_WARP;
  constexpr int KEY_WARPS = Cfg::KEY_WARPS, WARP_N = Cfg::WARP_N, COL_WARPS = Cfg::COL_WARPS;
  constexpr int O_COLS = HEAD_DIM / COL_WARPS;  // the columns of O one warp holds
  static_assert(O_COLS % 16 == 0, "whole 16-column blocks of V per warp");
  using Layout = SwizzledLayout<decode_tile_cols(HEAD_DIM)>;  // HEAD_DIM of its columns copied and read
  extern __shared__ uint4 smem[];
  const SmemTile<BLOCK_M, Layout, T> q_tile{reinterpret_cast<T*>(smem)};
  const SmemTile<BLOCK_N, Layout, T> kv_ring{q_tile.ptr + BLOCK_M * Layout::kRowElems};  // STAGES × [K, then V]

  // The warp's place: its columns of O (col_warp), then its rows or its keys (warp).
  const int col_warp = int(threadIdx.x) / kWarpSize % COL_WARPS, warp = int(threadIdx.x) / kWarpSize / COL_WARPS;
  const int c0 = col_warp * O_COLS;  // its first column of O and of V
  // Split: the combine may be launched now (programmatic dependent launch, sm_90): its blocks start
  // while these run and wait in wait_for_prior_grid() for the whole grid, so the gap between the two
  // kernels is not on the call's path.
  if constexpr (SPLIT) ptx::allow_dependent_launch();
  // Behind the append this kernel is launched early (launch_early): it may start while the append
  // finishes, and waits for it here, before any access to global memory (the append writes K and V;
  // the kernels before it may still be writing Q or the lengths, or reading the workspace this kernel
  // writes). Launched in order, the wait returns at once.
  ptx::wait_for_prior_grid();

  const int m_tiles = SPLIT ? int(gridDim.x) / splits : int(gridDim.x);
  const int split = SPLIT ? int(blockIdx.x) % splits : 0, tile_m = SPLIT ? int(blockIdx.x) / splits : int(blockIdx.x);
  const int m_block = params.causal ? m_tiles - 1 - tile_m : tile_m;
  const int64_t groups = params.heads_q / pack;
  const int64_t bh = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  if (bh >= params.batch * groups) return;
  const int64_t b = bh / groups, h0 = (bh % groups) * pack;
  const int64_t h_kv = kv_head_of(h0, params.heads_q, params.heads_kv);
  // Step 31's packed sequences: the sequence's queries and keys from its offsets.
  constexpr bool varlen = Sequences::kPacked;
  const SequenceRows q_seq = Sequences::queries(params, b);
  const SequenceRows kv_seq = Sequences::keys(params, b);
  const int n_q = q_seq.length;
  const int n_rows = n_q * pack;  // the group's packed rows
  const int m_start = m_block * BLOCK_M;
  if (m_start >= n_rows) return;  // varlen: a tile past a shorter sequence's queries
  // The sequence's keys (step 29): its own length when the call gives one per sequence, clamped to
  // the caches' capacity N_kv, and the causal diagonal aligned to it.
  // With an append (step 32), seqlen_new more: the rows append_kernel wrote before this kernel.
  const int n_kv_all =
      params.seqlens_kv ? int(min(max(int64_t(params.seqlens_kv[b]) + params.seqlen_new, int64_t(0)), params.seqlen_kv))
                        : kv_seq.length;
  const int64_t offset_all = sequence_causal_offset(params, n_q, n_kv_all);
  const bool causal = params.causal;
  // The tile's KV range is its queries' (the causal flag and the sliding window on query rows:
  // tiles [begin, end), masked before first_full and from end_full on), split S ways; from the
  // block's first key on, K, V and the mask count from that key.
  const QueryRange queries = packed_tile_queries(m_start, BLOCK_M, n_rows, pack);
  const KvTileSpan span = kv_tile_span(queries.first, queries.count, BLOCK_N, n_kv_all, causal, offset_all,
                                       params.window_left, params.window_right);
  const int per_split = SPLIT ? (span.end - span.begin + splits - 1) / splits : span.end - span.begin;
  const int n_begin = span.begin + split * per_split, key0 = n_begin * BLOCK_N;
  const int n_kv = n_kv_all - key0;
  const int64_t offset = offset_all - key0;
  const int n_blocks = max(0, min(span.end, n_begin + per_split) - n_begin);
  // The block's tiles [0, full_from) and [full_end, n_blocks) need the element test.
  const int full_from = span.first_full - n_begin, full_end = max(0, span.end_full - n_begin);
  const PackedWindowMask mask{WindowMask(n_kv, causal, offset, params.window_left, params.window_right), pack};
  const int64_t q_at = sequence_offset(params.q_stride, b, q_seq, varlen);
  const int64_t o_at = sequence_offset(params.o_stride, b, q_seq, varlen);
  const int64_t k_at = sequence_offset(params.k_stride, b, kv_seq, varlen);
  const int64_t v_at = sequence_offset(params.v_stride, b, kv_seq, varlen);
  const T* k_ptr =
      static_cast<const T*>(params.k) + k_at + h_kv * params.k_stride.head + int64_t(key0) * params.k_stride.seq;
  const T* v_ptr =
      static_cast<const T*>(params.v) + v_at + h_kv * params.v_stride.head + int64_t(key0) * params.v_stride.seq;
  // Paged (a block table): key j of the sequence is row j % page_size of page table[j / page_size]
  // of the K and V pools (device/paged_kv.h); the loads below take it from there.
  const bool paged = params.block_table != nullptr;
  const PagedKv pages = paged_kv(params, b, h_kv);
  // The pages of the next K/V tile load_kv issues, looked up one tile ahead of its copies.
  TilePages<NUM_THREADS, BLOCK_N, Layout> next_pages{};
  if (paged) next_pages = lookup_tile_pages<NUM_THREADS, BLOCK_N, Layout>(pages, key0, n_kv);
  const int warp_row = KEY_WARPS > 1 ? 0 : warp * ROWS_PER_WARP;  // this warp's first row in the tile
  const int warp_key = KEY_WARPS > 1 ? warp * WARP_N : 0;         // ... and first key in a K/V tile
  const int row0 = m_start + warp_row;                            // this warp's first packed row

  auto k_tile_of = [&](int n_block) { return next_tile(kv_ring, 2 * (n_block % STAGES)); };
  auto v_tile_of = [&](int n_block) { return next_tile(kv_ring, 2 * (n_block % STAGES) + 1); };
  auto load_kv = [&](int n_block) {
    const int n_start = n_block * BLOCK_N;
    const int kv_rows = min(BLOCK_N, n_kv - n_start);
    if (paged) {
      load_paged_kv_async<NUM_THREADS, BLOCK_N, Layout, HEAD_DIM>(k_tile_of(n_block), v_tile_of(n_block), pages,
                                                                  next_pages, key0 + n_start, kv_rows);
      // The next tile's pages, read now: they arrive while this tile computes, not on its copies' path.
      next_pages =
          lookup_tile_pages<NUM_THREADS, BLOCK_N, Layout>(pages, key0 + n_start + BLOCK_N, n_kv - n_start - BLOCK_N);
      return;
    }
    load_tile_async<NUM_THREADS, BLOCK_N, Layout, T, HEAD_DIM>(
        k_tile_of(n_block), k_ptr + n_start * params.k_stride.seq, params.k_stride.seq, kv_rows);
    load_tile_async<NUM_THREADS, BLOCK_N, Layout, T, HEAD_DIM>(
        v_tile_of(n_block), v_ptr + n_start * params.v_stride.seq, params.v_stride.seq, kv_rows);
  };

  {
    const PackedRows<const T> q_rows{static_cast<const T*>(params.q) + q_at + h0 * params.q_stride.head,
                                     params.q_stride.head, params.q_stride.seq, pack};
    load_rows_async<NUM_THREADS, BLOCK_M, Layout, T, HEAD_DIM>(
        q_tile, [&](int row) { return q_rows(m_start + row); }, min(BLOCK_M, n_rows - m_start));
  }
  cp_async_commit();
  for (int stage = 0; stage < STAGES - 1; ++stage) {
    if (stage < n_blocks) load_kv(stage);
    cp_async_commit();
  }
  cp_async_wait<STAGES - 1>();
  __syncthreads();

  Acc<O_COLS> o_i[M_TILES];
  Rows m_i[M_TILES];
  Rows l_i[M_TILES];
#pragma unroll
  for (int t = 0; t < M_TILES; ++t) {
    o_i[t] = zeros<O_COLS>();
    m_i[t] = rows(-INFINITY);
    l_i[t] = rows(0.0f);
  }
  // MODS: the score modifications, each of the lane's rows with its head's slope; ALiBi's diagonal is
  // the sequence's N_kv − N_q, its keys counted from the sequence's first (key0 + the tile's).
  [[maybe_unused]] Rows slope[M_TILES];
  [[maybe_unused]] const int alibi_offset = n_kv_all - n_q;
  if constexpr (MODS) {
#pragma unroll
    for (int t = 0; t < M_TILES; ++t)
      slope[t] = params.alibi_slopes ? packed_head_values(params.alibi_slopes, params.alibi_slopes_stride_batch, b, h0,
                                                          row0 + kMmaRows * t, n_rows, pack, mods.inv_scale, 0.0f)
                                     : rows(0.0f);
  }

  for (int n_block = 0; n_block < n_blocks; ++n_block) {
    const int n_start = n_block * BLOCK_N;
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (n_block + STAGES - 1 < n_blocks) load_kv(n_block + STAGES - 1);
    cp_async_commit();
    // The warp's keys of the tile: all of them, or its WARP_N (16 rows down keeps the swizzle).
    const SmemTile<WARP_N, Layout, T> k_tile{k_tile_of(n_block).ptr + warp_key * Layout::kRowElems},
        v_tile{v_tile_of(n_block).ptr + warp_key * Layout::kRowElems};

    Acc<WARP_N> s[M_TILES];
    mma_qk_tiles<M_TILES, WARP_N, BLOCK_M, Layout, Layout, T, HEAD_DIM>(s, q_tile, warp_row, k_tile);
    FragA<WARP_N> p[M_TILES];
#pragma unroll
    for (int t = 0; t < M_TILES; ++t) {
      if constexpr (MODS)
        packed_score_mods(s[t], mods, slope[t], row0 + kMmaRows * t, key0 + n_start + warp_key, pack, alibi_offset);
      if (n_block >= full_end || n_block < full_from) apply_mask(s[t], row0 + kMmaRows * t, n_start + warp_key, mask);
      const Rows m_new = row_max(s[t], m_i[t]);
      if (any_max_moved(m_i[t], m_new, scale_log2, Cfg::RESCALE_THRESHOLD)) {
        const Rows alpha = rescale_factor(m_i[t], scale_log2, exp2_offset(m_new, scale_log2));
        rescale(o_i[t], alpha);
        l_i[t] = l_i[t] * alpha;
        m_i[t] = m_new;
      }
      const Acc<WARP_N> p_t = exp2_rows(s[t], scale_log2, exp2_offset(m_i[t], scale_log2));
      p[t] = to_a<T>(p_t);
      l_i[t] = l_i[t] + row_sum(p_t);
    }
    mma_pv_rows<M_TILES>(o_i, p, v_tile, c0);  // V's O_COLS columns from c0
  }

  // ---- keys over warps: each warp holds the tile's rows over its share of the keys. Through the
  // K/V ring (no copy is in flight any more), every warp's O, m and l in fragment order, lane
  // fastest (no bank conflicts); warp 0 scales each by 2^(scale·(m_w − m)) to the rows' common max
  // m and sums them (an empty share, m_w = −inf, weighs 0), and stores the result alone.
  if constexpr (KEY_WARPS > 1) {
    constexpr int WORDS = O_COLS / 2 + 4;  // a lane's O fragments, then m and l for its two rows
    static_assert(KEY_WARPS * COL_WARPS * WORDS * kWarpSize * 4 <= Layout::bytes(STAGES * 2 * BLOCK_N),
                  "the ring holds them");
    float* const part = reinterpret_cast<float*>(kv_ring.ptr);
    const int lane = int(threadIdx.x) % kWarpSize;
    auto word = [&](int w, int j) -> float& {
      return part[((w * COL_WARPS + col_warp) * WORDS + j) * kWarpSize + lane];
    };
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the ring
#pragma unroll
    for (int f = 0; f < O_COLS / 8; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) word(warp, 4 * f + e) = o_i[0].c[f][e];
#pragma unroll
    for (int r = 0; r < 2; ++r) word(warp, O_COLS / 2 + r) = m_i[0].r[r], word(warp, O_COLS / 2 + 2 + r) = l_i[0].r[r];
    __syncthreads();
    if (warp != 0) return;
    Rows m = m_i[0];
#pragma unroll
    for (int w = 1; w < KEY_WARPS; ++w)
#pragma unroll
      for (int r = 0; r < 2; ++r) m.r[r] = fmaxf(m.r[r], word(w, O_COLS / 2 + r));
    const Rows m_off = exp2_offset(m, scale_log2);
    const Rows a0 = rescale_factor(m_i[0], scale_log2, m_off);
    rescale(o_i[0], a0);
    l_i[0] = l_i[0] * a0;
#pragma unroll 1
    for (int w = 1; w < KEY_WARPS; ++w) {
      Rows m_w, l_w;
#pragma unroll
      for (int r = 0; r < 2; ++r) m_w.r[r] = word(w, O_COLS / 2 + r), l_w.r[r] = word(w, O_COLS / 2 + 2 + r);
      const Rows a = rescale_factor(m_w, scale_log2, m_off);
#pragma unroll
      for (int f = 0; f < O_COLS / 8; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_i[0].c[f][e] += a.r[e / 2] * word(w, 4 * f + e);
      l_i[0] = l_i[0] + l_w * a;
    }
    m_i[0] = m;
  }

  // ---- out: the group's rows, (B, H_q, N_q) rows from the group's first head at query 0, N_q the
  // longest (the partials); the LSE's are (H_q, total_q) with varlen.
  const int64_t n_q_max = params.seqlen_q;
  const int64_t lse_row0 = (b * params.heads_q + h0) * n_q_max;
  const int64_t lse_head = varlen ? params.total_q : n_q_max;
  const int64_t lse_at = lse_offset(params, b, h0, q_seq, 0, varlen);
#pragma unroll
  for (int t = 0; t < M_TILES; ++t) {
    const int tile_row0 = warp_row + kMmaRows * t;
    Rows l = quad_sum(l_i[t]);
    // Sinks, once a row: here without a split; a split's partials leave them to the combine.
    if constexpr (MODS && !SPLIT)
      if (params.sinks != nullptr) {
        const Rows sink =
            packed_head_values(params.sinks, 0, 0, h0, m_start + tile_row0, n_rows, pack, mods.inv_scale, -INFINITY);
        Rows alpha;
        const ScoreMods sm{mods, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; ++r) sm.finish_row(m_i[t].r[r], l.r[r], alpha.r[r], sink.r[r]);
        rescale(o_i[t], alpha);
      }
    if constexpr (SPLIT) {
      const int64_t part = split * split_rows + lse_row0;
      // O's columns from c0; the LSE (the same in every column warp) from the first alone.
      const PackedOut<float> out{{o_part + part * HEAD_DIM + c0, n_q_max * HEAD_DIM, HEAD_DIM, pack},
                                 {col_warp == 0 ? lse_part + part : nullptr, n_q_max, 1, pack},
                                 m_start,
                                 tile_row0,
                                 n_rows - m_start};
      PackedStore::store(out, o_i[t], m_i[t], l, scale_log2);
    } else {
      const PackedOut<T> out{
          {static_cast<T*>(params.o) + o_at + h0 * params.o_stride.head + c0, params.o_stride.head, params.o_stride.seq,
           pack},
          {params.lse != nullptr && col_warp == 0 ? params.lse + lse_at : nullptr, lse_head, 1, pack},
          m_start,
          tile_row0,
          n_rows - m_start};
      PackedStore::store(out, o_i[t], m_i[t], l, scale_log2);
    }
  }
}

// The combine: W warps per row of one (batch, query head) (1, 2, 4 or 8, from the split count:
// combine_warps); it writes O (T) and the LSE. Step 27's combine gave a row HEAD_DIM / 8 lanes,
// each walking the S splits one dependent load after another: S round trips to L2 per row, most of
// the combine's time at one sequence, where it is a couple of blocks. Each warp of a row first reads
// the row's S partial LSEs together (a lane every 32nd split), reduces max and sum by shuffles
// (device/split_combine.h's rule, its empty-split guard included) and leaves the S weights in its
// own shared memory; then GROUPS = 32 / LANES lanes share each 16-byte chunk of the row (LANES: the
// row's HEAD_DIM / 8 chunks rounded up to a power of two, so that the groups split a warp evenly; at
// D = 96 and 192 the last lanes of a group have no chunk and add nothing),
// and the row's W · GROUPS lane groups take every (W · GROUPS)-th split, so that a lane has about
// S / (W · GROUPS) loads to wait for, not S / GROUPS. A shuffle adds a warp's groups, shared memory
// the row's warps. With one warp per row, one sequence's 32 rows and 32 splits took 9.7 µs (ncu,
// c7faa3e): sixteen loads in a row per lane, 32 warps on the GPU.
constexpr int kCombineThreads = 256;
constexpr int kCombineWarps = kCombineThreads / 32;
template <int HEAD_DIM>
constexpr int kCombineLanes = HEAD_DIM <= 32    ? 4
                              : HEAD_DIM <= 64  ? 8
                              : HEAD_DIM <= 128 ? 16
                                                : 32;
static_assert(kCombineLanes<96> * 8 >= 96 && kCombineLanes<256> * 8 == 256, "a lane a chunk, the chunks rounded up");

/// Warps per row for S splits: enough lane groups for two splits each, at most the block's 8 (at
/// D = 128 and S > 32, up to four splits a group).
template <int HEAD_DIM>
constexpr int combine_warps(int splits) {
  const int groups = 32 / kCombineLanes<HEAD_DIM>;
  int w = 1;
  while (w < kCombineWarps && 2 * w * groups < splits) w *= 2;
  return w;
}

template <int HEAD_DIM, typename T = bf16>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const AttentionParams params, const int splits, const int row_warps, const float* o_part,
                   const float* lse_part) {
  constexpr int LANES = kCombineLanes<HEAD_DIM>, GROUPS = 32 / LANES;
  static_assert(32 % LANES == 0, "a row's chunks split a warp evenly");
  __shared__ float weights[kCombineWarps][kMaxKvSplits];  // each warp its own copy of its row's
  __shared__ float4 sums[kCombineWarps][LANES][2];        // each warp's chunks, for the row's first
  const int warp = int(threadIdx.x) / 32, t = int(threadIdx.x) % 32, lane = t % LANES, group = t / LANES;
  const int r = warp / row_warps, wr = warp % row_warps;  // the block's row, and this warp's place in it
  const int64_t bh = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  const int64_t i = int64_t(blockIdx.x) * (kCombineWarps / row_warps) + r;
  bool valid = bh < params.batch * params.heads_q && i < params.seqlen_q;  // the same for a row's warps
  const int64_t b = valid ? bh / params.heads_q : 0, h = valid ? bh % params.heads_q : 0;
  const bool varlen = params.cu_seqlens_q != nullptr;  // (one combine for both: it is a few microseconds)
  const SequenceRows q_seq = !valid   ? SequenceRows{}
                             : varlen ? Packed::queries(params, b)
                                      : Batched::queries(params, b);
  valid = valid && i < q_seq.length;  // varlen: past a shorter sequence, no partials were written
  const int64_t rows = params.batch * params.heads_q * params.seqlen_q, row = bh * params.seqlen_q + i;
  ptx::wait_for_prior_grid();  // launched early (sm_90): the partials are complete from here on
  float acc[8] = {};
  float lse = -INFINITY;
  // This lane's chunk of its first kPrefetch splits' partial O, loaded before the LSEs: the two
  // round trips to L2 (the LSEs, then the partials they weigh) overlap instead of following each
  // other. The rest, past kPrefetch splits a lane group (S > 32 at D = 128), load in the loop.
  constexpr int kPrefetch = 2;
  const int col = lane * 8, step = row_warps * GROUPS, first = wr * GROUPS + group;
  const bool has_col = col < HEAD_DIM;  // D = 96, 192: a group's last lanes have no chunk
  float4 pre[kPrefetch][2];
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    const int s = first + k * step;
    if (valid && has_col && s < splits) {
      const float4* src = reinterpret_cast<const float4*>(o_part + (s * rows + row) * HEAD_DIM + col);
      pre[k][0] = src[0], pre[k][1] = src[1];
    }
  }
  if (valid) {  // whole warps: no shuffle left behind
    float m = -INFINITY;
    for (int s = t; s < splits; s += 32) m = fmaxf(m, lse_part[s * rows + row]);
#pragma unroll
    for (int x = 16; x > 0; x /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
    float sum = 0.0f;
    if (m != -INFINITY)  // every split empty: no −inf − (−inf)
      for (int s = t; s < splits; s += 32) sum += expf(lse_part[s * rows + row] - m);
#pragma unroll
    for (int x = 16; x > 0; x /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, x);
    lse = m == -INFINITY ? -INFINITY : m + logf(sum);
    for (int s = t; s < splits; s += 32) weights[warp][s] = split_weight(lse_part[s * rows + row], lse);
    __syncwarp();
    int k = 0;
    for (int s = first; s < splits; s += step, ++k) {  // an empty split's O_s is 0 and weighs 0
      if (!has_col) continue;
      const float w = weights[warp][s];
      float4 x, y;
      if (k < kPrefetch) {
#pragma unroll
        for (int j = 0; j < kPrefetch; ++j)  // constant indices: pre stays in registers
          if (j == k) x = pre[j][0], y = pre[j][1];
      } else {
        const float4* src = reinterpret_cast<const float4*>(o_part + (s * rows + row) * HEAD_DIM + col);
        x = src[0], y = src[1];
      }
      acc[0] = fmaf(w, x.x, acc[0]), acc[1] = fmaf(w, x.y, acc[1]), acc[2] = fmaf(w, x.z, acc[2]);
      acc[3] = fmaf(w, x.w, acc[3]), acc[4] = fmaf(w, y.x, acc[4]), acc[5] = fmaf(w, y.y, acc[5]);
      acc[6] = fmaf(w, y.z, acc[6]), acc[7] = fmaf(w, y.w, acc[7]);
    }
#pragma unroll
    for (int x = LANES; x < 32; x *= 2)  // the groups' sums of the same chunk
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], x);
    if (row_warps > 1 && group == 0)
      sums[warp][lane][0] = make_float4(acc[0], acc[1], acc[2], acc[3]),
      sums[warp][lane][1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
  if (row_warps > 1) {  // the row's other warps' sums, added by its first (every thread meets here)
    __syncthreads();
    if (valid && wr == 0 && group == 0)
      for (int w = 1; w < row_warps; ++w) {
        const float4 x = sums[warp + w][lane][0], y = sums[warp + w][lane][1];
        acc[0] += x.x, acc[1] += x.y, acc[2] += x.z, acc[3] += x.w;
        acc[4] += y.x, acc[5] += y.y, acc[6] += y.z, acc[7] += y.w;
      }
  }
  if (!valid || wr != 0 || group != 0 || !has_col) return;
  // Sinks: once a row, here, not once a split: LSE' = ln(e^LSE + e^sink), O ← O · e^(LSE − LSE').
  if (params.sinks != nullptr) {
    const float sink = params.sinks[h];
    if (sink > -INFINITY) {
      const float top = fmaxf(lse, sink), lse_all = top + logf(expf(lse - top) + expf(sink - top));
      const float factor = expf(lse - lse_all);  // 0 for a row that saw no key (LSE = −inf)
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] *= factor;
      lse = lse_all;
    }
  }
  T* const o_row = static_cast<T*>(params.o) + sequence_offset(params.o_stride, b, q_seq, varlen) +
                   h * params.o_stride.head + i * params.o_stride.seq;
  *reinterpret_cast<uint4*>(o_row + col) = uint4{ptx::pack_x2<T>(acc[0], acc[1]), ptx::pack_x2<T>(acc[2], acc[3]),
                                                 ptx::pack_x2<T>(acc[4], acc[5]), ptx::pack_x2<T>(acc[6], acc[7])};
  if (params.lse != nullptr && lane == 0) params.lse[lse_offset(params, b, h, q_seq, i, varlen)] = lse;
}

// Step 32's append: sequence b's new row r written as its key seqlens_kv[b] + r of K and V
// (write_new_row: contiguous or paged), every KV head, 16 bytes a thread; nothing for a sequence
// whose rows would not fit. A grid-stride loop over the B·seqlen_new rows, one row a block at a time.
__global__ void __launch_bounds__(kAppendThreads) append_kernel(const AttentionParams params) {
  ptx::allow_dependent_launch();  // the split kernel may launch now; it waits for these writes
  const int64_t n_new = params.seqlen_new, rows = params.batch * n_new;
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const int64_t b = i / n_new, r = i % n_new, length = params.seqlens_kv[b];
    if (length >= 0 && length + n_new <= params.seqlen_kv) write_new_row(params, b, r, length + r);
  }
}

// ---- the host side -----------------------------------------------------------------------------

// Query heads per packed group: G, or 1 where N_q·G rows would pass the tile's 32-bit row range (a
// long varlen call; decode calls are at most kMaxPackedRows).
int pack_of(const AttentionParams& p) {
  const int64_t g = p.heads_q / p.heads_kv;
  return p.seqlen_q * g <= kTileMaxSeqlen ? int(g) : 1;
}

// The keys a Q tile reads at most: N_kv, or with a sliding window bounded on both sides (the causal
// flag bounds the right) its width plus the call's queries.
int64_t tile_keys(const AttentionParams& p) {
  const int64_t right = p.causal ? 0 : p.window_right;
  if (p.window_left < 0 || right < 0) return p.seqlen_kv;
  return std::min(p.seqlen_kv, p.window_left + right + p.seqlen_q);
}

// The split count for call p with this configuration (library/split_kv.h): the call's, else (0,
// with a workspace) the wave-fill heuristic's on the split kernel's slots, cut to what the workspace
// holds; 1 without a workspace.
template <int HEAD_DIM, typename Cfg>
Status choose_splits(const AttentionParams& p, int* splits) {
  const int pack = pack_of(p);
  return split_count(p, reinterpret_cast<const void*>(decode_kernel<HEAD_DIM, Cfg, true, Batched>), Cfg::NUM_THREADS,
                     Cfg::template smem_bytes<HEAD_DIM>(),
                     cdiv(p.seqlen_q * pack, Cfg::BLOCK_M) * p.batch * (p.heads_q / pack),
                     cdiv(tile_keys(p), Cfg::BLOCK_N), splits, kDecodeSplitRule);
}

// Launches kernel(args...) on the stream; with `early`, as a programmatic dependent launch where the
// GPU and the kernel's code are sm_90+ (early_launch_allowed): it may then start while the kernel
// before it on the stream (one of this file's, which allows it) finishes, and waits for it in
// wait_for_prior_grid() before touching global memory, so the launch's gap is not on the call's
// path. Not asked for behind the caller's own kernels: measured at 880b246, the split kernel
// launched early behind every call's previous work made the tuner pick a slower configuration for
// 32 × 1k (48.8 µs against 46.7), and a gain there could not be measured.
template <typename... Params, typename... Args>
Status launch_early(bool early, void (*kernel)(Params...), dim3 grid, int threads, int smem, cudaStream_t stream,
                    Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = dim3(unsigned(threads)), cfg.dynamicSmemBytes = size_t(smem), cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  if (early && early_launch_allowed(reinterpret_cast<const void*>(kernel))) cfg.attrs = &attr, cfg.numAttrs = 1;
  FA_CUDA_RETURN(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  return Status::Ok();
}

struct Launcher {
  template <int HEAD_DIM, typename Cfg>
  static Status launch(const AttentionParams& p, cudaStream_t stream) {
    return with_element_type<bf16, fp16>(p.dtype, [&]<typename T>() { return launch_as<T, HEAD_DIM, Cfg>(p, stream); });
  }

  template <typename T, int HEAD_DIM, typename Cfg>
  static Status launch_as(const AttentionParams& p, cudaStream_t stream) {
    constexpr int smem = Cfg::template smem_bytes<HEAD_DIM>();
    int splits = 1;
    if (Status st = choose_splits<HEAD_DIM, Cfg>(p, &splits); !st.ok()) return st;
    const bool packed = p.cu_seqlens_q != nullptr;
    // Score modifications: kernels of their own (MODS), batched calls and packed ones alike.
    const auto kernel = p.has_score_mods()
                            ? (splits > 1 ? (packed ? decode_kernel<HEAD_DIM, Cfg, true, Packed, true, T>
                                                    : decode_kernel<HEAD_DIM, Cfg, true, Batched, true, T>)
                                          : (packed ? decode_kernel<HEAD_DIM, Cfg, false, Packed, true, T>
                                                    : decode_kernel<HEAD_DIM, Cfg, false, Batched, true, T>))
                        : splits > 1 ? (packed ? decode_kernel<HEAD_DIM, Cfg, true, Packed, false, T>
                                               : decode_kernel<HEAD_DIM, Cfg, true, Batched, false, T>)
                                     : (packed ? decode_kernel<HEAD_DIM, Cfg, false, Packed, false, T>
                                               : decode_kernel<HEAD_DIM, Cfg, false, Batched, false, T>);
    if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
    const SplitKvWorkspace ws = split_kv_workspace(p, splits);
    char* const base = static_cast<char*>(p.workspace);
    float* const o_part = splits > 1 ? reinterpret_cast<float*>(base + ws.o_partial) : nullptr;
    float* const lse_part = splits > 1 ? reinterpret_cast<float*>(base + ws.lse_partial) : nullptr;
    if (p.k_new != nullptr)  // the new rows first; the split kernel, next on the stream, reads them
      if (Status st = launch_early(false, append_kernel,
                                   dim3(unsigned(std::min<int64_t>(p.batch * p.seqlen_new, kAppendMaxBlocks))),
                                   kAppendThreads, 0, stream, p);
          !st.ok())
        return st;
    const int pack = pack_of(p);
    const int64_t groups = p.batch * (p.heads_q / pack);
    const dim3 grid(unsigned(cdiv(p.seqlen_q * pack, Cfg::BLOCK_M) * splits),
                    unsigned(std::min<int64_t>(groups, 65535)), unsigned(cdiv(groups, 65535)));
    if (Status st = launch_early(p.k_new != nullptr, kernel, grid, Cfg::NUM_THREADS, smem, stream, p, scale_log2(p),
                                 splits, o_part, lse_part, int64_t(ws.rows), pack, score_mod_args(p));
        !st.ok())
      return st;
    if (splits > 1) {
      const int64_t bh = p.batch * p.heads_q;
      const int row_warps = combine_warps<HEAD_DIM>(splits);
      const dim3 combine_grid(unsigned(cdiv(p.seqlen_q, kCombineWarps / row_warps)),
                              unsigned(std::min<int64_t>(bh, 65535)), unsigned(cdiv(bh, 65535)));
      // The combine too: started while the split kernel runs (which allows it at its start), it
      // waits in wait_for_prior_grid() for the partials.
      if (Status st =
              launch_early(true, combine_kernel<HEAD_DIM, T>, combine_grid, kCombineThreads, 0, stream, p, splits,
                           row_warps, static_cast<const float*>(o_part), static_cast<const float*>(lse_part));
          !st.ok())
        return st;
    }
    return Status::Ok();
  }
};

// Step 28's list, in its order of preference: 64-row tiles (one group's rows in every one). (Step
// 30's 8-warp, 128-row tile was tried at D = 128: 0.51 ms against 0.28 at B = 32, N_kv = 8k, paged.)
const tuner::Tuner kTuner(kProductionDecode, FA_BUILD_ID,
                          configs<Launcher>(At<64, Config<64, 64, 3, 2>>{},      // 2 warps of 32 rows
                                            At<64, Config<64, 64, 3, 1>>{},      // 4 warps of 16 rows
                                            At<64, Config<16, 64, 3, 1, 4>>{},   // 16 rows, keys over 4 warps
                                            At<128, Config<64, 64, 3, 1>>{},     // 4 warps of 16 rows
                                            At<128, Config<16, 64, 3, 1, 4>>{},  // 16 rows, keys over 4 warps
                                            // Part VI's head dims: D = 32 as 64, 96 as 128; at 192 the
                                            // 64-row tile keeps two stages (three: 224 KB); at 256 O's
                                            // columns over two warps (one warp holding all of them
                                            // spilled 4-36 bytes at 255 registers in every configuration)
                                            At<32, Config<64, 64, 3, 2>>{},          //
                                            At<32, Config<64, 64, 3, 1>>{},          //
                                            At<32, Config<16, 64, 3, 1, 4>>{},       //
                                            At<96, Config<64, 64, 3, 1>>{},          //
                                            At<96, Config<16, 64, 3, 1, 4>>{},       //
                                            At<192, Config<64, 64, 2, 1>>{},         //
                                            At<192, Config<16, 64, 3, 1, 4>>{},      //
                                            At<256, Config<64, 64, 2, 1, 1, 2>>{},   // 4 row × 2 column warps
                                            At<256, Config<16, 64, 3, 1, 4, 2>>{}),  // 4 key × 2 column warps
                          /*kv_buckets=*/true);  // a decode's cache grows a key a call: key by N_kv's bucket

}  // namespace

std::vector<DType> dtypes() {
  return built_dtypes();
}

bool accepts(const AttentionParams& p, bool prefill_varlen) {
  if (!dtype_built(p.dtype)) return false;  // its types, the forwards' (dtypes())
  // Every head dim the build has (the configurations above).
  if (p.heads_kv < 1 || p.heads_q % p.heads_kv != 0 || !head_dim_built(int(p.head_dim))) return false;
  if (p.head_dim > kMaxHeadDim) return false;
  const int64_t rows = p.seqlen_q * (p.heads_q / p.heads_kv);
  // Packed sequences: the decode-sized ones, and all of them where the prefill kernel reads none.
  if (p.cu_seqlens_q != nullptr) return !prefill_varlen || rows <= kMaxPackedRows;
  if (rows > kMaxPackedRows) return false;
  if (p.workspace != nullptr || p.num_splits > 1) return true;           // it can split: always the better kernel
  if (p.seqlens_kv != nullptr || p.block_table != nullptr) return true;  // only it reads lengths and pages
  // Without a workspace it cannot split: only where its packed grid alone fills the GPU (one block
  // per SM), else the prefill kernel's G times more blocks read faster.
  const int sms = autotune::current_device().sm_count;  // queried once per device
  return sms > 0 && p.batch * p.heads_kv >= sms;
}

Status route(const AttentionParams& p, cudaStream_t stream, bool* taken, bool prefill_varlen) {
  *taken = accepts(p, prefill_varlen);
  if (*taken) return forward(p, stream);
  // What keeps the decode kernel from the call, for the refusals below: its element type (the build's),
  // else the call's query rows. Built only for a refusal: every prefill call passes through here.
  auto why = [&p] {
    if (!dtype_built(p.dtype))
      return "the decode kernel's, which this build compiles for bf16 only; this call is " + dtype_name(p.dtype);
    if (p.head_dim > kMaxHeadDim)
      return "the decode kernel's, which has head dims 32 to 256; this call has head dim " + std::to_string(p.head_dim);
    return "for calls whose query rows times H_q / H_kv are at most " + std::to_string(kMaxPackedRows) +
           " (decode); this call has " + std::to_string(p.seqlen_q * (p.heads_q / p.heads_kv));
  };
  if ((p.has_score_mods() || p.has_window()) && p.cu_seqlens_q != nullptr)
    return Status::Unsupported(std::string(p.has_score_mods() ? "softcap, ALiBi and sinks" : "a sliding window") +
                               " with packed sequences (cu_seqlens) are the decode kernel's alone, " + why());
  if (p.cu_seqlens_q != nullptr && !prefill_varlen)  // only this kernel reads the offsets, not the prefill kernel
    return Status::Unsupported(
        "packed sequences (cu_seqlens) are read by the decode kernel alone, at head dims 32 to 256 "
        "in the types the build has; this call has head dim " +
        std::to_string(p.head_dim) + " in " + dtype_name(p.dtype));
  if (p.seqlens_kv != nullptr || p.block_table != nullptr)
    return Status::Unsupported(std::string(p.block_table != nullptr ? "a paged KV cache (block_table)"
                                                                    : "a length per sequence (seqlens_kv)") +
                               " is " + why());
  if (p.num_splits > 1)
    return Status::Unsupported("split-KV (num_splits = " + std::to_string(p.num_splits) + ") is " + why());
  return Status::Ok();
}

Status forward(const AttentionParams& p, cudaStream_t stream) {
  return kTuner.run(p, stream);  // the calling kernel validated p
}

std::string describe(const AttentionParams& p, const std::string& prefill, bool prefill_varlen) {
  if (!accepts(p, prefill_varlen)) return prefill;
  return "decode kernel (" + std::to_string(kProductionDecode) + "): " + kTuner.describe(p);
}

}  // namespace fa::kernels::decode
