// Step 23 — the backward's warps share their operands through shared memory: step 22's kernels,
// with the block's 8 warps arranged as FlashAttention-2 arranges them. Each warp computes a
// (32 keys, WQ queries) block of Sᵀ and dPᵀ, where step 22's warp paired 16 keys with 16 queries at
// a time, and writes its Pᵀ and dSᵀ to shared memory; dV += Pᵀ·dO and dK += dSᵀ·Q read them back,
// each warp for its 32 keys, every query of the Q tile and half of D; dQ += dS·K reads dSᵀ
// transposed (load_a_trans). A (32, 32) block reads 32 + 32 rows of operands for 32·32 products,
// twice what a (16, 16) block gets from its 16 + 16. WQ = 32 at D = 64 (BLOCK_M = 64); at D = 128
// the registers allow WQ = 16 (BLOCK_M = 32: dK and dV alone take 128 a thread).
// Step 17's description of the algorithm, unchanged:
//
// The algorithm (FlashAttention-2's backward), with P never stored: it is recomputed, tile by
// tile, from Q, K and the LSE the forward kept (P = e^(c·S − LSE): no max, no running sum).
//  1. preprocess: D_i = rowsum(dO_i ∘ O_i) for every query row (fp32), and dQ's fp32 accumulator
//     zeroed. Both live in the workspace the caller gives (backward_workspace_bytes).
//  2. the main kernel: one block per KV tile of one (batch, KV head). Its warps own 16 keys each and
//     keep dK and dV for them in registers while they walk every Q tile that sees the KV tile, of
//     every query head that shares the KV head (GQA: dK and dV are sums over those heads). Per Q
//     tile, with the scores transposed (Sᵀ = K·Qᵀ: a warp's rows are its keys):
//        Pᵀ = e^(c·Sᵀ − LSE)          the mask re-applied: a masked pair must get P = 0
//        dV += Pᵀ·dO                 dPᵀ = V·dOᵀ
//        dSᵀ = Pᵀ ∘ (dPᵀ − D)        dK += dSᵀ·Q
//        dQ += dS·K                  through shared memory (dS transposed back), then fp32 atomics:
//                                    every KV tile adds into the same rows of dQ
//     and at the end dK·c and dV are stored as bf16.
//  3. convert: dQ = the accumulator (already times c: the main kernel scales what it adds),
//     rounded to bf16 into the caller's dQ.
// New vocabulary: device/backward_tile.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "device/backward_tile.h"
#include "device/mask.h"
#include "device/ptx/cp_async.h"
#include "device/ptx/sync.h"
#include "device/q_tile_walk.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "fa/registry.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/tuner.h"

namespace fa::step23 {
namespace {

using namespace fa::tile;
using fa::ptx::cp_async_commit;
using fa::ptx::cp_async_wait;

// One kernel configuration: query rows per block, keys per K/V tile, K/V tiles in flight.
template <int BLOCK_M_, int BLOCK_N_, int STAGES_>
struct Config {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int STAGES = STAGES_;
  static constexpr int M_TILES = 2;                   // 16-row mma tiles per warp
  static constexpr int ROWS_PER_WARP = 16 * M_TILES;  // each warp owns 32 query rows
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

template <int HEAD_DIM, typename Cfg>
__global__ void __launch_bounds__(Cfg::NUM_THREADS)
    attention_kernel(const AttentionParams params, const float scale_log2, const int64_t offset) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, NUM_THREADS = Cfg::NUM_THREADS;
  constexpr int STAGES = Cfg::STAGES, M_TILES = Cfg::M_TILES, ROWS_PER_WARP = Cfg::ROWS_PER_WARP;
  using Layout = SwizzledLayout<HEAD_DIM>;
  extern __shared__ uint4 smem[];  // uint4: 16-byte aligned, as cp.async and ldmatrix need
  const SmemTile<BLOCK_M, Layout> q_tile{reinterpret_cast<bf16*>(smem)};               // (BLOCK_M, HEAD_DIM)
  const SmemTile<BLOCK_N, Layout> kv_tiles{q_tile.ptr + BLOCK_M * Layout::kRowElems};  // STAGES × [K, then V]

  const int warp = int(threadIdx.x) / 32;
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);

