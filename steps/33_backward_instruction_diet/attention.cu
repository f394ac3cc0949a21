// Step 33 — the backward on an instruction diet: step 25's kernels, the same products in the same
// order, with fewer instructions in the main kernel's loop. Step 26 read that loop's SASS (in the
// production backward, step 25's kernel; step 25's own holds 1,336): about 1,300 instructions per
// thread and work item at D = 128, two thirds of them integer and address arithmetic, while the
// tensor cores wait for the warps to issue them. Four changes, no structure:
//   descriptors  each wgmma's two shared-memory descriptors were built from their addresses at
//                every k-step (add, mask, shift, or, and the move into uniform registers: about 12
//                instructions a wgmma); now each product builds its operands' descriptors once and
//                adds the k-step's offset (device/warpgroup_tile.h's by_addition forms);
//   warp index   read through a shuffle from lane 0, which the compiler knows is the same on every
//                lane: the warpgroup's K and V rows, and with them their descriptors, go to the
//                uniform registers and the uniform datapath;
//   LSE and D    copied by one instruction per thread (128 floats, 256 threads), where a loop the
//                compiler could not see runs once was unrolled four ways;
//   dQ atomics   their per-thread addresses computed where they are used, from a thread index the
//                compiler cannot see through (opaque_thread_index): hoisted out of the loop, they
//                took the registers the descriptors had freed, and the kernel spilled.
// The preprocess and the convert are step 25's. Built for sm_90a alone; the forward is step 23's.
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
#include "device/row_slice.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "device/warpgroup_tile.h"
#include "fa/registry.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/tuner.h"

