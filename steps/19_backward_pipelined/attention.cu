// Step 19 — the backward's loads pipelined: step 18's kernels, with the next Q tile's Q, dO, LSE
// and D in flight (cp.async) while the current Q tile computes, in two shared-memory stages. Step
// 17 loaded each Q tile, waited for it and only then computed, with nothing in flight: step 08's
// idea, carried to the backward. The preprocess now also writes the LSE in exp2 units (with +inf
// for a row that saw no key) into the workspace, so the main kernel copies it like D instead of
// converting it on the way. The (query head, Q tile) pairs a block visits become one flat list of
// work items, so the prefetch crosses from one head of a GQA group to the next. The deterministic
// mode is step 18's. Step 17's description of the algorithm, unchanged:
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

#include "device/backward_tile.h"
#include "device/mask.h"
#include "device/ptx/cp_async.h"
#include "device/ptx/sync.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "fa/registry.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/tuner.h"

namespace fa::step19 {
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
const tuner::Tuner kTuner(19, FA_BUILD_ID,
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

// One backward configuration: BLOCK_M queries per Q tile, BLOCK_N keys per block (16 per warp), Q
// tiles in flight (STAGES: the current one and the next).
// dK and dV of a warp's 16 keys stay in registers (2 · HEAD_DIM / 8 · 4 floats a thread: 128 at
// D = 128), beside Sᵀ, Pᵀ, dPᵀ and dSᵀ of BLOCK_M columns each: D = 64 takes Q tiles of 32 queries,
// D = 128 of 16, the most that compile for sm_80 without spilling (255 registers at D = 128).
template <int BLOCK_M_, int BLOCK_N_>
struct BwdConfig {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int NUM_WARPS = BLOCK_N / 16;  // each warp owns 16 keys
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  // dQ = dS·K: the block's BLOCK_M query rows in 16-row tiles, the warps split over the row tiles
  // and, if there are more warps than row tiles, over column slices of D.
  static constexpr int ROW_TILES = BLOCK_M / 16;
  static constexpr int COL_SPLITS = NUM_WARPS / ROW_TILES;
  static_assert(NUM_WARPS % ROW_TILES == 0, "whole row tiles per warp");
  static constexpr int STAGES = 2;
  // Shared memory: K, V (BLOCK_N, D), STAGES × [Q, dO] (BLOCK_M, D), dS (BLOCK_M, BLOCK_N) bf16,
  // swizzled; then STAGES × [the Q tile's LSE (exp2 units), D], fp32.
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return SwizzledLayout<HEAD_DIM>::bytes(2 * BLOCK_N + STAGES * 2 * BLOCK_M) +
           SwizzledLayout<BLOCK_N>::bytes(BLOCK_M) + STAGES * 2 * BLOCK_M * int(sizeof(float));
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
  using Layout = SwizzledLayout<HEAD_DIM>;
  using DsLayout = SwizzledLayout<BLOCK_N>;
  const AttentionParams& params = bp.fwd;
  extern __shared__ uint4 smem[];
  const SmemTile<BLOCK_N, Layout> k_tile{reinterpret_cast<bf16*>(smem)};  // (BLOCK_N, HEAD_DIM)
  const SmemTile<BLOCK_N, Layout> v_tile = next_tile(k_tile, 1);          // (BLOCK_N, HEAD_DIM)
  constexpr int STAGES = Cfg::STAGES;
  const SmemTile<BLOCK_M, Layout> qdo_tiles{v_tile.ptr + BLOCK_N * Layout::kRowElems};  // STAGES × [Q, dO]
  const SmemTile<BLOCK_M, DsLayout> ds_tile{qdo_tiles.ptr + STAGES * 2 * BLOCK_M * Layout::kRowElems};
  float* const lse_d_tiles =
      reinterpret_cast<float*>(ds_tile.ptr + BLOCK_M * DsLayout::kRowElems);  // STAGES × [LSE, D]

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
  const int key0 = n_start + warp * 16;  // this warp's first key

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

  // ---- init state: dK and dV of the warp's 16 keys, fp32.
  Acc<HEAD_DIM> dk = zeros<HEAD_DIM>(), dv = zeros<HEAD_DIM>();

  // ---- the work items: every (query head of the group, Q tile from m_first on), one flat list in
  // that order; item t's Q, dO, LSE and D go to stage t % STAGES. An item is (hq, m_block), the
  // next one the following Q tile or the next head's first (no division in the loop).
  const int group = int(params.heads_q / params.heads_kv);
  const int items = group * max(m_tiles - m_first, 0);
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
  if (items > 0) load_item(0, 0, m_first);
  cp_async_commit();

  for (int t = 0, hq = 0, m_block = m_first; t < items; ++t) {
    const int64_t bh = b * params.heads_q + h_kv * group + hq;
    const int m_start = m_block * BLOCK_M;
    const SmemTile<BLOCK_M, Layout> q_tile = next_tile(qdo_tiles, 2 * (t % STAGES));
    const SmemTile<BLOCK_M, Layout> do_tile = next_tile(qdo_tiles, 2 * (t % STAGES) + 1);
    const float* const lse2_tile = lse_d_tiles + (t % STAGES) * 2 * BLOCK_M;
    const float* const delta_tile = lse2_tile + BLOCK_M;
    cp_async_wait<0>();  // item t's copies (and, at t = 0, K and V) have landed ...
    __syncthreads();     // ... for every thread; and every warp is done with item t − 1's stage
    // Item t + 1 starts flying into the other stage while item t computes.
    if (++m_block == m_tiles) m_block = m_first, ++hq;  // (hq, m_block) is item t + 1 from here on
    if (t + 1 < items) load_item(t + 1, hq, m_block);
    cp_async_commit();

    // Sᵀ = K_w·Qᵀ: the warp's 16 keys against the tile's queries.
    Acc<BLOCK_M> s[1];
    mma_qk_tiles(s, k_tile, warp * 16, q_tile);
    // The mask, as in the forward but transposed (rows are keys): keys past N_kv, queries past
    // N_q and, causal, keys after a query's diagonal get −inf, so that their P is 0.
    const bool ragged = n_start + BLOCK_N > n_kv || m_start + BLOCK_M > n_q;
    const bool straddles = causal && n_start + BLOCK_N - 1 > m_start + offset;  // last key after the first query
    if (ragged || straddles)
      apply_mask(s[0], key0, m_start, [=](int key, int query) {
        return (key < n_kv) & (query < n_q) & (!causal | (key <= query + int(offset)));
      });
    const Acc<BLOCK_M> p = exp2_cols(s[0], scale_log2, lse2_tile);  // Pᵀ, from the stored LSE
    mma_pv(dv, to_bf16(p), do_tile);                                // dV += Pᵀ·dO

    Acc<BLOCK_M> dp[1];
    mma_qk_tiles(dp, v_tile, warp * 16, do_tile);           // dPᵀ = V_w·dOᵀ
    const Acc<BLOCK_M> ds = ds_cols(p, dp[0], delta_tile);  // dSᵀ = Pᵀ ∘ (dPᵀ − D)
    mma_pv(dk, to_bf16(ds), q_tile);                        // dK += dSᵀ·Q (times c at the end)

    // dQ += dS·K: dS goes to shared memory as (queries, keys), then each warp takes 16 query
    // rows (and a slice of D) and adds c · dS·K into the fp32 accumulator.
    store_transposed(ds_tile, ds, warp * 16);
    __syncthreads();
    const int row_tile = warp / Cfg::COL_SPLITS, col0 = (warp % Cfg::COL_SPLITS) * DQ_COLS;
    const FragA<BLOCK_N> ds_rows = load_a<BLOCK_N>(ds_tile, row_tile * 16);
    Acc<DQ_COLS> dq = zeros<DQ_COLS>();
    mma_pv_cols(dq, ds_rows, k_tile, col0);
    // Deterministic: the KV tiles that see this Q tile are 0, 1, ..., some last one (a block's
    // first Q tile only moves down as its KV tile does), so this block's turn is its KV tile
    // number. Wait for it, add, and pass the turn on. Each element of dQ then receives its
    // additions in the same order on every run: fp32 addition is not associative, so the order
    // is what fixes the bits.
    int* const turnstile = turnstiles + bh * turnstiles_per_head + m_start / int(kBackwardTurnstileRows);
    if constexpr (DETERMINISTIC) {
      if (threadIdx.x == 0)
        while (ptx::ld_acquire_gpu(turnstile) != int(blockIdx.x)) {
        }
      __syncthreads();  // the whole block is after the acquire
    }
    atomic_add_rows(dq_accum + (bh * n_q + m_start) * HEAD_DIM, HEAD_DIM, dq, scale_log2 / kLog2e, row_tile * 16, col0,
                    n_q - m_start);
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
  store_rows(dk_ptr, bp.dk_stride.seq, dk, rows(scale_log2 / kLog2e), warp * 16, kv_rows);
  store_rows(dv_ptr, bp.dv_stride.seq, dv, rows(1.0f), warp * 16, kv_rows);
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
  constexpr int smem = Cfg::template smem_bytes<HEAD_DIM>();
  const auto kernel = bp.deterministic ? backward_kernel<HEAD_DIM, Cfg, true> : backward_kernel<HEAD_DIM, Cfg, false>;
  if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
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
  if (bp.fwd.head_dim == 64) return launch_backward<64, BwdConfig<32, 64>>(bp, stream);
  return launch_backward<128, BwdConfig<16, 64>>(bp, stream);
}

FA_REGISTER_STEP({19, "backward_pipelined", /*base=*/18,
                  "the backward's loads pipelined: the next Q tile's Q, dO, LSE and D in flight while the current one "
                  "computes",
                  kCaps, &forward, "", &backward})

}  // namespace fa::step19
