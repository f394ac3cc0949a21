// Step 38 — a sliding window: step 10's kernel, whose Q tile visited the K/V tiles [0, end) and
// masked only the last ones (the causal diagonal, the ragged tile past N_kv), takes flash-attn's
// window_size = (left, right): query i sees key j only when i + offset − left <= j <= i + offset +
// right (device/mask.h, key_visible). A Q tile's keys are then a band, and so are its tiles:
//   the span     kv_tile_span (device/tiles.h): tiles [begin, end) hold a key some row sees; the
//                loop starts at begin, not 0, and the tiles before it are never loaded. The work
//                grows with the window, not with N_kv.
//   the mask     at both ends of the span: [begin, first_full) holds keys left of some row's window,
//                [end_full, end) keys right of it (or past the diagonal, or past N_kv); the tiles
//                between run without mask code. The element test is WindowMask (the causal flag and
//                the window in two compares).
// The causal flag is the window (left, 0) with left unbounded; both may be given, and both apply.
// Step 10's description of what it changed from step 09, unchanged:
//
// Step 10 — lazy rescaling: the running max moves, and O and l are rescaled, only when some row's
// max rose by more than a threshold; otherwise the warp keeps its old max and skips the rescale.
//
// What changed since step 09:
//  - any_max_moved (device/warp_tile.h): one warp vote per row tile and KV tile. When no row's
//    max rose by more than RESCALE_THRESHOLD = 8 (in exp2 units), O, l and m are left alone and
//    P = 2^(c·s − c·m_i) is computed against the old max: it is then at most 2^8 = 256.
//  - Otherwise the state is rescaled exactly as in step 09 (every row to its own new max).
// Why it is exact: O and l carry the same factor 2^(c·m_i) whichever max is used, so O / l and
// LSE = c·m_i + ln l do not depend on it; the threshold only bounds how large P can grow.
// What it saves: the rescale (one FMUL per O element: 64 per thread and row tile at D = 128),
// the two MUFU.EX2 of alpha and the FMULs of l, on almost every KV tile after a row's first.
// What it buys, measured on an H200 (README.md): see the lesson's table.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "device/mask.h"
#include "device/ptx/cp_async.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "fa/registry.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/tuner.h"

namespace fa::step38 {
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
  // The band of K/V tiles the Q tile's rows see, masked at both ends (device/tiles.h).
  const KvTileSpan span =
      kv_tile_span(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset, params.window_left, params.window_right);

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
    if (span.begin + stage < span.end) load_kv(span.begin + stage);
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
  for (int n_block = span.begin; n_block < span.end; ++n_block) {
    const int n_start = n_block * BLOCK_N;
    cp_async_wait<STAGES - 2>();  // tile n_block has landed (this thread's copies)
    __syncthreads();              // everyone's copies; and every warp is done reading tile n_block-1
    if (n_block + STAGES - 1 < span.end) load_kv(n_block + STAGES - 1);  // into the slot just freed
    cp_async_commit();
    const SmemTile<BLOCK_N, Layout> k_tile = k_tile_of(n_block), v_tile = v_tile_of(n_block);

    Acc<BLOCK_N> s[M_TILES];
    mma_qk_tiles(s, q_tile, warp * ROWS_PER_WARP, k_tile);  // S_t = Q_t·Kᵀ, each K fragment loaded once

    FragA<BLOCK_N> p[M_TILES];  // P_t in bf16, the A operand of P·V
#pragma unroll
    for (int t = 0; t < M_TILES; ++t) {
      // The mask, on the tiles at the span's two ends only: left of some row's window, or right of
      // it (the window's right edge, the diagonal, keys past N_kv). Masked scores become -inf
      // BEFORE the row max, so the max is over visible keys only.
      if (n_block < span.first_full || n_block >= span.end_full)
        apply_mask(s[t], row0 + 16 * t, n_start,
                   WindowMask{n_kv, causal, offset, params.window_left, params.window_right});

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
const tuner::Tuner kTuner(38, FA_BUILD_ID,
                          {
                              // (step 10's <128, 128, 2> at D = 64 is left out: with the span's one more bound
                              // live across the loop it spills 8 bytes, and the other three cover D = 64)
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
  c.sliding_window = true;                 // window_left, window_right: the span and the mask at both ends
  c.max_seqlen = kTileMaxSeqlen;           // 32-bit row indices
  c.max_batch_heads = kTileMaxBatchHeads;  // B·H_q over the grid's y and z
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  return kTuner.run(p, stream);  // the cached config for this problem, tuned on its first call
}

FA_REGISTER_STEP({38, "sliding_window", /*base=*/10,
                  "a sliding window (flash-attn's window_size): the K/V tiles a Q tile visits are a band, loaded from "
                  "its first tile on and masked at both ends",
                  kCaps, &forward, ""})

}  // namespace fa::step38
