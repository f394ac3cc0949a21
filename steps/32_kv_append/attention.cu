// Step 32 — the append in the call: step 31's kernel, with the new tokens' keys and values written
// into the cache by the call that reads them.
//
// Why: a decode step produces one new key and value per sequence and KV head, and the next
// attention must read them from the cache. flash-attn's flash_attn_with_kvcache(q, k_cache,
// v_cache, k, v, cache_seqlens, block_table, ...) takes them as k and v and writes them at each
// sequence's length, through its block table, inside the call. Done outside (indexing in PyTorch),
// the append is several launches and as many host round trips per layer per token.
//
// What changed since step 31:
//  - AttentionParams::k_new, v_new, k_new_stride, v_new_stride, seqlen_new: the new rows, (B,
//    seqlen_new, H_kv, D) with any strides, and their count.
//  - append_kernel: one block per (sequence, new row), its threads copying the row's H_kv × D
//    values 16 bytes at a time, K and V, to key seqlens_kv[b] + r of the sequence: a row of K at b
//    in a contiguous cache, row key % page_size of page table[key / page_size] in a paged one
//    (device/paged_kv.h's write_new_row, the page clamped into the pool). A sequence whose rows
//    would not fit (seqlens_kv[b] < 0 or seqlens_kv[b] + seqlen_new > N_kv) gets nothing written.
//  - The launcher issues it before the attention kernel on the same stream, so the attention
//    blocks read the rows after they are written; every sequence then has seqlens_kv[b] +
//    seqlen_new keys (clamped to N_kv as before). seqlens_kv itself is not changed: the caller
//    advances it, as with flash-attn.
//  - Without k_new the step is step 31.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "device/gqa_pack.h"
#include "device/mask.h"
#include "device/paged_kv.h"
#include "device/ptx/cp_async.h"
#include "device/split_combine.h"
#include "device/varlen.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "fa/registry.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/split_kv.h"
#include "library/tuner.h"

namespace fa::step32 {
namespace {

using namespace fa::tile;
using fa::ptx::cp_async_commit;
using fa::ptx::cp_async_wait;

// One kernel configuration: query rows per block, keys per K/V tile, K/V tiles in flight, and
// 16-row mma tiles per warp (2: each warp owns 32 rows; 1: 16 rows, half the registers for O).
template <int BLOCK_M_, int BLOCK_N_, int STAGES_, int M_TILES_ = 2>
struct Config {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int STAGES = STAGES_;
  static constexpr int M_TILES = M_TILES_;            // 16-row mma tiles per warp
  static constexpr int ROWS_PER_WARP = 16 * M_TILES;  // the query rows each warp owns
  static constexpr int NUM_WARPS = BLOCK_M / ROWS_PER_WARP;
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  // The state is rescaled only when a row's max rose by more than this, in exp2 units: until
  // then P = 2^(c·s − c·m_i) ≤ 2^8, which fp32 O and l, and bf16 P, hold without loss.
  static constexpr float RESCALE_THRESHOLD = 8.0f;
  // Shared memory: the Q tile, then STAGES × (K tile, V tile), all (rows, HEAD_DIM) bf16 swizzled.
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return SwizzledLayout<HEAD_DIM>::bytes(BLOCK_M + STAGES * 2 * BLOCK_N);
  }
};

// SPLIT: the block computes one range of its Q tile's keys into the workspace (splits > 1);
// without, it is step 10's kernel (splits == 1), which is at the edge of the register file.
template <int HEAD_DIM, typename Cfg, bool SPLIT>
__global__ void __launch_bounds__(Cfg::NUM_THREADS)
    attention_kernel(const AttentionParams params, const float scale_log2, const int splits, float* o_part,
                     float* lse_part, const int64_t split_rows, const int pack) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, NUM_THREADS = Cfg::NUM_THREADS;
  constexpr int STAGES = Cfg::STAGES, M_TILES = Cfg::M_TILES, ROWS_PER_WARP = Cfg::ROWS_PER_WARP;
  using Layout = SwizzledLayout<HEAD_DIM>;
  extern __shared__ uint4 smem[];  // uint4: 16-byte aligned, as cp.async and ldmatrix need
  const SmemTile<BLOCK_M, Layout> q_tile{reinterpret_cast<bf16*>(smem)};               // (BLOCK_M, HEAD_DIM)
  const SmemTile<BLOCK_N, Layout> kv_tiles{q_tile.ptr + BLOCK_M * Layout::kRowElems};  // STAGES × [K, then V]

