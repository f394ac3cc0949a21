// Step 37 — the backward at D = 64 on Q tiles of 128 queries: step 36's kernel, whose items at
// D = 64 were (64 queries, 128 keys): half the tensor work of an item at D = 128 for the same
// exponentials, the same barriers and handshakes, and a dQ that neither consumer could compute
// alone (each had 64 of the 128 keys, so their two partial products had to be summed in the stage).
// At D = 64 an item is now (128 queries, 128 keys):
//   Sᵀ, dPᵀ      (64 keys, 128 queries) per consumer: 64 registers each, as (64, 64) were at
//                D = 128 with dK and dV twice as large; the registers balance.
//   dQ = dS·K    (128, 64): consumer w takes queries [64w, 64w + 64) over all 128 keys (dSᵀ's
//                query panel w), so each product is whole: no sum, no barrier for it. A Q tile's
//                dQ is one (128, 64) stage, the two consumers' rows of the same two boxes.
//   per item     twice the FLOPs for one set of barriers, mbarrier waits, LSE/D copy and
//                dQ hand-over; half the items.
//   dQ stages    one: K, V, two [Q, dO] stages and two dSᵀ tiles take 160 KB at 128 queries, and a
//                second 32 KB stage would fill the 227 KB a block may have, with no room for the barriers.
// D = 128 is step 36's (64-query tiles: Sᵀ and dPᵀ at 128 queries would not fit beside dK and dV).
// Step 36's description of what it changed from step 35, unchanged:
//
// Step 36 — the dQ warp hands its additions to the copy engine: step 35's roles and handshakes,
// but the dQ warp no longer reads the staged products and adds them with 16-byte atomics (31
// instructions and a round trip per chunk, one or two in flight, at 24 registers). Its first lane
// issues the copy engine's bulk reduce-add (step 26's cp.reduce.async.bulk.tensor), four boxes an
// item, and the L2 makes the additions. Nobody computes while waiting for it, which is what step 26
// lacked: there the thread that waited for the copy engine's read was a compute thread.
//   the stage    the copy engine's layout: (64, 32) fp32 boxes in the 128-byte swizzle, no padding
//                (store_rows_f32_swizzled), the scale c applied as the product is stored. Without
//                the padding two stages fit (226 KB at D = 128): a consumer stages item t while
//                the copy engine still reads item t − 1's.
//   D = 64       the copy engine cannot sum two stages: the second consumer adds the first one's
//                partial product into its own before staging (a named barrier, arrive and sync).
//   the dQ warp  lane 0: wait "dq_full", issue the item's reduces, commit a bulk group; once the
//                group before it has been read, arrive on that stage's "dq_empty". Deterministic:
//                the turn is held until the reduces are complete in global memory.
// Step 35's description of what it changed from step 34, unchanged:
//
// Step 35 — the backward's dQ by a warp of its own: step 34's kernel, whose consumers still added
// their products of dQ into its fp32 accumulator themselves (each warpgroup staged its (64, 64)
// product in shared memory, met at a barrier of its own, and issued 8 atomics a thread). Now the
// producer warpgroup's second warp, idle in step 34, does it:
//   consumers    stage their product of item t, each thread arriving on "dq_full" after its own
//                stores, and go on to item t + 1. Before staging item t they wait on "dq_empty" for
//                the dQ warp to have read item t − 1's (one stage: two would not fit beside the
//                rest, 198 KB, at D = 128). No barrier of their own any more, and no atomics.
//   the dQ warp  waits on "dq_full", adds both consumers' products (D = 128: one 64-column panel
//                each; D = 64: their sum, one panel) with 16-byte atomics, 64 a lane, times c, and
//                arrives on "dq_empty". In the deterministic mode it is the one that waits for the
//                block's turn on the Q tile and passes it on: the consumers never wait for a turn.
// Step 34's description of what it changed from step 33, unchanged:
//
// Step 34 — the backward, warp-specialised: step 33's products, in step 33's order, with the loads
// taken off the warps that compute. Step 33's profile left the main kernel bound by its phase
// structure: every work item began with a block-wide barrier (the item's cp.async copies have
// landed, for every thread) and every thread spent instructions on the copies of the next item.
// The forward went through the same change at step 13; the backward now does:
//   roles        warpgroup 0 is the producer: its first warp loads K and V once and then, item by
//                item, Q and dO through the copy engine (TMA, one thread) and the LSE and D rows
//                (four floats a lane: their rows are not 16-byte aligned, which a bulk copy needs).
//                Warpgroups 1 and 2 are the consumers, step 33's two warpgroups; setmaxnreg gives
//                them 240 registers and the producer 24.
//   handshakes   per stage a "full" mbarrier (the copy engine's bytes and the producer warp's 32
//                arrivals) and an "empty" one (the 256 consumer threads, once their products of the
//                item are done: each thread's arrival releases its own loads of the LSE and D).
//                The __syncthreads at the start of each item is gone: each warp waits for its
//                data alone.
//   dSᵀ          in two tiles, item t in tile t % 2: the consumers' one remaining barrier per item
//                (both halves of dSᵀ are stored, before dQ reads them) also says the other
//                consumer's dQ of item t − 1 is done, so the tile it read can be written again.
// Named barriers replace every other block-wide barrier (the producer has left by then). The
// preprocess and the convert are step 25's. Built for sm_90a alone; the forward is step 23's.
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
#include "device/ptx/mbarrier.h"
#include "device/ptx/sync.h"
#include "device/q_tile_walk.h"
#include "device/row_slice.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "device/warpgroup_tile.h"
#include "fa/registry.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/tma.h"
#include "library/tuner.h"