  // ---- pointers: grid = (Q tiles, B·H_q); 64-bit offsets, every tensor through its own strides.
  // Causal: the last Q tiles have the most keys to visit, so they are issued first.
  const int m_block = params.causal ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
  // B·H_q may exceed the grid's y limit (65535); the launcher then continues it along z.
  const int64_t bh = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  if (bh >= params.batch * params.heads_q) return;  // the few spare blocks of the last z slice
  const int64_t b = bh / params.heads_q, h = bh % params.heads_q;
  const int64_t h_kv = kv_head_of(h, params.heads_q, params.heads_kv);
  const int m_start = m_block * BLOCK_M;
  const bf16* q_ptr = static_cast<const bf16*>(params.q) + b * params.q_stride.batch + h * params.q_stride.head +
                      int64_t(m_start) * params.q_stride.seq;
  const bf16* k_ptr = static_cast<const bf16*>(params.k) + b * params.k_stride.batch + h_kv * params.k_stride.head;
  const bf16* v_ptr = static_cast<const bf16*>(params.v) + b * params.v_stride.batch + h_kv * params.v_stride.head;
  bf16* o_ptr = static_cast<bf16*>(params.o) + b * params.o_stride.batch + h * params.o_stride.head +
                int64_t(m_start) * params.o_stride.seq;
  const int row0 = m_start + warp * ROWS_PER_WARP;  // this warp's first query row
  const bool causal = params.causal;                // key j visible to row i iff j <= i + offset
  const int n_blocks = kv_tile_end(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);  // stop at the diagonal
  const int first_masked = kv_tile_first_masked(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);

  // The K and V tiles of KV tile n_block: ring slot n_block % STAGES, K first.
  auto k_tile_of = [&](int n_block) { return next_tile(kv_tiles, 2 * (n_block % STAGES)); };
  auto v_tile_of = [&](int n_block) { return next_tile(kv_tiles, 2 * (n_block % STAGES) + 1); };
  // Issues the copies of KV tile n_block into its ring slot (rows past N_kv arrive as zeros).
  auto load_kv = [&](int n_block) {
    const int n_start = n_block * BLOCK_N;
    const int kv_rows = min(BLOCK_N, n_kv - n_start);
    load_tile_async<NUM_THREADS>(k_tile_of(n_block), k_ptr + n_start * params.k_stride.seq, params.k_stride.seq,
                                 kv_rows);
    load_tile_async<NUM_THREADS>(v_tile_of(n_block), v_ptr + n_start * params.v_stride.seq, params.v_stride.seq,
                                 kv_rows);
  };

  // ---- load Q: one cp.async group for Q, then the first STAGES-1 K/V tiles start flying too;
  // Q stays in shared memory, where mma_qk_tiles reads each warp's 32 rows from.
  load_tile_async<NUM_THREADS>(q_tile, q_ptr, params.q_stride.seq, min(BLOCK_M, n_q - m_start));
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
      if (n_block >= first_masked) apply_mask(s[t], row0 + 16 * t, n_start, CausalMask{n_kv, causal, offset});

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

#pragma unroll
  for (int t = 0; t < M_TILES; ++t) {
    const int tile_row0 = warp * ROWS_PER_WARP + 16 * t;  // the row tile's first row in the block
    // ---- normalise: finish the row sums across the quad, then one divide per row (deferred).
    const Rows l = quad_sum(l_i[t]);

    // ---- store: bf16 pairs straight from the accumulators; rows past N_q are not written.
    store_rows(o_ptr, params.o_stride.seq, o_i[t], safe_inverse(l), tile_row0, n_q - m_start);
    // LSE = scale·m + ln(l), -inf for a row that saw no key; one lane per row writes it.
    if (params.lse != nullptr) {
      float* lse_ptr = params.lse + (b * params.heads_q + h) * int64_t(n_q) + m_start;  // (B, H_q, N_q) fp32
      store_row_values(lse_ptr, log_sum_exp(m_i[t], l, scale_log2), tile_row0, n_q - m_start);
    }
  }
}

template <int HEAD_DIM, typename Cfg>
Status launch(const AttentionParams& p, cudaStream_t stream) {
  constexpr int smem = Cfg::template smem_bytes<HEAD_DIM>();
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = p.effective_scale() * kLog2e;  // p = 2^(scale_log2·(s − m))
  // Above 48 KiB of dynamic shared memory a kernel must opt in (once per device).
  if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(attention_kernel<HEAD_DIM, Cfg>), smem); !st.ok())
    return st;
  const int64_t bh = p.batch * p.heads_q;  // y holds up to 65535 (batch, head) pairs, z the rest
  const dim3 grid(unsigned(cdiv(p.seqlen_q, Cfg::BLOCK_M)), unsigned(std::min<int64_t>(bh, 65535)),
                  unsigned(cdiv(bh, 65535)));
  attention_kernel<HEAD_DIM, Cfg><<<grid, Cfg::NUM_THREADS, smem, stream>>>(p, scale_log2, p.causal_offset());
  FA_LAUNCH_RETURN();
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