  const int warp = int(threadIdx.x) / 32;

  // ---- pointers: grid = (packed Q tiles × splits, B·H_q / pack); 64-bit offsets, every tensor
  // through its own strides. Causal: the last Q tiles have the most keys to visit, so they are
  // issued first.
  const int m_tiles = SPLIT ? int(gridDim.x) / splits : int(gridDim.x);
  const int split = SPLIT ? int(blockIdx.x) % splits : 0, tile_m = SPLIT ? int(blockIdx.x) / splits : int(blockIdx.x);
  const int m_block = params.causal ? m_tiles - 1 - tile_m : tile_m;
  // The groups of B·H_q / pack may exceed the grid's y limit (65535); the launcher then continues
  // along z. The block's group: `pack` query heads from h0, all reading KV head h_kv.
  const int64_t groups = params.heads_q / pack;
  const int64_t bh = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  if (bh >= params.batch * groups) return;  // the few spare blocks of the last z slice
  const int64_t b = bh / groups, h0 = (bh % groups) * pack;
  const int64_t h_kv = kv_head_of(h0, params.heads_q, params.heads_kv);
  // Varlen: the sequence's queries and keys are rows of the packed tensors, from its offsets.
  const bool varlen = params.cu_seqlens_q != nullptr;
  const SequenceRows q_seq = varlen ? sequence_rows(params.cu_seqlens_q, b, params.total_q, params.seqlen_q)
                                    : SequenceRows{0, int(params.seqlen_q)};
  const SequenceRows kv_seq = varlen ? sequence_rows(params.cu_seqlens_kv, b, params.total_kv, params.seqlen_kv)
                                     : SequenceRows{0, int(params.seqlen_kv)};
  const int n_q = q_seq.length;
  const int n_rows = n_q * pack;          // packed rows of the block's group: < 2^31 (the launcher checks)
  const int m_start = m_block * BLOCK_M;  // the tile's first packed row
  if (m_start >= n_rows) return;          // varlen: a tile past a shorter sequence's queries has nothing to do
  // This sequence's keys: its own length when the call gives one per sequence, clamped to the
  // caches' capacity N_kv; and the causal diagonal aligned to it.
  // With an append, seqlen_new more: the rows append_kernel wrote before this kernel started.
  const int n_kv_all =
      params.seqlens_kv ? int(min(max(int64_t(params.seqlens_kv[b]) + params.seqlen_new, int64_t(0)), params.seqlen_kv))
                        : kv_seq.length;
  const int64_t offset_all = params.causal_align == CausalAlign::bottom_right ? int64_t(n_kv_all) - n_q : 0;
  const bool causal = params.causal;  // key j visible to query i iff j <= i + offset
  const QueryRange queries = packed_tile_queries(m_start, BLOCK_M, n_rows, pack);  // their KV range is the tile's
  // This block's range of KV tiles: the split's share of all of them, cut at the Q tile's end.
  // From here on K, V, the mask and the tile numbers count from the range's first key, key0: the
  // KV loop below is step 10's, over a shorter sequence.
  const int n_blocks_all = kv_tile_end(queries.first, queries.count, BLOCK_N, n_kv_all, causal, offset_all);
  const int per_split = SPLIT ? (cdiv(n_kv_all, BLOCK_N) + splits - 1) / splits : n_blocks_all;
  const int n_begin = split * per_split, key0 = n_begin * BLOCK_N;
  const int n_kv = n_kv_all - key0;
  const int64_t offset = offset_all - key0;  // key j − key0 visible to row i iff j − key0 <= i + offset
  const int n_blocks = SPLIT ? max(0, min(n_blocks_all, n_begin + per_split) - n_begin) : n_blocks_all;
  const int first_masked =
      max(0, kv_tile_first_masked(queries.first, queries.count, BLOCK_N, n_kv_all, causal, offset_all) - n_begin);
  // A sequence starts at its batch entry, or (varlen) at its first row: b·stride or first·row stride.
  const int64_t q_at = sequence_offset(params.q_stride, b, q_seq, varlen);
  const int64_t o_at = sequence_offset(params.o_stride, b, q_seq, varlen);
  const int64_t k_at = sequence_offset(params.k_stride, b, kv_seq, varlen);
  const int64_t v_at = sequence_offset(params.v_stride, b, kv_seq, varlen);
  const bf16* k_ptr =
      static_cast<const bf16*>(params.k) + k_at + h_kv * params.k_stride.head + int64_t(key0) * params.k_stride.seq;
  const bf16* v_ptr =
      static_cast<const bf16*>(params.v) + v_at + h_kv * params.v_stride.head + int64_t(key0) * params.v_stride.seq;
  // Paged (a block table): key j of the sequence is row j % page_size of page table[j / page_size]
  // of the K and V pools (device/paged_kv.h); the loads below take it from there.
  const bool paged = params.block_table != nullptr;
  const PagedKv pages = paged_kv(params, b, h_kv);
  // The pages of the next K/V tile load_kv issues, looked up one tile ahead of its copies.
  TilePages<NUM_THREADS, BLOCK_N, Layout> next_pages{};
  if (paged) next_pages = lookup_tile_pages<NUM_THREADS, BLOCK_N, Layout>(pages, key0, n_kv);
  const int row0 = m_start + warp * ROWS_PER_WARP;  // this warp's first packed row