namespace fa::step33 {
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
const tuner::Tuner kTuner(33, FA_BUILD_ID,
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

// One backward configuration: BLOCK_M = 64 queries per Q tile, BLOCK_N = 128 keys per block, two
// warpgroups of four warps. Warpgroup w owns keys [64w, 64w + 64): its Sᵀ, dPᵀ (64, 64) and its
// dK, dV (64, HEAD_DIM) are wgmma accumulators, each warp holding 16 keys' rows of them.
// dQ = dS·K (64, HEAD_DIM) is one (64, 64) product per warpgroup: at D = 128 each takes one of K's
// two 64-column panels over all 128 keys; at D = 64 each takes its own 64 keys, and the two
// partial sums are added together in shared memory before they go out.
template <int HEAD_DIM>
struct BwdConfig {
  static constexpr int BLOCK_M = 64;
  static constexpr int BLOCK_N = 128;
  static constexpr int NUM_WARPGROUPS = 2;
  static constexpr int NUM_WARPS = 4 * NUM_WARPGROUPS;
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static constexpr int KEYS_PER_WARPGROUP = BLOCK_N / NUM_WARPGROUPS;  // 64: one wgmma's M
  static constexpr int D_PANELS = HEAD_DIM / 64;                       // dQ's 64-column blocks
  static constexpr int KEY_SPLITS = NUM_WARPGROUPS / D_PANELS;         // warpgroups per block of dQ
  static_assert(D_PANELS * KEY_SPLITS == NUM_WARPGROUPS, "one (64, 64) product of dQ per warpgroup");
  static constexpr int STAGES = 2;
  using QLayout = WgmmaLayout<BLOCK_M, HEAD_DIM>;   // Q and dO: (BLOCK_M, HEAD_DIM)
  using KVLayout = WgmmaLayout<BLOCK_N, HEAD_DIM>;  // K and V: (BLOCK_N, HEAD_DIM)
  using DsLayout = WgmmaLayout<BLOCK_N, BLOCK_M>;   // dSᵀ: (BLOCK_N keys, BLOCK_M queries)
  // dQ's (64, 64) product per warpgroup is staged in shared memory, fp32 rows of 64 + 8 floats (the
  // 8 keep the fragment stores at two wavefronts), and added into global memory from there.
  static constexpr int DQ_PITCH = 64 + 8;
  static constexpr int DQ_STAGE_FLOATS = 64 * DQ_PITCH;  // one warpgroup's product
  // Shared memory: K, V, STAGES × [Q, dO], dSᵀ, bf16 in wgmma's swizzle (each tile a multiple of
  // 1024 bytes, so every one starts on a swizzle-atom boundary); then STAGES × [the Q tile's LSE
  // (exp2 units), D] and the dQ products, fp32; and 1 KiB to align the start.
  static constexpr int smem_bytes() {
    return kWgmmaAlignment + KVLayout::bytes(2 * BLOCK_N) + QLayout::bytes(STAGES * 2 * BLOCK_M) +
           DsLayout::bytes(BLOCK_N) + (STAGES * 2 * BLOCK_M + NUM_WARPGROUPS * DQ_STAGE_FLOATS) * int(sizeof(float));
  }
};

// 2. The main kernel: grid = (KV tiles, B·H_kv). DETERMINISTIC: every Q tile's dQ additions are
// made block by block in the order of the KV tiles, through that tile's turnstile.
template <int HEAD_DIM, typename Cfg, bool DETERMINISTIC>
__global__ void __launch_bounds__(Cfg::NUM_THREADS, 1)
    backward_kernel(const BackwardParams bp, const float* delta, const float* lse2, float* dq_accum, int* turnstiles,
                    const float scale_log2, const int64_t offset) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, NUM_THREADS = Cfg::NUM_THREADS;
  using QLayout = typename Cfg::QLayout;
  using KVLayout = typename Cfg::KVLayout;
  using DsLayout = typename Cfg::DsLayout;
  const AttentionParams& params = bp.fwd;
  extern __shared__ uint4 smem[];  // 16-byte aligned; wgmma's swizzle atoms need 1024 (below)
  const SmemTile<BLOCK_N, KVLayout> kv_tiles{aligned_for_wgmma(smem)};  // K, V: (BLOCK_N, HEAD_DIM) each
  constexpr int STAGES = Cfg::STAGES;
  const SmemTile<BLOCK_M, QLayout> qdo_tiles{kv_tiles.ptr + 2 * BLOCK_N * KVLayout::kRowElems};  // STAGES × [Q, dO]
  const SmemTile<BLOCK_N, DsLayout> dst_tile{qdo_tiles.ptr + STAGES * 2 * BLOCK_M * QLayout::kRowElems};  // dSᵀ
  float* const lse_d_tiles =
      reinterpret_cast<float*>(dst_tile.ptr + BLOCK_N * DsLayout::kRowElems);  // STAGES × [LSE, D]
  float* const dq_stages = lse_d_tiles + STAGES * 2 * BLOCK_M;                 // NUM_WARPGROUPS × (64, DQ_PITCH)

  // The warp index from lane 0: the same value, but one the compiler knows every lane holds, so
  // that what follows from it (the warpgroup's keys, their wgmma descriptors) is computed once per
  // warp in the uniform datapath instead of per thread.
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0), wg = warp / 4;
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);
  const bool causal = params.causal;  // key j visible to query i iff j <= i + offset

  // ---- pointers: this block's KV tile of (batch b, KV head h_kv).
  const int n_start = int(blockIdx.x) * BLOCK_N;
  const int64_t b = blockIdx.y / params.heads_kv, h_kv = blockIdx.y % params.heads_kv;
  const bf16* k_ptr = static_cast<const bf16*>(params.k) + b * params.k_stride.batch + h_kv * params.k_stride.head +
                      int64_t(n_start) * params.k_stride.seq;
  const bf16* v_ptr = static_cast<const bf16*>(params.v) + b * params.v_stride.batch + h_kv * params.v_stride.head +
                      int64_t(n_start) * params.v_stride.seq;
  // This warp's 16 keys of Sᵀ, dPᵀ, dK and dV: rows [key_row0, key_row0 + 16) of the block's keys,
  // inside its warpgroup's 64. Its warpgroup's product of dQ: column panel d_panel, over key split
  // key_split (D = 128: panel wg over all keys; D = 64: panel 0 over the warpgroup's own keys).
  const int wg_key0 = wg * Cfg::KEYS_PER_WARPGROUP, key_row0 = 16 * warp, key0 = n_start + key_row0;
  const int d_panel = wg / Cfg::KEY_SPLITS, key_split = wg % Cfg::KEY_SPLITS;

  // The Q tiles that see some key of this KV tile: causal, from the one holding the first query
  // that sees key n_start (query i sees it when i >= n_start − offset) to the last.
  const int m_tiles = (n_q + BLOCK_M - 1) / BLOCK_M;
  const int64_t turnstiles_per_head = (n_q + kBackwardTurnstileRows - 1) / kBackwardTurnstileRows;
  const int64_t first_query = causal ? n_start - offset : 0;
  const int m_first = first_query <= 0 ? 0 : int(first_query / BLOCK_M);

  // ---- load K and V once; they stay in shared memory for every Q tile.
  const int kv_rows = min(BLOCK_N, n_kv - n_start);
  load_tile_async<NUM_THREADS>(kv_tiles, k_ptr, params.k_stride.seq, kv_rows);
  load_tile_async<NUM_THREADS>(next_tile(kv_tiles, 1), v_ptr, params.v_stride.seq, kv_rows);
  cp_async_commit();

  // ---- init state: dK and dV of the warp's 16 keys × HEAD_DIM columns, fp32 wgmma accumulators.
  Acc<HEAD_DIM> dk = zeros<HEAD_DIM>(), dv = zeros<HEAD_DIM>();

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
    const SmemTile<BLOCK_M, QLayout> q_t = next_tile(qdo_tiles, 2 * (t % STAGES));
    const SmemTile<BLOCK_M, QLayout> do_t = next_tile(qdo_tiles, 2 * (t % STAGES) + 1);
    const bf16* q_head = static_cast<const bf16*>(params.q) + b * params.q_stride.batch + h * params.q_stride.head;
    const bf16* do_head = static_cast<const bf16*>(bp.d_o) + b * bp.do_stride.batch + h * bp.do_stride.head;
    load_tile_async<NUM_THREADS>(q_t, q_head + int64_t(m_start) * params.q_stride.seq, params.q_stride.seq,
                                 min(BLOCK_M, n_q - m_start));
    load_tile_async<NUM_THREADS>(do_t, do_head + int64_t(m_start) * bp.do_stride.seq, bp.do_stride.seq,
                                 min(BLOCK_M, n_q - m_start));
    const int64_t row0 = (b * params.heads_q + h) * n_q + m_start;
    float* const stage = lse_d_tiles + (t % STAGES) * 2 * BLOCK_M;
    // One float per thread, no loop: 2·BLOCK_M = 128 of the 256 threads copy one each.
    static_assert(2 * BLOCK_M <= NUM_THREADS, "the LSE and D rows: one float per thread, in one shot");
    if (const int i = int(threadIdx.x); i < 2 * BLOCK_M) {
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
    const SmemTile<BLOCK_M, QLayout> q_tile = next_tile(qdo_tiles, 2 * (t % STAGES));
    const SmemTile<BLOCK_M, QLayout> do_tile = next_tile(qdo_tiles, 2 * (t % STAGES) + 1);
    const float* const lse2_tile = lse_d_tiles + (t % STAGES) * 2 * BLOCK_M;
    const float* const delta_tile = lse2_tile + BLOCK_M;
    // K and V stay put; opaque() keeps their wgmma descriptors out of the registers between items.
    const SmemTile<BLOCK_N, KVLayout> k_tile = opaque(kv_tiles), v_tile = next_tile(k_tile, 1);
    cp_async_wait<0>();               // item t's copies (and, at t = 0, K and V) have landed ...
    ptx::fence_proxy_async_shared();  // ... visible to the tensor cores' reads
    __syncthreads();                  // ... for every thread; and item t − 1's wgmmas are all done
    // Item t + 1 starts flying into the other stage while item t computes.
    if (++k == m_tiles) k = m_first, ++hq;  // (hq, walk.tile(k)) is item t + 1 from here on
    if (t + 1 < items) load_item(t + 1, hq, walk.tile(k));
    cp_async_commit();

    // Sᵀ = K_w·Qᵀ and dPᵀ = V_w·dOᵀ: the warpgroup's 64 keys against every query of the Q tile,
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
    // this warpgroup computed 64 of the block's 128.
    store_tile_rows(dst_tile, ds, key_row0, 0);

    // dV += Pᵀ·dO and dK += dSᵀ·Q (times c at the end): Pᵀ and dSᵀ from the registers they were
    // computed in, the warp's FragA of its 16 keys, every query of the Q tile.
    FragA<BLOCK_M> p_frag = to_bf16(s), ds_frag = to_bf16(ds);
    wgmma_begin(dv, dk, p_frag, ds_frag);
    mma_pv_async(by_addition, dv, p_frag, do_tile);
    mma_pv_async(by_addition, dk, ds_frag, q_tile);
    ptx::wgmma_commit();
    ptx::fence_proxy_async_shared();  // the dSᵀ stores, read next by the tensor cores ...
    __syncthreads();                  // ... of both warpgroups: the whole tile is there

    // dQ = dS·K: this warpgroup's (64, 64) product: K's column panel d_panel, over the block's
    // BLOCK_N / KEY_SPLITS keys of split key_split (rows of dSᵀ and of K: a plain view, as both
    // tiles are one 64-column panel wide when they are split).
    constexpr int SPLIT_KEYS = BLOCK_N / Cfg::KEY_SPLITS;
    static_assert(Cfg::KEY_SPLITS == 1 || (BLOCK_M == 64 && HEAD_DIM == 64), "split keys: one-panel tiles");
    Acc<64> dq;
    wgmma_begin(dq);
    mma_at_b_async(
        by_addition, dq,
        SmemTile<SPLIT_KEYS, WgmmaLayout<SPLIT_KEYS, BLOCK_M>>{dst_tile.ptr + key_split * SPLIT_KEYS * BLOCK_M}, 0,
        SmemTile<SPLIT_KEYS, WgmmaLayout<SPLIT_KEYS, HEAD_DIM>>{k_tile.ptr + key_split * SPLIT_KEYS * HEAD_DIM},
        d_panel);
    ptx::wgmma_commit();
    wait_for<0>(dq, dv, dk, p_frag, ds_frag);  // every product of item t is done
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
    // The product goes to shared memory, then into dQ's accumulator with 16-byte atomics: from the
    // registers, the atomics' addresses and values took more registers than dK and dV leave. dQ's
    // accumulator rows are HEAD_DIM floats from the start of the workspace (16-byte aligned,
    // validated), a product's columns start at a multiple of 64: every chunk is 16-byte aligned.
    float* const dq_row0 = dq_accum + (bh * n_q + m_start) * HEAD_DIM;
    store_rows_f32(dq_stages + wg * Cfg::DQ_STAGE_FLOATS, Cfg::DQ_PITCH, dq, 16 * (warp % 4));
    if constexpr (Cfg::KEY_SPLITS == 1) {
      ptx::named_barrier_sync(1 + wg, 128);  // the warpgroup's product is whole (barrier 0 is __syncthreads')
      atomic_add_tile_x4<64, 64, 128>(dq_row0 + 64 * d_panel, HEAD_DIM, dq_stages + wg * Cfg::DQ_STAGE_FLOATS,
                                      Cfg::DQ_PITCH, scale_log2 / kLog2e, n_q - m_start,
                                      int(opaque_thread_index() % 128));  // addresses computed here
    } else {
      __syncthreads();  // both partial products are whole: the block adds their sum, once
      atomic_add_tile_x4<64, 64, NUM_THREADS, Cfg::KEY_SPLITS>(dq_row0, HEAD_DIM, dq_stages, Cfg::DQ_PITCH,
                                                               scale_log2 / kLog2e, n_q - m_start, int(threadIdx.x),
                                                               Cfg::DQ_STAGE_FLOATS);
    }
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
  // Shared memory first, before anything is written (182 KB at D = 128, 118 KB at D = 64).
  constexpr int smem = Cfg::smem_bytes();
  const auto kernel = bp.deterministic ? backward_kernel<HEAD_DIM, Cfg, true> : backward_kernel<HEAD_DIM, Cfg, false>;
  if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
  const BackwardWorkspace ws = backward_workspace(p);
  char* const base = static_cast<char*>(bp.workspace);
  float* dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  float* delta = reinterpret_cast<float*>(base + ws.delta);
  int* turnstiles = reinterpret_cast<int*>(base + ws.turnstiles);
  float* lse2 = reinterpret_cast<float*>(base + ws.lse2);
  if (bp.deterministic) FA_CUDA_RETURN(cudaMemsetAsync(turnstiles, 0, ws.turnstile_count * sizeof(int), stream));
  preprocess_kernel<HEAD_DIM><<<stream_grid(p), kStreamThreads, 0, stream>>>(bp, delta, lse2, dq_accum);
  FA_LAUNCH_RETURN();
  const dim3 grid(unsigned(cdiv(p.seqlen_kv, Cfg::BLOCK_N)), unsigned(p.batch * p.heads_kv));
  kernel<<<grid, Cfg::NUM_THREADS, smem, stream>>>(bp, delta, lse2, dq_accum, turnstiles, p.effective_scale() * kLog2e,
                                                   p.causal_offset());
  FA_LAUNCH_RETURN();
  convert_dq_kernel<HEAD_DIM><<<stream_grid(p), kStreamThreads, 0, stream>>>(bp, dq_accum);
  FA_LAUNCH_RETURN();
  return Status::Ok();
}