// Per head dim in order of preference (the heuristic's tie-break): step 09's, whose first entry
// won every reference shape of its head dim on an H200 (commit 1cc9be1). BLOCK_M is 32 rows per warp:
// 128 is 4 warps, 64 is 2 (D = 64 only: two warps cannot split a 256-byte row's K/V copy into
// passes of 8 rows, device/smem_tile.h). Every entry is compiled for every architecture, so each one added
// costs CI minutes: add one only if some shape on some GPU measurably wins with it.
const tuner::Tuner kTuner(23, FA_BUILD_ID,
                          {
                              config<64, Config<128, 128, 2>>(),  // half the barriers and max/sum passes per key
                              config<64, Config<128, 64, 3>>(),   // 4 warps, three K/V tiles in flight
                              config<64, Config<128, 64, 2>>(),   // double buffering
                              config<64, Config<64, 64, 3>>(),    // 2 warps: twice the blocks
                              config<128, Config<128, 64, 2>>(),  // 4 warps share each K/V tile
                              config<128, Config<128, 64, 3>>(),  // three K/V tiles in flight
                              config<128, Config<128, 32, 3>>(),  // half the score registers
                              config<128, Config<128, 32, 2>>(),  // ... double-buffered
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
  c.deterministic_backward = true;         // BackwardParams::deterministic: dQ added in a fixed order
  return c;
}();

// ---- the backward ------------------------------------------------------------------------------

constexpr float kLog2e = 1.4426950408889634f;

// 1. D_i = rowsum(dO_i ∘ O_i) in fp32, one thread per query row (B·H_q·N_q of them), into the
// workspace's contiguous (B, H_q, N_q) array.
// Beside it, the row's LSE in exp2 units (LSE·log2 e, and +inf for a row that saw no key, so that
// its P is 0 and not NaN), which the main kernel copies as it is.
template <int HEAD_DIM>
__global__ void preprocess_kernel(const BackwardParams bp, float* delta, float* lse2) {
  const AttentionParams& p = bp.fwd;
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= p.batch * p.heads_q * p.seqlen_q) return;
  const int64_t i = row % p.seqlen_q, bh = row / p.seqlen_q, b = bh / p.heads_q, h = bh % p.heads_q;
  const bf16* o = static_cast<const bf16*>(p.o) + b * p.o_stride.batch + h * p.o_stride.head + i * p.o_stride.seq;
  const bf16* d_o =
      static_cast<const bf16*>(bp.d_o) + b * bp.do_stride.batch + h * bp.do_stride.head + i * bp.do_stride.seq;
  float sum = 0.0f;
#pragma unroll 8
  for (int d = 0; d < HEAD_DIM; ++d) sum += __bfloat162float(o[d]) * __bfloat162float(d_o[d]);
  delta[row] = sum;
  const float lse = p.lse[row];
  lse2[row] = lse == -INFINITY ? INFINITY : lse * kLog2e;
}