  // The K and V tiles of KV tile n_block: ring slot n_block % STAGES, K first.
  auto k_tile_of = [&](int n_block) { return next_tile(kv_tiles, 2 * (n_block % STAGES)); };
  auto v_tile_of = [&](int n_block) { return next_tile(kv_tiles, 2 * (n_block % STAGES) + 1); };
  // Issues the copies of KV tile n_block into its ring slot (rows past N_kv arrive as zeros): from
  // the pages of keys key0 + n_start on, or from K and V's rows.
  auto load_kv = [&](int n_block) {
    const int n_start = n_block * BLOCK_N;
    const int kv_rows = min(BLOCK_N, n_kv - n_start);
    if (paged) {
      load_paged_kv_async<NUM_THREADS>(k_tile_of(n_block), v_tile_of(n_block), pages, next_pages, key0 + n_start,
                                       kv_rows);
      // The next tile's pages, read now: they arrive while this tile computes, not on its copies' path.
      next_pages =
          lookup_tile_pages<NUM_THREADS, BLOCK_N, Layout>(pages, key0 + n_start + BLOCK_N, n_kv - n_start - BLOCK_N);
      return;
    }
    load_tile_async<NUM_THREADS>(k_tile_of(n_block), k_ptr + n_start * params.k_stride.seq, params.k_stride.seq,
                                 kv_rows);
    load_tile_async<NUM_THREADS>(v_tile_of(n_block), v_ptr + n_start * params.v_stride.seq, params.v_stride.seq,
                                 kv_rows);
  };

  // ---- load Q: one cp.async group for Q, then the first STAGES-1 K/V tiles start flying too;
  // Q stays in shared memory, where mma_qk_tiles reads each warp's 32 rows from.
  {
    const PackedRows<const bf16> q_rows{static_cast<const bf16*>(params.q) + q_at + h0 * params.q_stride.head,
                                        params.q_stride.head, params.q_stride.seq, pack};
    load_rows_async<NUM_THREADS>(
        q_tile, [&](int row) { return q_rows(m_start + row); }, min(BLOCK_M, n_rows - m_start));
  }
  cp_async_commit();
  for (int stage = 0; stage < STAGES - 1; ++stage) {
    if (stage < n_blocks) load_kv(stage);
    cp_async_commit();  // an empty group is fine: it keeps the group count the same everywhere
  }
  cp_async_wait<STAGES - 1>();  // the oldest group, Q, has landed (K/V may still be in flight)
  __syncthreads();              // ... for every thread's copies