// The backward's grids: the main kernel's B·H_kv along y. The streaming kernels' B·H_q over y and z
// holds up to 65535², the bound validate() already puts on B·H_q (kCaps.max_batch_heads).
Status check_backward_grids(const AttentionParams& p) {
  if (p.batch * p.heads_kv > kMaxGridYZ)
    return Status::Unsupported("the backward's grid holds B·H_kv up to 65535 (got " +
                               std::to_string(p.batch * p.heads_kv) + ")");
  return Status::Ok();
}

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  if (Status st = check_device(kCaps); !st.ok()) return st;  // sm_90a code on a GPU that can run it
  return kTuner.run(p, stream);  // the cached config for this problem, tuned on its first call
}

Status backward(const BackwardParams& bp, cudaStream_t stream) {
  if (Status st = validate_backward(bp, kCaps); !st.ok()) return st;
  if (Status st = check_backward_grids(bp.fwd); !st.ok()) return st;
  if (Status st = check_device(kCaps); !st.ok()) return st;  // sm_90a code on a GPU that can run it
  if (bp.fwd.head_dim == 64) return launch_backward<64, BwdConfig<64>>(bp, stream);
  return launch_backward<128, BwdConfig<128>>(bp, stream);
}

FA_REGISTER_STEP({33, "backward_instruction_diet", /*base=*/25,
                  "the backward's main loop on an instruction diet: wgmma descriptors advanced by addition, the "
                  "warpgroup index warp-uniform, the LSE and D copied in one shot, sm_90a",
                  kCaps, &forward, "", &backward})

}  // namespace fa::step33