// One backward configuration: BLOCK_M queries per Q tile, BLOCK_N keys per block, Q tiles in
// flight (STAGES: the current one and the next). The 8 warps tile the block's work three ways:
//   Sᵀ, dPᵀ (BLOCK_N keys × BLOCK_M queries): 4 warps down the keys × 2 across the queries, each
//      a (32, BLOCK_M / 2) block;
//   dV, dK (BLOCK_N keys × HEAD_DIM): 4 warps down the keys × 2 across D, each (32, HEAD_DIM / 2),
//      from Pᵀ and dSᵀ in shared memory (a warp needs every query of its keys' rows, and computed
//      only half of them);
//   dQ (BLOCK_M queries × HEAD_DIM): the 16-row tiles of the Q tile × slices of D, as in step 22.
// dK and dV stay in registers: (32, HEAD_DIM / 2) fp32 each, HEAD_DIM / 2 floats a thread each (128
// together at D = 128, as in step 22: the same keys per block, split across D instead).
template <int BLOCK_M_, int BLOCK_N_>
struct BwdConfig {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int NUM_WARPS = 8;
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static constexpr int KEY_WARPS = 4;                        // warps down the keys (scores, dK, dV)
  static constexpr int KEYS_PER_WARP = BLOCK_N / KEY_WARPS;  // 32
  static constexpr int QUERY_WARPS = NUM_WARPS / KEY_WARPS;  // warps across the queries of Sᵀ: 2
  static constexpr int QUERIES_PER_WARP = BLOCK_M / QUERY_WARPS;
  static_assert(KEYS_PER_WARP == 32 && QUERIES_PER_WARP % 16 == 0, "each warp's score block is (32, 16·n)");
  // Pᵀ and dSᵀ, (BLOCK_N keys, BLOCK_M queries): swizzled rows need 64 columns or more; 32 are
  // padded by 16 bytes, which keeps ldmatrix and the 4-byte stores free of bank conflicts too.
  using PtLayout = std::conditional_t<BLOCK_M % 64 == 0, SwizzledLayout<BLOCK_M>, PaddedLayout<BLOCK_M>>;
  static constexpr int D_SPLITS = NUM_WARPS / KEY_WARPS;  // warps across D for dK and dV: 2
  // dQ = dS·K: the block's BLOCK_M query rows in 16-row tiles, the warps split over the row tiles
  // and, if there are more warps than row tiles, over column slices of D.
  static constexpr int ROW_TILES = BLOCK_M / 16;
  static constexpr int COL_SPLITS = NUM_WARPS / ROW_TILES;
  static_assert(NUM_WARPS % ROW_TILES == 0, "whole row tiles per warp");
  static constexpr int STAGES = 2;
  // Shared memory: K, V (BLOCK_N, D), STAGES × [Q, dO] (BLOCK_M, D), Pᵀ and dSᵀ (BLOCK_N, BLOCK_M),
  // bf16; then STAGES × [the Q tile's LSE (exp2 units), D], fp32. dS for dQ is dSᵀ read transposed
  // (load_a_trans), not a third tile.
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return SwizzledLayout<HEAD_DIM>::bytes(2 * BLOCK_N + STAGES * 2 * BLOCK_M) + 2 * PtLayout::bytes(BLOCK_N) +
           STAGES * 2 * BLOCK_M * int(sizeof(float));
  }
};