  // ---- init state: per row tile t, each lane holds rows g and g + 8 of the warp's rows
  // 16t .. 16t + 15 (device/warp_tile.h).
  Acc<HEAD_DIM> o_i[M_TILES];  // (16, HEAD_DIM) fp32 each, unnormalised output
  Rows m_i[M_TILES];           // running row max, in raw score units (fp32)
  Rows l_i[M_TILES];           // running row sum over THIS lane's columns (fp32);
                               // the 4 lanes of a row are summed once, at the end
#pragma unroll
  for (int t = 0; t < M_TILES; ++t) {
    o_i[t] = zeros<HEAD_DIM>();
    m_i[t] = rows(-INFINITY);
    l_i[t] = rows(0.0f);
  }

  // ---- KV loop
  for (int n_block = 0; n_block < n_blocks; ++n_block) {
    const int n_start = n_block * BLOCK_N;
    cp_async_wait<STAGES - 2>();  // tile n_block has landed (this thread's copies)
    __syncthreads();              // everyone's copies; and every warp is done reading tile n_block-1
    if (n_block + STAGES - 1 < n_blocks) load_kv(n_block + STAGES - 1);  // into the slot just freed
    cp_async_commit();
    const SmemTile<BLOCK_N, Layout> k_tile = k_tile_of(n_block), v_tile = v_tile_of(n_block);

    Acc<BLOCK_N> s[M_TILES];
    mma_qk_tiles(s, q_tile, warp * ROWS_PER_WARP, k_tile);  // S_t = Q_t·Kᵀ, each K fragment loaded once

    FragA<BLOCK_N> p[M_TILES];  // P_t in bf16, the A operand of P·V
#pragma unroll
    for (int t = 0; t < M_TILES; ++t) {
      // The mask, on the tiles that need it only: straddling the diagonal, or holding keys past
      // N_kv. Masked scores become -inf BEFORE the row max, so the max is over visible keys only.
      if (n_block >= first_masked)
        apply_mask(s[t], row0 + 16 * t, n_start, PackedCausalMask{n_kv, causal, offset, pack});

      // Online softmax, rescaled lazily: only when some row of the tile moved its max by more
      // than the threshold does the warp (all of it: the vote is uniform) move every row's state
      // to its new max. The first KV tile always does (from -inf, every visible row moves).
      const Rows m_new = row_max(s[t], m_i[t]);
      if (any_max_moved(m_i[t], m_new, scale_log2, Cfg::RESCALE_THRESHOLD)) {
        const Rows alpha = rescale_factor(m_i[t], scale_log2, exp2_offset(m_new, scale_log2));  // 0 on the first
        rescale(o_i[t], alpha);
        l_i[t] = l_i[t] * alpha;
        m_i[t] = m_new;
      }
      // P against the max the state is kept at (c·m_i, 0 while m_i = -inf): ≤ 2^threshold.
      const Acc<BLOCK_N> p_t = exp2_rows(s[t], scale_log2, exp2_offset(m_i[t], scale_log2));
      p[t] = to_bf16(p_t);
      l_i[t] = l_i[t] + row_sum(p_t);
    }

    mma_pv_tiles(o_i, p, v_tile);  // O_t += P_t·V: each V fragment loaded once, O in fp32
  }