namespace fa::step37 {
namespace {

using namespace fa::tile;
using fa::ptx::cp_async_commit;
using fa::ptx::cp_async_wait;
using fa::ptx::mbarrier_wait;

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
const tuner::Tuner kTuner(37, FA_BUILD_ID,
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
  c.only_sm = 90;                          // wgmma: sm_90a code, compute capability 9.0 only
  return c;
}();

// The backward reads Q, dO, K and V through tensor maps: no zero strides, 32-bit coordinates,
// 40-bit byte strides (the forward, step 23's, reads them with cp.async and takes any of these).
const Capabilities kBwdCaps = [] {
  Capabilities c = kCaps;
  c.broadcast = false;
  c.tma = true;
  return c;
}();

// ---- the backward ------------------------------------------------------------------------------

constexpr float kLog2e = 1.4426950408889634f;

// The two streaming kernels around the main one (the preprocess and the convert) read and write
// whole rows of (B, H_q, N_q, HEAD_DIM) tensors and do almost no arithmetic: their time is their
// bytes over the memory's rate. Both spread a row over a quad of four lanes as steps 01-03 did
// (device/row_slice.h): lane t holds the 16-byte chunks t, t + 4, ..., so a quad reads 64
// contiguous bytes per load and a warp eight rows at once, every access 16 bytes wide. A block is
// kStreamRows rows of one (batch, query head); grid = (⌈N_q / kStreamRows⌉, B·H_q over y and z).
constexpr int kStreamThreads = 256;
constexpr int kStreamRows = kStreamThreads / kRowLanes;  // 64 rows per block

dim3 stream_grid(const AttentionParams& p) {
  const int64_t bh = p.batch * p.heads_q;  // y holds up to 65535 (batch, head) pairs, z the rest
  return dim3(unsigned(cdiv(p.seqlen_q, kStreamRows)), unsigned(std::min<int64_t>(bh, kMaxGridYZ)),
              unsigned(cdiv(bh, kMaxGridYZ)));
}

// 1. D_i = rowsum(dO_i ∘ O_i) in fp32, a quad per query row, into the workspace's contiguous
// (B, H_q, N_q) array; dQ's fp32 accumulator row zeroed (the main kernel adds into it), in the same
// pass instead of a memset of its own.
// Beside D, the row's LSE in exp2 units (LSE·log2 e, and +inf for a row that saw no key, so that
// its P is 0 and not NaN), which the main kernel copies as it is.
template <int HEAD_DIM>
__global__ void __launch_bounds__(kStreamThreads)
    preprocess_kernel(const BackwardParams bp, float* delta, float* lse2, float* dq_accum) {
  const AttentionParams& p = bp.fwd;
  const int64_t bh = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  if (bh >= p.batch * p.heads_q) return;  // the few spare blocks of the last z slice
  const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
  const int n_q = int(p.seqlen_q), lane = row_lane();
  const int row_in_head = int(blockIdx.x) * kStreamRows + int(threadIdx.x) / kRowLanes;
  const bool valid = row_in_head < n_q;
  // A quad past N_q computes on the head's last row and stores nothing: row_sum's shuffles need
  // the whole warp.
  const int64_t i = valid ? row_in_head : n_q - 1;
  float o[row_slice_size<HEAD_DIM>()], d_o[row_slice_size<HEAD_DIM>()];
  load_row_slice(static_cast<const bf16*>(p.o) + b * p.o_stride.batch + h * p.o_stride.head + i * p.o_stride.seq, lane,
                 o);
  load_row_slice(
      static_cast<const bf16*>(bp.d_o) + b * bp.do_stride.batch + h * bp.do_stride.head + i * bp.do_stride.seq, lane,
      d_o);
  const float sum = row_sum(dot_slice(o, d_o));
  if (!valid) return;
  const int64_t row = bh * n_q + i;
  const float zero[row_slice_size<HEAD_DIM>()] = {};
  store_row_slice(dq_accum + row * HEAD_DIM, lane, zero);
  if (lane == 0) {
    delta[row] = sum;
    const float lse = p.lse[row];
    lse2[row] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

// One backward configuration: BLOCK_M queries per Q tile (64 at D = 128, 128 at D = 64), BLOCK_N =
// 128 keys per block; a producer warpgroup (its first warp loads, its second hands dQ to the copy
// engine, the other two leave) and two consumer warpgroups of four warps. Consumer w owns keys
// [64w, 64w + 64): its Sᵀ, dPᵀ (64, BLOCK_M) and its dK, dV (64, HEAD_DIM) are wgmma accumulators,
// each warp holding 16 keys' rows of them. dQ = dS·K (BLOCK_M, HEAD_DIM) is one (64, 64) product
// per consumer over all 128 keys: at D = 128 each takes one of K's two 64-column panels; at D = 64
// each takes one of the Q tile's two 64-query panels.
template <int HEAD_DIM>
struct BwdConfig {
  static constexpr int BLOCK_M = HEAD_DIM == 64 ? 128 : 64;
  static constexpr int BLOCK_N = 128;
  static constexpr int CONSUMERS = 2;                    // consumer warpgroups
  static constexpr int NUM_WARPS = 4 * (1 + CONSUMERS);  // the producer warpgroup first
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static constexpr int CONSUMER_THREADS = 128 * CONSUMERS;
  static constexpr int KEYS_PER_WARPGROUP = BLOCK_N / CONSUMERS;  // 64: one wgmma's M
  static constexpr int D_PANELS = HEAD_DIM / 64;                  // dQ's 64-column blocks
  static constexpr int Q_PANELS = BLOCK_M / 64;                   // dQ's 64-row blocks
  static_assert(D_PANELS * Q_PANELS == CONSUMERS, "one (64, 64) product of dQ per consumer");
  static constexpr int STAGES = 2;  // work items in flight: Q, dO, LSE and D of each
  // Registers per thread after setmaxnreg (step 13): the block's pool is 384 × 168; the producer
  // keeps 24, the consumers take 240, what step 33's 256 threads had (it used 245 of 255).
  static constexpr int ENTRY_REGS = 65536 / NUM_THREADS / 8 * 8;
  static constexpr int PRODUCER_REGS = 24;
  static constexpr int CONSUMER_REGS = 240;
  static_assert(128 * PRODUCER_REGS + CONSUMER_THREADS * CONSUMER_REGS <= NUM_THREADS * ENTRY_REGS,
                "the consumers would ask setmaxnreg for more registers than the block holds");
  using QLayout = WgmmaLayout<BLOCK_M, HEAD_DIM>;   // Q and dO: (BLOCK_M, HEAD_DIM)
  using KVLayout = WgmmaLayout<BLOCK_N, HEAD_DIM>;  // K and V: (BLOCK_N, HEAD_DIM)
  using DsLayout = WgmmaLayout<BLOCK_N, BLOCK_M>;   // dSᵀ: (BLOCK_N keys, BLOCK_M queries)
  // A Q tile's dQ (BLOCK_M, HEAD_DIM) is staged in shared memory as the copy engine reads it:
  // HEAD_DIM / 32 boxes of (BLOCK_M, 32) fp32 in the 128-byte swizzle (32 KB, 1024-byte aligned),
  // each consumer writing its (64, 64) product into two of them (D = 128: its own two; D = 64: its
  // 64 rows of both), and added into global memory from there by a bulk reduce. DQ_STAGES items:
  // at D = 128 the consumers stage item t while the copy engine reads item t − 1's; at D = 64 a
  // second stage does not fit (the header).
  static constexpr int DQ_STAGE_FLOATS = BLOCK_M * HEAD_DIM;  // one item's dQ
  static constexpr int DQ_STAGES = HEAD_DIM == 64 ? 1 : 2;
  // Shared memory: K, V, STAGES × [Q, dO], two dSᵀ tiles, bf16 in wgmma's swizzle (each tile a
  // multiple of 1024 bytes, so every one starts on a swizzle-atom boundary); the dQ stages, fp32 in
  // TMA's swizzle (1024-byte aligned too); then STAGES × [the Q tile's LSE (exp2 units), D]; and
  // 1 KiB to align the start. 226 KB at D = 128, 195 KB at D = 64, of the 227 a block may have.
  static constexpr int smem_bytes() {
    return kWgmmaAlignment + KVLayout::bytes(2 * BLOCK_N) + QLayout::bytes(STAGES * 2 * BLOCK_M) +
           DsLayout::bytes(2 * BLOCK_N) + (DQ_STAGES * DQ_STAGE_FLOATS + STAGES * 2 * BLOCK_M) * int(sizeof(float));
  }
};

// The tensor maps of the backward: K and V in boxes of BLOCK_N rows, Q and dO of BLOCK_M (loads);
// dQ's fp32 accumulator, (B·H_q, N_q, HEAD_DIM) in (BLOCK_M, 32) boxes (the bulk reduce).
struct BwdTileMaps {
  QkvTileMaps qkv;
  CUtensorMap d_o;
  CUtensorMap dq;
};

// Where the dQ warp adds a staged item: the Q tile's first row and its (batch, query head), the
// coordinates of dQ's map (rows past N_q are clipped by it), and the Q tile's turnstile
// (deterministic mode).
struct DqItem {
  int m_start;
  int bh;
  int64_t turnstile;
};

// The named barrier of the consumers together (0 is __syncthreads', which no role may use once the
// roles have split).
constexpr int kConsumersBarrier = 1;

// 2. The main kernel: grid = (KV tiles, B·H_kv). DETERMINISTIC: every Q tile's dQ additions are
// made block by block in the order of the KV tiles, through that tile's turnstile.
// __launch_bounds__(threads, 1): the register cap at entry that setmaxnreg needs.
template <int HEAD_DIM, typename Cfg, bool DETERMINISTIC>
__global__ void __launch_bounds__(Cfg::NUM_THREADS, 1)
    backward_kernel(const BackwardParams bp, const float* delta, const float* lse2, int* turnstiles,
                    const float scale_log2, const int64_t offset, const __grid_constant__ BwdTileMaps maps) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, CONSUMER_THREADS = Cfg::CONSUMER_THREADS;
  using QLayout = typename Cfg::QLayout;
  using KVLayout = typename Cfg::KVLayout;
  using DsLayout = typename Cfg::DsLayout;
  const AttentionParams& params = bp.fwd;
  extern __shared__ uint4 smem[];  // 16-byte aligned; wgmma's swizzle atoms need 1024 (below)
  const SmemTile<BLOCK_N, KVLayout> kv_tiles{aligned_for_wgmma(smem)};  // K, V: (BLOCK_N, HEAD_DIM) each
  constexpr int STAGES = Cfg::STAGES;
  const SmemTile<BLOCK_M, QLayout> qdo_tiles{kv_tiles.ptr + 2 * BLOCK_N * KVLayout::kRowElems};  // STAGES × [Q, dO]
  const SmemTile<BLOCK_N, DsLayout> dst_tiles{qdo_tiles.ptr + STAGES * 2 * BLOCK_M * QLayout::kRowElems};  // 2 × dSᵀ
  constexpr int DQ_STAGES = Cfg::DQ_STAGES;
  float* const dq_stages =
      reinterpret_cast<float*>(dst_tiles.ptr + 2 * BLOCK_N * DsLayout::kRowElems);  // DQ_STAGES × (BLOCK_M, HEAD_DIM)
  float* const lse_d_tiles = dq_stages + DQ_STAGES * Cfg::DQ_STAGE_FLOATS;          // STAGES × [LSE, D]
  // Where each dQ stage's products go: written by the consumers' first thread with them, read by
  // the dQ warp, under the same two mbarriers.
  __shared__ DqItem dq_item[DQ_STAGES];
  // The handshakes: "kv" (K and V have landed), per stage "full" (the item's Q and dO have landed,
  // the copy engine's bytes and the producer warp's 32 arrivals, one per lane after its LSE and D
  // stores) and "empty" (every consumer thread is done with the stage: 256 arrivals).
  // And per dQ stage: "dq_full" (both consumers' products are in it: 256 arrivals, one per thread
  // after its stores) and "dq_empty" (the copy engine has read it: 1 arrival, the dQ warp's lane 0).
  __shared__ uint64_t kv_full, full[STAGES], empty[STAGES], dq_full[DQ_STAGES], dq_empty[DQ_STAGES];
  auto bar = [](uint64_t& b) { return uint32_t(__cvta_generic_to_shared(&b)); };

  // The warp index from lane 0, warp-uniform as in step 33.
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0), role = warp / 4;  // 0: producer
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);
  const bool causal = params.causal;  // key j visible to query i iff j <= i + offset