// 2. The main kernel: grid = (KV tiles, B·H_kv). DETERMINISTIC: every Q tile's dQ additions are
// made block by block in the order of the KV tiles, through that tile's turnstile.
template <int HEAD_DIM, typename Cfg, bool DETERMINISTIC>
__global__ void __launch_bounds__(Cfg::NUM_THREADS)
    backward_kernel(const BackwardParams bp, const float* delta, const float* lse2, float* dq_accum, int* turnstiles,
                    const float scale_log2, const int64_t offset) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, NUM_THREADS = Cfg::NUM_THREADS;
  constexpr int DQ_COLS = HEAD_DIM / Cfg::COL_SPLITS;  // the columns of dQ one warp computes
  constexpr int KV_COLS = HEAD_DIM / Cfg::D_SPLITS;    // the columns of dK and dV one warp keeps
  constexpr int WK = Cfg::KEYS_PER_WARP, WQ = Cfg::QUERIES_PER_WARP;
  using Layout = SwizzledLayout<HEAD_DIM>;
  using PtLayout = typename Cfg::PtLayout;  // Pᵀ and dSᵀ: rows are keys
  const AttentionParams& params = bp.fwd;
  extern __shared__ uint4 smem[];
  const SmemTile<BLOCK_N, Layout> k_tile{reinterpret_cast<bf16*>(smem)};  // (BLOCK_N, HEAD_DIM)
  const SmemTile<BLOCK_N, Layout> v_tile = next_tile(k_tile, 1);          // (BLOCK_N, HEAD_DIM)
  constexpr int STAGES = Cfg::STAGES;
  const SmemTile<BLOCK_M, Layout> qdo_tiles{v_tile.ptr + BLOCK_N * Layout::kRowElems};  // STAGES × [Q, dO]
  const SmemTile<BLOCK_N, PtLayout> pt_tile{qdo_tiles.ptr + STAGES * 2 * BLOCK_M * Layout::kRowElems};  // Pᵀ
  const SmemTile<BLOCK_N, PtLayout> dst_tile = next_tile(pt_tile, 1);                                   // dSᵀ
  float* const lse_d_tiles =
      reinterpret_cast<float*>(dst_tile.ptr + BLOCK_N * PtLayout::kRowElems);  // STAGES × [LSE, D]

  const int warp = int(threadIdx.x) / 32;
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);
  const bool causal = params.causal;  // key j visible to query i iff j <= i + offset

  // ---- pointers: this block's KV tile of (batch b, KV head h_kv).
  const int n_start = int(blockIdx.x) * BLOCK_N;
  const int64_t b = blockIdx.y / params.heads_kv, h_kv = blockIdx.y % params.heads_kv;
  const bf16* k_ptr = static_cast<const bf16*>(params.k) + b * params.k_stride.batch + h_kv * params.k_stride.head +
                      int64_t(n_start) * params.k_stride.seq;
  const bf16* v_ptr = static_cast<const bf16*>(params.v) + b * params.v_stride.batch + h_kv * params.v_stride.head +
                      int64_t(n_start) * params.v_stride.seq;
  // This warp's blocks: keys [key0, key0 + 32) (scores, dK, dV); queries [WQ·q_warp, +WQ) of the
  // Q tile (scores); columns [d0, d0 + KV_COLS) of dK and dV.
  const int k_warp = warp % Cfg::KEY_WARPS, q_warp = warp / Cfg::KEY_WARPS;
  const int key_row0 = k_warp * WK, key0 = n_start + key_row0, d0 = q_warp * KV_COLS;

  // The Q tiles that see some key of this KV tile: causal, from the one holding the first query
  // that sees key n_start (query i sees it when i >= n_start − offset) to the last.
  const int m_tiles = (n_q + BLOCK_M - 1) / BLOCK_M;
  const int64_t turnstiles_per_head = (n_q + kBackwardTurnstileRows - 1) / kBackwardTurnstileRows;
  const int64_t first_query = causal ? n_start - offset : 0;
  const int m_first = first_query <= 0 ? 0 : int(first_query / BLOCK_M);

  // ---- load K and V once; they stay in shared memory for every Q tile.
  const int kv_rows = min(BLOCK_N, n_kv - n_start);
  load_tile_async<NUM_THREADS>(k_tile, k_ptr, params.k_stride.seq, kv_rows);
  load_tile_async<NUM_THREADS>(v_tile, v_ptr, params.v_stride.seq, kv_rows);
  cp_async_commit();

  // ---- init state: dK and dV of the warp's 32 keys × KV_COLS columns, two 16-row tiles each, fp32.
  Acc<KV_COLS> dk[2], dv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) dk[r] = zeros<KV_COLS>(), dv[r] = zeros<KV_COLS>();

  // ---- the work items: every (query head of the group, Q tile from m_first on), one flat list in
  // that order; item t's Q, dO, LSE and D go to stage t % STAGES. An item is (hq, walk.tile(k)),
  // the next one k + 1 or the next head's first (no division in the loop). The deterministic mode
  // walks each head's Q tiles down, from the last to m_first: every block of the head then starts
  // on the same Q tile and none waits for a turn that is tiles away.
  const int group = int(params.heads_q / params.heads_kv);
  const QTileWalk walk{m_first, m_tiles, /*down=*/DETERMINISTIC};
  const int items = group * walk.count();
  // Issues the copies of item t = (hq, m_block)'s Q and dO tiles, and of its rows' LSE (exp2 units)
  // and D, into its stage. Rows past N_q arrive as zeros: their scores are masked, so their P is 0.
  auto load_item = [&](int t, int hq, int m_block) {
    const int64_t h = h_kv * group + hq;
    const int m_start = m_block * BLOCK_M;
    const SmemTile<BLOCK_M, Layout> q_t = next_tile(qdo_tiles, 2 * (t % STAGES));
    const SmemTile<BLOCK_M, Layout> do_t = next_tile(qdo_tiles, 2 * (t % STAGES) + 1);
    const bf16* q_head = static_cast<const bf16*>(params.q) + b * params.q_stride.batch + h * params.q_stride.head;
    const bf16* do_head = static_cast<const bf16*>(bp.d_o) + b * bp.do_stride.batch + h * bp.do_stride.head;
    load_tile_async<NUM_THREADS>(q_t, q_head + int64_t(m_start) * params.q_stride.seq, params.q_stride.seq,
                                 min(BLOCK_M, n_q - m_start));
    load_tile_async<NUM_THREADS>(do_t, do_head + int64_t(m_start) * bp.do_stride.seq, bp.do_stride.seq,
                                 min(BLOCK_M, n_q - m_start));
    const int64_t row0 = (b * params.heads_q + h) * n_q + m_start;
    float* const stage = lse_d_tiles + (t % STAGES) * 2 * BLOCK_M;
    for (int i = int(threadIdx.x); i < 2 * BLOCK_M; i += NUM_THREADS) {
      const int r = i % BLOCK_M;
      const bool valid = m_start + r < n_q;
      const float* src = (i < BLOCK_M ? lse2 : delta) + (valid ? row0 + r : 0);
      ptx::cp_async_4(uint32_t(__cvta_generic_to_shared(stage + i)), src, valid);
    }
  };

  // ---- prologue: K and V were committed above; item 0 joins them.
  if (items > 0) load_item(0, 0, walk.tile(m_first));
  cp_async_commit();

  for (int t = 0, hq = 0, k = m_first; t < items; ++t) {
    const int m_block = walk.tile(k);
    const int64_t bh = b * params.heads_q + h_kv * group + hq;
    const int m_start = m_block * BLOCK_M;
    const SmemTile<BLOCK_M, Layout> q_tile = next_tile(qdo_tiles, 2 * (t % STAGES));
    const SmemTile<BLOCK_M, Layout> do_tile = next_tile(qdo_tiles, 2 * (t % STAGES) + 1);
    const float* const lse2_tile = lse_d_tiles + (t % STAGES) * 2 * BLOCK_M;
    const float* const delta_tile = lse2_tile + BLOCK_M;
    cp_async_wait<0>();  // item t's copies (and, at t = 0, K and V) have landed ...
    __syncthreads();     // ... for every thread; and every warp is done with item t − 1's stage
    // Item t + 1 starts flying into the other stage while item t computes.
    if (++k == m_tiles) k = m_first, ++hq;  // (hq, walk.tile(k)) is item t + 1 from here on
    if (t + 1 < items) load_item(t + 1, hq, walk.tile(k));
    cp_async_commit();

    // Sᵀ = K_w·Q_wᵀ and dPᵀ = V_w·dO_wᵀ: the warp's 32 keys against its WQ queries, two 16-key row
    // tiles each, so every Q (dO) fragment feeds both row tiles.
    const int q0 = m_start + q_warp * WQ;  // the warp's first query
    const SmemTile<WQ, Layout> q_rows = row_block<WQ>(q_tile, q_warp), do_rows = row_block<WQ>(do_tile, q_warp);
    Acc<WQ> s[2];
    mma_qk_tiles(s, k_tile, key_row0, q_rows);
    // The mask, as in the forward but transposed (rows are keys): keys past N_kv, queries past
    // N_q and, causal, keys after a query's diagonal get −inf, so that their P is 0; only on a
    // warp block that needs it.
    const bool ragged = key0 + WK > n_kv || q0 + WQ > n_q;
    const bool straddles = causal && key0 + WK - 1 > q0 + offset;  // last key after the first query
    if (ragged || straddles) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
        apply_mask(s[r], key0 + 16 * r, q0, [=](int key, int query) {
          return (key < n_kv) & (query < n_q) & (!causal | (key <= query + int(offset)));
        });
    }
    // Pᵀ from the stored LSE, in place of Sᵀ before dPᵀ is computed: the scores and dPᵀ are never
    // live together (with both, D = 128's deterministic kernel spilled).