  const PackedRows<bf16> o_rows{static_cast<bf16*>(params.o) + o_at + h0 * params.o_stride.head, params.o_stride.head,
                                params.o_stride.seq, pack};
  // The (B, H_q, N_q) row of the group's first head at query 0, N_q the longest: the partials' rows,
  // and the LSE's, which with varlen is (H_q, total_q) instead: heads total_q apart, from the first row.
  const int64_t n_q_max = params.seqlen_q;
  const int64_t lse_row0 = (b * params.heads_q + h0) * n_q_max;
  const int64_t lse_head = varlen ? params.total_q : n_q_max;
  const int64_t lse_at = lse_offset(params, b, h0, q_seq, 0, varlen);
#pragma unroll
  for (int t = 0; t < M_TILES; ++t) {
    const int tile_row0 = warp * ROWS_PER_WARP + 16 * t;  // the row tile's first row in the block
    // ---- normalise: finish the row sums across the quad, then one divide per row (deferred).
    const Rows l = quad_sum(l_i[t]);

    const int valid = n_rows - m_start;
    if constexpr (SPLIT) {
      // ---- a split: its partial result to the workspace, fp32, O normalised over its own keys
      // (0 for a range that saw none) and LSE (−inf there), for every row: the combine reads all.
      // split_rows = B·H_q·N_q rows per split, in (B, H_q, N_q) order like the LSE.
      const int64_t part = (int(blockIdx.x) % splits) * split_rows + lse_row0;
      const PackedRows<float> o_part_rows{o_part + part * HEAD_DIM, n_q_max * HEAD_DIM, HEAD_DIM, pack};
      const PackedRows<float> lse_part_rows{lse_part + part, n_q_max, 1, pack};
      store_rows(o_i[t], safe_inverse(l), tile_row0, valid, [&](int row) { return o_part_rows(m_start + row); });
      store_row_values(log_sum_exp(m_i[t], l, scale_log2), tile_row0, valid,
                       [&](int row) { return lse_part_rows(m_start + row); });
      continue;
    }
    // ---- store: bf16 pairs straight from the accumulators; rows past the packed rows are not written.
    store_rows(o_i[t], safe_inverse(l), tile_row0, valid, [&](int row) { return o_rows(m_start + row); });
    // LSE = scale·m + ln(l), -inf for a row that saw no key; one lane per row writes it.
    if (params.lse != nullptr) {
      const PackedRows<float> lse_rows{params.lse + lse_at, lse_head, 1, pack};  // (B, H_q, N_q) or (H_q, total_q)
      store_row_values(log_sum_exp(m_i[t], l, scale_log2), tile_row0, valid,
                       [&](int row) { return lse_rows(m_start + row); });
    }
  }
}

// The combine: a row of one (batch, query head) per HEAD_DIM / 8 lanes, each lane one 16-byte
// chunk of the row (8 values), 256 threads a block; grid = (⌈N_q / rows per block⌉, B·H_q over y
// and z). Each row reads its S partial LSEs, then each lane its chunk of the S partial outputs,
// each split's weight computed once; it writes O (bf16) and the LSE.
constexpr int kCombineThreads = 256;
template <int HEAD_DIM>
constexpr int kCombineLanes = HEAD_DIM / 8;  // lanes per row
template <int HEAD_DIM>
constexpr int kCombineRows = kCombineThreads / kCombineLanes<HEAD_DIM>;  // rows per block

template <int HEAD_DIM>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const AttentionParams params, const int splits, const float* o_part, const float* lse_part) {
  constexpr int LANES = kCombineLanes<HEAD_DIM>;
  const int64_t bh = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  const int64_t i = int64_t(blockIdx.x) * kCombineRows<HEAD_DIM> + threadIdx.x / LANES;
  if (bh >= params.batch * params.heads_q || i >= params.seqlen_q) return;
  const int64_t b = bh / params.heads_q, h = bh % params.heads_q;
  const bool varlen = params.cu_seqlens_q != nullptr;  // the sequence's queries: rows from q_seq.first
  const SequenceRows q_seq = varlen ? sequence_rows(params.cu_seqlens_q, b, params.total_q, params.seqlen_q)
                                    : SequenceRows{0, int(params.seqlen_q)};
  if (i >= q_seq.length) return;  // past a shorter sequence: no block wrote its partials
  const int64_t rows = params.batch * params.heads_q * params.seqlen_q, row = bh * params.seqlen_q + i;
  const int col = int(threadIdx.x % LANES) * 8;                  // this lane's chunk
  const float lse = combined_lse(lse_part + row, splits, rows);  // −inf when no split saw a key
  float acc[8] = {};
  for (int s = 0; s < splits; ++s) {
    const float w = split_weight(lse_part[s * rows + row], lse);  // 0 for an empty range
    if (w == 0.0f) continue;                                      // ... whose O_s is not read
    const float4* src = reinterpret_cast<const float4*>(o_part + (s * rows + row) * HEAD_DIM + col);
    const float4 x = src[0], y = src[1];
    acc[0] = fmaf(w, x.x, acc[0]), acc[1] = fmaf(w, x.y, acc[1]), acc[2] = fmaf(w, x.z, acc[2]);
    acc[3] = fmaf(w, x.w, acc[3]), acc[4] = fmaf(w, y.x, acc[4]), acc[5] = fmaf(w, y.y, acc[5]);
    acc[6] = fmaf(w, y.z, acc[6]), acc[7] = fmaf(w, y.w, acc[7]);
  }
  bf16* const o_row = static_cast<bf16*>(params.o) + sequence_offset(params.o_stride, b, q_seq, varlen) +
                      h * params.o_stride.head + i * params.o_stride.seq;
  *reinterpret_cast<uint4*>(o_row + col) = uint4{ptx::pack_bf16x2(acc[0], acc[1]), ptx::pack_bf16x2(acc[2], acc[3]),
                                                 ptx::pack_bf16x2(acc[4], acc[5]), ptx::pack_bf16x2(acc[6], acc[7])};
  if (params.lse != nullptr && col == 0) params.lse[lse_offset(params, b, h, q_seq, i, varlen)] = lse;
}