  // ---- this block's KV tile of (batch b, KV head h_kv).
  const int n_start = int(blockIdx.x) * BLOCK_N;
  const int64_t b = blockIdx.y / params.heads_kv, h_kv = blockIdx.y % params.heads_kv;

  // The Q tiles that see some key of this KV tile: causal, from the one holding the first query
  // that sees key n_start (query i sees it when i >= n_start − offset) to the last.
  const int m_tiles = (n_q + BLOCK_M - 1) / BLOCK_M;
  const int64_t first_query = causal ? n_start - offset : 0;
  const int m_first = first_query <= 0 ? 0 : int(first_query / BLOCK_M);
  // The work items: every (query head of the group, Q tile from m_first on), one flat list in that
  // order; item t's Q, dO, LSE and D go to stage t % STAGES, its dSᵀ to tile t % 2. An item is
  // (hq, walk.tile(k)), the next one k + 1 or the next head's first (no division in the loop).
  // The deterministic mode walks each head's Q tiles down (step 22).
  const int group = int(params.heads_q / params.heads_kv);
  const QTileWalk walk{m_first, m_tiles, /*down=*/DETERMINISTIC};
  const int items = group * walk.count();

  // Barriers: initialised by one thread, made visible to the copy engine, seen by the block.
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(bar(kv_full), 1);
    for (int stage = 0; stage < STAGES; ++stage) {
      ptx::mbarrier_init(bar(full[stage]), 32);
      ptx::mbarrier_init(bar(empty[stage]), CONSUMER_THREADS);
    }
    for (int stage = 0; stage < DQ_STAGES; ++stage) {
      ptx::mbarrier_init(bar(dq_full[stage]), CONSUMER_THREADS);
      ptx::mbarrier_init(bar(dq_empty[stage]), 1);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on the roles meet on mbarriers only

  // ---- the producer: its first warp loads K and V once, then every item's Q, dO (the copy engine,
  // issued by lane 0) and LSE and D (BLOCK_M floats each, BLOCK_M / 32 per lane: rows not 16-byte
  // aligned, which a bulk copy needs), each item as soon as its stage is free.
  if (role == 0) {
    ptx::warpgroup_reg_dealloc<Cfg::PRODUCER_REGS>();
    if (warp > 1 || items == 0) return;  // no item: no load, and nothing in flight at the exit
    const int lane = lane_id();
    if (warp == 1) {
      // ---- the dQ warp, its lane 0: item by item, once both consumers' products are in the
      // stage, has the copy engine add them into dQ's accumulator (the products are already times
      // c), and hands the stage back once the copy engine has read it. Rows past N_q are clipped by
      // the map. In the deterministic mode it holds the block's turn on the Q tile until the
      // additions are complete in global memory.
      if (lane != 0) return;
      for (int t = 0; t < items; ++t) {
        const int stage = t % DQ_STAGES;
        mbarrier_wait(bar(dq_full[stage]), (t / DQ_STAGES) % 2);  // item t's products are staged
        const DqItem item = dq_item[stage];
        const float* const boxes = dq_stages + stage * Cfg::DQ_STAGE_FLOATS;
        if constexpr (DETERMINISTIC) {
          while (ptx::ld_acquire_gpu(turnstiles + item.turnstile) != int(blockIdx.x)) {
          }
          ptx::fence_proxy_async_global();  // the reduces below come after the acquire
        }
        // Box c, (BLOCK_M, 32), into columns 32·c of the Q tile's rows; one bulk group per item.
#pragma unroll
        for (int box = 0; box < HEAD_DIM / 32; ++box)
          ptx::tma_reduce_add_3d(&maps.dq, 32 * box, item.m_start, item.bh,
                                 uint32_t(__cvta_generic_to_shared(boxes + box * BLOCK_M * 32)));
        ptx::bulk_commit_group();
        if constexpr (DETERMINISTIC) {
          ptx::bulk_wait_group<0>();        // complete in global memory ...
          ptx::fence_proxy_async_global();  // ... before the release publishes them
          ptx::st_release_gpu(turnstiles + item.turnstile, int(blockIdx.x) + 1);
          ptx::mbarrier_arrive(bar(dq_empty[stage]));
        } else {
          // Item t − (DQ_STAGES − 1)'s reduces have read their stage (with two stages, item t's may
          // still be reading): hand it back.
          ptx::bulk_wait_group_read<DQ_STAGES - 1>();
          if (t >= DQ_STAGES - 1) ptx::mbarrier_arrive(bar(dq_empty[(t - (DQ_STAGES - 1)) % DQ_STAGES]));
        }
      }
      ptx::bulk_wait_group<0>();  // every reduce complete before the block (and its shared memory) goes
      return;
    }
    if (lane == 0) {
      ptx::mbarrier_arrive_expect_tx(bar(kv_full), 2 * BLOCK_N * HEAD_DIM * 2);
      load_tile_tma(kv_tiles, &maps.qkv.k, n_start, int(h_kv), int(b), bar(kv_full));
      load_tile_tma(next_tile(kv_tiles, 1), &maps.qkv.v, n_start, int(h_kv), int(b), bar(kv_full));
    }
    for (int t = 0, hq = 0, k = m_first; t < items; ++t) {
      const int stage = t % STAGES, use = t / STAGES;
      if (use > 0) mbarrier_wait(bar(empty[stage]), (use - 1) % 2);  // its previous item is released
      const int m_start = walk.tile(k) * BLOCK_M;
      const int64_t h = h_kv * group + hq, row0 = (b * params.heads_q + h) * n_q + m_start;
      // Rows past N_q get 0: their scores are masked, so their P is 0 whatever the LSE.
      float* const stage_rows = lse_d_tiles + stage * 2 * BLOCK_M;
#pragma unroll
      for (int i = lane; i < 2 * BLOCK_M; i += 32) {
        const int r = i % BLOCK_M;
        stage_rows[i] = m_start + r < n_q ? (i < BLOCK_M ? lse2 : delta)[row0 + r] : 0.0f;
      }
      // Each lane's arrival releases its own stores; lane 0's also announces Q's and dO's bytes.
      if (lane == 0) {
        ptx::mbarrier_arrive_expect_tx(bar(full[stage]), 2 * BLOCK_M * HEAD_DIM * 2);
        load_tile_tma(next_tile(qdo_tiles, 2 * stage), &maps.qkv.q, m_start, int(h), int(b), bar(full[stage]));
        load_tile_tma(next_tile(qdo_tiles, 2 * stage + 1), &maps.d_o, m_start, int(h), int(b), bar(full[stage]));
      } else {
        ptx::mbarrier_arrive(bar(full[stage]));
      }
      if (++k == m_tiles) k = m_first, ++hq;
    }
    return;
  }

  // ---- the consumers
  ptx::warpgroup_reg_alloc<Cfg::CONSUMER_REGS>();
  const int cwarp = warp - 4, wg = role - 1;  // the warp among the consumers', the consumer's index
  // This warp's 16 keys of Sᵀ, dPᵀ, dK and dV: rows [key_row0, key_row0 + 16) of the block's keys,
  // inside its consumer's 64. Its consumer's product of dQ: query panel q_panel, column panel
  // d_panel, over all 128 keys (D = 128: the Q tile's 64 queries, columns 64·wg; D = 64: queries
  // 64·wg of the 128, every column).
  const int wg_key0 = wg * Cfg::KEYS_PER_WARPGROUP, key_row0 = 16 * cwarp, key0 = n_start + key_row0;
  const int d_panel = wg / Cfg::Q_PANELS, q_panel = wg % Cfg::Q_PANELS;
  const int64_t turnstiles_per_head = (n_q + kBackwardTurnstileRows - 1) / kBackwardTurnstileRows;
  const int kv_rows = min(BLOCK_N, n_kv - n_start);

  // ---- init state: dK and dV of the warp's 16 keys × HEAD_DIM columns, fp32 wgmma accumulators.
  Acc<HEAD_DIM> dk = zeros<HEAD_DIM>(), dv = zeros<HEAD_DIM>();
  if (items > 0) mbarrier_wait(bar(kv_full), 0);  // K and V have landed

  for (int t = 0, hq = 0, k = m_first; t < items; ++t) {
    const int m_block = walk.tile(k);
    const int64_t bh = b * params.heads_q + h_kv * group + hq;
    const int m_start = m_block * BLOCK_M;
    if (++k == m_tiles) k = m_first, ++hq;
    const int stage = t % STAGES;
    const SmemTile<BLOCK_M, QLayout> q_tile = next_tile(qdo_tiles, 2 * stage);
    const SmemTile<BLOCK_M, QLayout> do_tile = next_tile(qdo_tiles, 2 * stage + 1);
    const float* const lse2_tile = lse_d_tiles + stage * 2 * BLOCK_M;
    const float* const delta_tile = lse2_tile + BLOCK_M;
    const SmemTile<BLOCK_N, DsLayout> dst_tile = next_tile(dst_tiles, t % 2);
    // K and V stay put; opaque() keeps their wgmma descriptors out of the registers between items.
    const SmemTile<BLOCK_N, KVLayout> k_tile = opaque(kv_tiles), v_tile = next_tile(k_tile, 1);
    // Item t's Q, dO, LSE and D have landed: its stage's phase t / STAGES. No block-wide barrier:
    // each warp waits for the data alone.
    mbarrier_wait(bar(full[stage]), (t / STAGES) % 2);

    // Sᵀ = K_w·Qᵀ and dPᵀ = V_w·dOᵀ: the consumer's 64 keys against every query of the Q tile,
    // two groups in flight; Sᵀ is turned into Pᵀ while dPᵀ is still being computed.
    Acc<BLOCK_M> s, dp;
    wgmma_begin(s, dp);
    mma_qk_async(by_addition, s, k_tile, wg_key0, q_tile);
    ptx::wgmma_commit();
    mma_qk_async(by_addition, dp, v_tile, wg_key0, do_tile);
    ptx::wgmma_commit();
    wait_for<1>(s);  // Sᵀ is in the registers (dPᵀ may still be in flight)
    // The mask, as in step 23: keys past N_kv, queries past N_q and, causal, keys after a query's
    // diagonal get −inf, so that their P is 0; only on a warp's rows that need it.
    const bool ragged = key0 + 16 > n_kv || m_start + BLOCK_M > n_q;
    const bool straddles = causal && key0 + 15 > m_start + offset;  // last key after the first query
    if (ragged || straddles)
      apply_mask(s, key0, m_start, [=](int key, int query) {
        return (key < n_kv) & (query < n_q) & (!causal | (key <= query + int(offset)));
      });
    s = exp2_cols(s, scale_log2, lse2_tile);  // Pᵀ from the stored LSE, in place of Sᵀ
    wait_for<0>(dp);
    const Acc<BLOCK_M> ds = ds_cols(s, dp, delta_tile);  // dSᵀ = Pᵀ ∘ (dPᵀ − D)
    // dSᵀ to shared memory as it is, (keys, queries): dQ needs every key of a query's row, and
    // this consumer computed 64 of the block's 128. Tile t % 2: the other one may still be read
    // by the other consumer's dQ of item t − 1.
    store_tile_rows(dst_tile, ds, key_row0, 0, int(opaque_thread_index() % 32));  // addresses computed here

    // dV += Pᵀ·dO and dK += dSᵀ·Q (times c at the end): Pᵀ and dSᵀ from the registers they were
    // computed in, the warp's FragA of its 16 keys, every query of the Q tile.
    FragA<BLOCK_M> p_frag = to_bf16(s), ds_frag = to_bf16(ds);
    wgmma_begin(dv, dk, p_frag, ds_frag);
    mma_pv_async(by_addition, dv, p_frag, do_tile);
    mma_pv_async(by_addition, dk, ds_frag, q_tile);
    ptx::wgmma_commit();
    ptx::fence_proxy_async_shared();  // the dSᵀ stores, read next by the tensor cores ...
    ptx::named_barrier_sync(kConsumersBarrier, CONSUMER_THREADS);  // ... of both consumers: the whole tile is there

    // dQ = dS·K: this consumer's (64, 64) product over all 128 keys: dSᵀ's query panel q_panel
    // (dS's rows, read transposed) and K's column panel d_panel.
    Acc<64> dq;
    wgmma_begin(dq);
    mma_at_b_async(by_addition, dq, dst_tile, q_panel, k_tile, d_panel);
    ptx::wgmma_commit();
    wait_for<0>(dq, dv, dk, p_frag, ds_frag);  // every product of item t is done ...
    // ... and this thread's reads of the stage: every consumer thread arrives for its own reads (a
    // lane's arrival releases that lane's loads of the LSE and D only, not its neighbours').
    ptx::mbarrier_arrive(bar(empty[stage]));
    // The product, times c, to dQ's stage t % DQ_STAGES in the copy engine's layout (its rows
    // 64·q_panel on of the boxes of columns 64·d_panel on), once the copy engine has read item
    // t − DQ_STAGES's from it; then handed over. Each thread's arrival releases its own stores,
    // after its proxy fence (the copy engine reads them).
    const int dq_stage = t % DQ_STAGES;
    if (t >= DQ_STAGES) mbarrier_wait(bar(dq_empty[dq_stage]), (t / DQ_STAGES - 1) % 2);
    // (The warp's row in its consumer from an index the compiler cannot see through, computed here:
    // held across the loop beside Sᵀ and dPᵀ at 128 queries, it was the one value spilled.)
    store_rows_f32_swizzled<BLOCK_M>(dq_stages + dq_stage * Cfg::DQ_STAGE_FLOATS + d_panel * BLOCK_M * 64, dq,
                                     64 * q_panel + 16 * int(opaque_thread_index() / 32 % 4), scale_log2 / kLog2e);
    ptx::fence_proxy_async_shared();  // the stores, read next by the copy engine
    if (cwarp == 0 && lane_id() == 0)
      dq_item[dq_stage] = DqItem{m_start, int(bh), bh * turnstiles_per_head + m_start / int(kBackwardTurnstileRows)};
    ptx::mbarrier_arrive(bar(dq_full[dq_stage]));
  }

  // ---- store: dK = c · Σ dSᵀ·Q and dV, bf16, rows past N_kv not written.
  bf16* dk_ptr = static_cast<bf16*>(bp.dk) + b * bp.dk_stride.batch + h_kv * bp.dk_stride.head +
                 int64_t(n_start) * bp.dk_stride.seq;
  bf16* dv_ptr = static_cast<bf16*>(bp.dv) + b * bp.dv_stride.batch + h_kv * bp.dv_stride.head +
                 int64_t(n_start) * bp.dv_stride.seq;
  store_rows(dk_ptr, bp.dk_stride.seq, dk, rows(scale_log2 / kLog2e), key_row0, kv_rows);
  store_rows(dv_ptr, bp.dv_stride.seq, dv, rows(1.0f), key_row0, kv_rows);
}

// 3. dQ from its fp32 accumulator (contiguous (B, H_q, N_q, D)) into the caller's bf16 dQ, a quad
// per row: 32 bytes read and 16 written per chunk.
template <int HEAD_DIM>
__global__ void __launch_bounds__(kStreamThreads) convert_dq_kernel(const BackwardParams bp, const float* dq_accum) {
  const AttentionParams& p = bp.fwd;
  const int64_t bh = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  const int64_t i = int64_t(blockIdx.x) * kStreamRows + threadIdx.x / kRowLanes;
  if (bh >= p.batch * p.heads_q || i >= p.seqlen_q) return;
  const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
  float dq[row_slice_size<HEAD_DIM>()];
  load_row_slice(dq_accum + (bh * p.seqlen_q + i) * HEAD_DIM, row_lane(), dq);
  store_row_slice(static_cast<bf16*>(bp.dq) + b * bp.dq_stride.batch + h * bp.dq_stride.head + i * bp.dq_stride.seq,
                  row_lane(), dq);
}

template <int HEAD_DIM, typename Cfg>
Status launch_backward(const BackwardParams& bp, cudaStream_t stream) {
  const AttentionParams& p = bp.fwd;
  // The workspace's parts (include/fa/params.h): dQ's fp32 accumulator, D, the turnstiles, and the
  // LSE in exp2 units.
  // Shared memory first, before anything is written (226 KB at D = 128, 195 KB at D = 64).
  constexpr int smem = Cfg::smem_bytes();
  const auto kernel = bp.deterministic ? backward_kernel<HEAD_DIM, Cfg, true> : backward_kernel<HEAD_DIM, Cfg, false>;
  if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
  const BackwardWorkspace ws = backward_workspace(p);
  char* const base = static_cast<char*>(bp.workspace);
  float* dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  float* delta = reinterpret_cast<float*>(base + ws.delta);
  int* turnstiles = reinterpret_cast<int*>(base + ws.turnstiles);
  float* lse2 = reinterpret_cast<float*>(base + ws.lse2);
  // The tensor maps, by value, before anything is written: K and V in boxes of BLOCK_N rows, Q and
  // dO of BLOCK_M, dQ's accumulator (B·H_q, N_q, HEAD_DIM) fp32 in (BLOCK_M, 32) boxes
  // (library/tma.h).
  BwdTileMaps maps;
  if (Status st = make_qkv_tile_maps(&maps.qkv, p, Cfg::BLOCK_M, Cfg::BLOCK_N); !st.ok()) return st;
  if (Status st = make_tile_map(&maps.d_o, "d_o", bp.d_o, p.batch, p.heads_q, p.seqlen_q, p.head_dim, bp.do_stride,
                                Cfg::BLOCK_M);
      !st.ok())
    return st;
  if (Status st = make_accum_map(&maps.dq, dq_accum, p.batch * p.heads_q, p.seqlen_q, HEAD_DIM, Cfg::BLOCK_M); !st.ok())
    return st;
  if (bp.deterministic) FA_CUDA_RETURN(cudaMemsetAsync(turnstiles, 0, ws.turnstile_count * sizeof(int), stream));
  preprocess_kernel<HEAD_DIM><<<stream_grid(p), kStreamThreads, 0, stream>>>(bp, delta, lse2, dq_accum);
  FA_LAUNCH_RETURN();
  const dim3 grid(unsigned(cdiv(p.seqlen_kv, Cfg::BLOCK_N)), unsigned(p.batch * p.heads_kv));
  kernel<<<grid, Cfg::NUM_THREADS, smem, stream>>>(bp, delta, lse2, turnstiles, p.effective_scale() * kLog2e,
                                                   p.causal_offset(), maps);
  FA_LAUNCH_RETURN();
  convert_dq_kernel<HEAD_DIM><<<stream_grid(p), kStreamThreads, 0, stream>>>(bp, dq_accum);
  FA_LAUNCH_RETURN();
  return Status::Ok();
}

// The backward's grids: the main kernel's B·H_kv along y. The streaming kernels' B·H_q over y and z
// holds up to 65535², the bound validate() already puts on B·H_q (kCaps.max_batch_heads). The bulk
// reduce names a Q tile by 32-bit coordinates: B·H_q up to 2^31 − 1 (step 26).
Status check_backward_grids(const AttentionParams& p) {
  if (p.batch * p.heads_kv > kMaxGridYZ)
    return Status::Unsupported("the backward's grid holds B·H_kv up to 65535 (got " +
                               std::to_string(p.batch * p.heads_kv) + ")");
  if (p.batch * p.heads_q > INT32_MAX)
    return Status::Unsupported(
        "the backward's dQ reduce addresses B·H_q with 32-bit coordinates: at most 2^31 - 1 (got " +
        std::to_string(p.batch * p.heads_q) + ")");
  return Status::Ok();
}

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  if (Status st = check_device(kCaps); !st.ok()) return st;  // sm_90a code on a GPU that can run it
  return kTuner.run(p, stream);  // the cached config for this problem, tuned on its first call
}

Status backward(const BackwardParams& bp, cudaStream_t stream) {
  if (Status st = validate_backward(bp, kBwdCaps); !st.ok()) return st;
  if (Status st = check_backward_grids(bp.fwd); !st.ok()) return st;
  if (Status st = check_device(kCaps); !st.ok()) return st;  // sm_90a code on a GPU that can run it
  if (bp.fwd.head_dim == 64) return launch_backward<64, BwdConfig<64>>(bp, stream);
  return launch_backward<128, BwdConfig<128>>(bp, stream);
}

FA_REGISTER_STEP({37, "backward_wide_q_tiles", /*base=*/36,
                  "the backward at D = 64 on Q tiles of 128 queries: each consumer's dQ is whole (its 64 queries "
                  "over all 128 keys), no partial products summed, twice the work per item, sm_90a",
                  kCaps, &forward, "", &backward})

}  // namespace fa::step37