#pragma unroll
    for (int r = 0; r < 2; ++r) s[r] = exp2_cols(s[r], scale_log2, lse2_tile + q_warp * WQ);
    Acc<WQ> dp[2];
    mma_qk_tiles(dp, v_tile, key_row0, do_rows);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const Acc<WQ>& p = s[r];
      const Acc<WQ> ds = ds_cols(p, dp[r], delta_tile + q_warp * WQ);  // dSᵀ = Pᵀ ∘ (dPᵀ − D)
      // Both to shared memory as they are, (keys, queries): the products below need every query
      // of a key's row, and this warp computed only WQ of them.
      store_tile_rows(pt_tile, p, key_row0 + 16 * r, q_warp * WQ);
      store_tile_rows(dst_tile, ds, key_row0 + 16 * r, q_warp * WQ);
    }
    __syncthreads();  // Pᵀ and dSᵀ of the whole block are in shared memory

    // dV += Pᵀ·dO and dK += dSᵀ·Q (times c at the end): the warp's 32 keys (A fragments of Pᵀ and
    // dSᵀ, all BLOCK_M queries) on its KV_COLS columns of dO and Q.
    {
      FragA<BLOCK_M> a[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) a[r] = load_a<BLOCK_M>(pt_tile, key_row0 + 16 * r);
      mma_pv_rows<2>(dv, a, do_tile, d0);
#pragma unroll
      for (int r = 0; r < 2; ++r) a[r] = load_a<BLOCK_M>(dst_tile, key_row0 + 16 * r);
      mma_pv_rows<2>(dk, a, q_tile, d0);
    }

    // dQ += dS·K: each warp takes 16 query rows of dS (dSᵀ read transposed) and a slice of D, and
    // adds c · dS·K into the fp32 accumulator.
    // In two halves of the keys: half the A fragments live at a time.
    const int row_tile = warp / Cfg::COL_SPLITS, col0 = (warp % Cfg::COL_SPLITS) * DQ_COLS;
    Acc<DQ_COLS> dq = zeros<DQ_COLS>();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const FragA<BLOCK_N / 2> ds_rows = load_a_trans<BLOCK_N / 2>(row_block<BLOCK_N / 2>(dst_tile, h), row_tile * 16);
      mma_pv_cols(dq, ds_rows, row_block<BLOCK_N / 2>(k_tile, h), col0);
    }
    // Deterministic: the KV tiles that see this Q tile are 0, 1, ..., some last one (a block's
    // first Q tile only moves down as its KV tile does), so this block's turn is its KV tile
    // number. Wait for it, add, and pass the turn on. Each element of dQ then receives its
    // additions in the same order on every run: fp32 addition is not associative, so the order
    // is what fixes the bits. Walking down, the blocks before this one met this Q tile at the same
    // point of their walks, so the wait is their additions alone.
    int* const turnstile = turnstiles + bh * turnstiles_per_head + m_start / int(kBackwardTurnstileRows);
    if constexpr (DETERMINISTIC) {
      if (threadIdx.x == 0)
        while (ptx::ld_acquire_gpu(turnstile) != int(blockIdx.x)) {
        }
      __syncthreads();  // the whole block is after the acquire
    }
    // Two adjacent columns per atomic: dQ's accumulator rows are HEAD_DIM floats from the start of
    // the workspace (16-byte aligned, validated) and col0 is a multiple of 16, so every pair is
    // 8-byte aligned.
    atomic_add_rows_x2(dq_accum + (bh * n_q + m_start) * HEAD_DIM, HEAD_DIM, dq, scale_log2 / kLog2e, row_tile * 16,
                       col0, n_q - m_start);
    if constexpr (DETERMINISTIC) {
      __syncthreads();  // every warp's additions are issued before the turn is passed on
      if (threadIdx.x == 0) ptx::st_release_gpu(turnstile, int(blockIdx.x) + 1);
    }
  }
  cp_async_wait<0>();  // a block with no work item still has K and V in flight: let them land

  // ---- store: dK = c · Σ dSᵀ·Q and dV, bf16, rows past N_kv not written.
  bf16* dk_ptr = static_cast<bf16*>(bp.dk) + b * bp.dk_stride.batch + h_kv * bp.dk_stride.head +
                 int64_t(n_start) * bp.dk_stride.seq;
  bf16* dv_ptr = static_cast<bf16*>(bp.dv) + b * bp.dv_stride.batch + h_kv * bp.dv_stride.head +
                 int64_t(n_start) * bp.dv_stride.seq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    store_rows(dk_ptr + d0, bp.dk_stride.seq, dk[r], rows(scale_log2 / kLog2e), key_row0 + 16 * r, kv_rows);
    store_rows(dv_ptr + d0, bp.dv_stride.seq, dv[r], rows(1.0f), key_row0 + 16 * r, kv_rows);
  }
}