// The append: sequence b's new row r becomes its key seqlens_kv[b] + r, in K and in V, for every KV
// head. A contiguous cache holds key j of sequence b at b·batch stride + j·row stride; a paged one at
// row j % page_size of page table[j / page_size] (write_new_row and cache_row, device/paged_kv.h).
// Rows i of the launch are (b, r) = (i / seqlen_new, i % seqlen_new), the grid striding over them;
// the threads of a block copy one row's H_kv × D values, 16 bytes each.
__global__ void __launch_bounds__(128) append_kernel(const AttentionParams params) {
  const int64_t n_new = params.seqlen_new, rows = params.batch * n_new;
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const int64_t b = i / n_new, r = i % n_new;
    const int64_t length = params.seqlens_kv[b];
    if (length < 0 || length + n_new > params.seqlen_kv) continue;  // would not fit: nothing written
    write_new_row(params, b, r, length + r);                        // as key length + r (device/paged_kv.h)
  }
}

// Query heads per packed group: G = H_q / H_kv, or 1 when N_q·G rows would pass the kernel's
// 32-bit row range (then each block is one query head, as in step 27).
int pack_of(const AttentionParams& p) {
  const int64_t g = p.heads_q / p.heads_kv;
  return p.seqlen_q * g <= kTileMaxSeqlen ? int(g) : 1;
}

// The number of ranges for call p (library/split_kv.h): the call's, else (0, with a workspace)
// the heuristic's for the unsplit grid on the split kernel's slots, cut to what the workspace holds;
// 1 without a workspace.
template <int HEAD_DIM, typename Cfg>
Status choose_splits(const AttentionParams& p, int* splits) {
  const int pack = pack_of(p);  // the unsplit grid: packed Q tiles × B·H_q / pack
  return split_count(p, reinterpret_cast<const void*>(attention_kernel<HEAD_DIM, Cfg, true>), Cfg::NUM_THREADS,
                     Cfg::template smem_bytes<HEAD_DIM>(),
                     cdiv(p.seqlen_q * pack, Cfg::BLOCK_M) * p.batch * (p.heads_q / pack),
                     cdiv(p.seqlen_kv, Cfg::BLOCK_N), splits);
}