// 3. dQ from its fp32 accumulator (contiguous (B, H_q, N_q, D)) into the caller's bf16 dQ.
__global__ void convert_dq_kernel(const BackwardParams bp, const float* dq_accum) {
  const AttentionParams& p = bp.fwd;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.batch * p.heads_q * p.seqlen_q * p.head_dim) return;
  const int64_t d = idx % p.head_dim, row = idx / p.head_dim;
  const int64_t i = row % p.seqlen_q, bh = row / p.seqlen_q, b = bh / p.heads_q, h = bh % p.heads_q;
  static_cast<bf16*>(bp.dq)[b * bp.dq_stride.batch + h * bp.dq_stride.head + i * bp.dq_stride.seq + d] =
      __float2bfloat16(dq_accum[idx]);
}

template <int HEAD_DIM, typename Cfg>
Status launch_backward(const BackwardParams& bp, cudaStream_t stream) {
  const AttentionParams& p = bp.fwd;
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  // The workspace's parts (include/fa/params.h): dQ's fp32 accumulator, D, the turnstiles, and the
  // LSE in exp2 units.
  // Shared memory first, before anything is written: at D = 128 a block needs 116.5 KB, more than
  // GPUs of compute capability 8.6 and 8.9 give one (99 KB), and there the call is refused as
  // unsupported, so that the library's choice moves on to an earlier step.
  constexpr int smem = Cfg::template smem_bytes<HEAD_DIM>();
  const auto kernel = bp.deterministic ? backward_kernel<HEAD_DIM, Cfg, true> : backward_kernel<HEAD_DIM, Cfg, false>;
  if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
  const BackwardWorkspace ws = backward_workspace(p);
  char* const base = static_cast<char*>(bp.workspace);
  float* dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  float* delta = reinterpret_cast<float*>(base + ws.delta);
  int* turnstiles = reinterpret_cast<int*>(base + ws.turnstiles);
  float* lse2 = reinterpret_cast<float*>(base + ws.lse2);
  FA_CUDA_RETURN(cudaMemsetAsync(dq_accum, 0, ws.dq_accum_count * sizeof(float), stream));
  if (bp.deterministic) FA_CUDA_RETURN(cudaMemsetAsync(turnstiles, 0, ws.turnstile_count * sizeof(int), stream));
  preprocess_kernel<HEAD_DIM><<<unsigned(cdiv(rows, 256)), 256, 0, stream>>>(bp, delta, lse2);
  FA_LAUNCH_RETURN();
  const dim3 grid(unsigned(cdiv(p.seqlen_kv, Cfg::BLOCK_N)), unsigned(p.batch * p.heads_kv));
  kernel<<<grid, Cfg::NUM_THREADS, smem, stream>>>(bp, delta, lse2, dq_accum, turnstiles, p.effective_scale() * kLog2e,
                                                   p.causal_offset());
  FA_LAUNCH_RETURN();
  convert_dq_kernel<<<unsigned(cdiv(rows * HEAD_DIM, 256)), 256, 0, stream>>>(bp, dq_accum);
  FA_LAUNCH_RETURN();
  return Status::Ok();
}

// The backward's grids: the main kernel's B·H_kv along y, and the convert kernel's one thread per
// element of dQ along x (B·H_q·N_q·D / 256 blocks).
Status check_backward_grids(const AttentionParams& p) {
  if (p.batch * p.heads_kv > kMaxGridYZ)
    return Status::Unsupported("the backward's grid holds B·H_kv up to 65535 (got " +
                               std::to_string(p.batch * p.heads_kv) + ")");
  if (cdiv(p.batch * p.heads_q * p.seqlen_q * p.head_dim, 256) > kMaxGridX)
    return Status::Unsupported("the backward's dQ conversion has one thread per element of dQ: at most " +
                               std::to_string(kMaxGridX * 256) + " elements (B·H_q·N_q·D)");
  return Status::Ok();
}

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  return kTuner.run(p, stream);  // the cached config for this problem, tuned on its first call
}

Status backward(const BackwardParams& bp, cudaStream_t stream) {
  if (Status st = validate_backward(bp, kCaps); !st.ok()) return st;
  if (Status st = check_backward_grids(bp.fwd); !st.ok()) return st;
  if (bp.fwd.head_dim == 64) return launch_backward<64, BwdConfig<64, 128>>(bp, stream);
  return launch_backward<128, BwdConfig<32, 128>>(bp, stream);
}

FA_REGISTER_STEP({23, "backward_shared_operands", /*base=*/22,
                  "the backward's warps tile the scores in (32, 32) or (32, 16) blocks and take dK, dV and dQ "
                  "from Pᵀ and dSᵀ in shared memory: more FLOPs per byte of shared memory",
                  kCaps, &forward, "", &backward})

}  // namespace fa::step23