template <int HEAD_DIM, typename Cfg>
Status launch(const AttentionParams& p, cudaStream_t stream) {
  constexpr int smem = Cfg::template smem_bytes<HEAD_DIM>();
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = p.effective_scale() * kLog2e;  // p = 2^(scale_log2·(s − m))
  int splits = 1;
  if (Status st = choose_splits<HEAD_DIM, Cfg>(p, &splits); !st.ok()) return st;
  // Above 48 KiB of dynamic shared memory a kernel must opt in (once per device).
  const auto kernel = splits > 1 ? attention_kernel<HEAD_DIM, Cfg, true> : attention_kernel<HEAD_DIM, Cfg, false>;
  if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
  const SplitKvWorkspace ws = split_kv_workspace(p, splits);
  char* const base = static_cast<char*>(p.workspace);
  float* const o_part = splits > 1 ? reinterpret_cast<float*>(base + ws.o_partial) : nullptr;
  float* const lse_part = splits > 1 ? reinterpret_cast<float*>(base + ws.lse_partial) : nullptr;
  if (p.k_new != nullptr) {  // first the new rows, then (in stream order) the kernel that reads them
    const int64_t rows = p.batch * p.seqlen_new;
    append_kernel<<<unsigned(std::min<int64_t>(rows, 1 << 20)), 128, 0, stream>>>(p);
    FA_LAUNCH_RETURN();
  }
  const int pack = pack_of(p);
  const int64_t groups = p.batch * (p.heads_q / pack);  // y holds up to 65535 groups, z the rest
  const dim3 grid(unsigned(cdiv(p.seqlen_q * pack, Cfg::BLOCK_M) * splits), unsigned(std::min<int64_t>(groups, 65535)),
                  unsigned(cdiv(groups, 65535)));
  kernel<<<grid, Cfg::NUM_THREADS, smem, stream>>>(p, scale_log2, splits, o_part, lse_part, int64_t(ws.rows), pack);
  FA_LAUNCH_RETURN();
  if (splits > 1) {
    const int64_t bh = p.batch * p.heads_q;  // the combine: a row per (batch, query head, query)
    const dim3 combine_grid(unsigned(cdiv(p.seqlen_q, kCombineRows<HEAD_DIM>)), unsigned(std::min<int64_t>(bh, 65535)),
                            unsigned(cdiv(bh, 65535)));
    combine_kernel<HEAD_DIM><<<combine_grid, kCombineThreads, 0, stream>>>(p, splits, o_part, lse_part);
    FA_LAUNCH_RETURN();
  }
  return Status::Ok();
}

// ---- the configurations ------------------------------------------------------------------------

template <int HEAD_DIM, typename Cfg>
tuner::KernelConfig config() {
  return {HEAD_DIM,
          Cfg::BLOCK_M,
          Cfg::BLOCK_N,
          Cfg::NUM_WARPS,
          Cfg::STAGES,
          Cfg::template smem_bytes<HEAD_DIM>(),
          &launch<HEAD_DIM, Cfg>};
}

// Step 29's configurations (each compiled twice per architecture, with and without the split).
const tuner::Tuner kTuner(32, FA_BUILD_ID,
                          {
                              config<64, Config<128, 64, 3>>(),      // 4 warps, three K/V tiles in flight
                              config<64, Config<128, 64, 2>>(),      // double buffering
                              config<64, Config<64, 64, 3>>(),       // 2 warps: twice the blocks
                              config<128, Config<64, 64, 3, 1>>(),   // 4 warps of 16 rows
                              config<128, Config<128, 64, 2, 1>>(),  // 8 warps of 16 rows
                          });

const Capabilities kCaps = [] {
  Capabilities c;
  c.head_dims = {64, 128};
  c.causal = true;
  c.lse = true;
  c.gqa = true;
  c.tensor_cores = true;
  c.max_seqlen = kTileMaxSeqlen;           // 32-bit row indices
  c.max_batch_heads = kTileMaxBatchHeads;  // B·H_q over the grid's y and z
  c.split_kv = true;                       // AttentionParams::num_splits and the workspace
  c.seqlens_kv = true;                     // AttentionParams::seqlens_kv: a length per sequence
  c.paged_kv = true;                       // AttentionParams::block_table: pages of a pool
  c.varlen = true;                         // AttentionParams::cu_seqlens_q, cu_seqlens_kv
  c.kv_append = true;                      // AttentionParams::k_new, v_new: written into the caches
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  return kTuner.run(p, stream);  // the cached config for this problem, tuned on its first call
}

FA_REGISTER_STEP({32, "kv_append", /*base=*/31,
                  "the append in the call: the new tokens' keys and values written into the cache (contiguous "
                  "or paged) at each sequence's length, then read by the same call",
                  kCaps, &forward, ""})

}  // namespace fa::step32
