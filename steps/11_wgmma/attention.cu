// Step 11 — wgmma: on Hopper, Q·Kᵀ and P·V are each issued by a warpgroup (four warps) as
// `wgmma.mma_async`, 64 query rows × a whole K/V tile per instruction, reading K and V straight
// from shared memory: no ldmatrix, and the tensor cores run at Hopper's full rate.
//
// What changed since step 10:
//  - Products: mma_qk_tiles / mma_pv_tiles (mma.sync, 32 rows per warp, ldmatrix fragments)
//    become mma_qk_async / mma_pv_async (device/warpgroup_tile.h): per warpgroup, D/16 wgmmas for
//    S = Q·Kᵀ with both operands in shared memory, and BLOCK_N/16 for O += P·V with P in registers.
//  - Each warp owns 16 rows again: a warpgroup's accumulator is, warp by warp, the Acc of its
//    16 rows, so the softmax (mask, lazy rescale, exp2, row sums, LSE, store) is step 10's.
//  - Ordering the asynchronous products: wgmma_begin before each (the registers it reads are
//    final), commit, then wait_for<0> before S or O is touched again.
//  - Shared memory in wgmma's 128-byte swizzle (WgmmaLayout: 64-column panels), tiles on
//    1024-byte boundaries; a proxy fence after the cp.async copies land, before wgmma reads them.
//  - Built for sm_90a only (step.cmake); refused with a clear message on any other GPU.
// What it buys, measured on an H200: README.md.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "device/mask.h"
#include "device/ptx/cp_async.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "device/warpgroup_tile.h"
#include "fa/registry.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/tuner.h"

namespace fa::step11 {
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
  static constexpr int WARPGROUP_ROWS = 64;  // a wgmma computes 64 rows: 16 per warp of the group
  static constexpr int ROWS_PER_WARP = 16;
  static constexpr int NUM_WARPS = BLOCK_M / ROWS_PER_WARP;
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static_assert(BLOCK_M % WARPGROUP_ROWS == 0, "whole warpgroups");
  static_assert(BLOCK_N == 64 || BLOCK_N == 128, "the wgmma shapes wrapped: N = 64, 128");
  // The state is rescaled only when a row's max rose by more than this, in exp2 units: until
  // then P = 2^(c·s − c·m_i) ≤ 2^8, which fp32 O and l, and bf16 P, hold without loss.
  static constexpr float RESCALE_THRESHOLD = 8.0f;
  // Shared memory: the Q tile, then STAGES × (K tile, V tile), all (rows, HEAD_DIM) bf16 in
  // wgmma's swizzle, plus 1 KiB to move the start up to a 1024-byte boundary.
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return kWgmmaAlignment + WgmmaLayout<BLOCK_M, HEAD_DIM>::bytes(BLOCK_M + STAGES * 2 * BLOCK_N);
  }
};

template <int HEAD_DIM, typename Cfg>
__global__ void __launch_bounds__(Cfg::NUM_THREADS)
    attention_kernel(const AttentionParams params, const float scale_log2, const int64_t offset) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, NUM_THREADS = Cfg::NUM_THREADS;
  constexpr int STAGES = Cfg::STAGES, ROWS_PER_WARP = Cfg::ROWS_PER_WARP;
  using QLayout = WgmmaLayout<BLOCK_M, HEAD_DIM>;
  using KVLayout = WgmmaLayout<BLOCK_N, HEAD_DIM>;
  extern __shared__ uint4 smem[];  // 16-byte aligned; wgmma's swizzle atoms need 1024 (below)
  const SmemTile<BLOCK_M, QLayout> q_tile{aligned_for_wgmma(smem)};                       // (BLOCK_M, HEAD_DIM)
  const SmemTile<BLOCK_N, KVLayout> kv_tiles{q_tile.ptr + BLOCK_M * QLayout::kRowElems};  // STAGES × [K, then V]

  const int warp = int(threadIdx.x) / 32;
  const int wg_row0 = Cfg::WARPGROUP_ROWS * (warp / 4);  // the first row of this warp's warpgroup
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
  // cp.async writes through the generic proxy and wgmma reads through the async proxy: after a
  // tile lands, each thread fences (fence_proxy_async_shared) before the barrier.
  auto load_kv = [&](int n_block) {
    const int n_start = n_block * BLOCK_N;
    const int kv_rows = min(BLOCK_N, n_kv - n_start);
    load_tile_async<NUM_THREADS>(k_tile_of(n_block), k_ptr + n_start * params.k_stride.seq, params.k_stride.seq,
                                 kv_rows);
    load_tile_async<NUM_THREADS>(v_tile_of(n_block), v_ptr + n_start * params.v_stride.seq, params.v_stride.seq,
                                 kv_rows);
  };

  // ---- load Q: one cp.async group for Q, then the first STAGES-1 K/V tiles start flying too;
  // Q stays in shared memory, where each warpgroup's wgmmas read its 64 rows from.
  load_tile_async<NUM_THREADS>(q_tile, q_ptr, params.q_stride.seq, min(BLOCK_M, n_q - m_start));
  cp_async_commit();
  for (int stage = 0; stage < STAGES - 1; ++stage) {
    if (stage < n_blocks) load_kv(stage);
    cp_async_commit();  // an empty group is fine: it keeps the group count the same everywhere
  }
  cp_async_wait<STAGES - 1>();      // the oldest group, Q, has landed (K/V may still be in flight)
  ptx::fence_proxy_async_shared();  // ... visible to the tensor cores' reads
  __syncthreads();                  // ... for every thread's copies

  // ---- init state: each lane holds rows g and g + 8 of the warp's 16 rows (device/warp_tile.h),
  // also where the warpgroup's wgmma puts them.
  Acc<HEAD_DIM> o_i = zeros<HEAD_DIM>();  // (16, HEAD_DIM) fp32, unnormalised output
  Rows m_i = rows(-INFINITY);             // running row max, in raw score units (fp32)
  Rows l_i = rows(0.0f);                  // running row sum over THIS lane's columns (fp32);
                                          // the 4 lanes of a row are summed once, at the end

  // ---- KV loop
  for (int n_block = 0; n_block < n_blocks; ++n_block) {
    const int n_start = n_block * BLOCK_N;
    cp_async_wait<STAGES - 2>();      // tile n_block has landed (this thread's copies)
    ptx::fence_proxy_async_shared();  // ... for the tensor cores
    __syncthreads();                  // everyone's copies; and every warpgroup's wgmmas on tile n_block-1 are done
    if (n_block + STAGES - 1 < n_blocks) load_kv(n_block + STAGES - 1);  // into the slot just freed
    cp_async_commit();
    const SmemTile<BLOCK_N, KVLayout> k_tile = k_tile_of(n_block), v_tile = v_tile_of(n_block);

    // S = Q·Kᵀ for the warpgroup's 64 rows: issued by all four warps together, asynchronous.
    Acc<BLOCK_N> s;
    wgmma_begin(s);
    mma_qk_async(s, q_tile, wg_row0, k_tile);
    ptx::wgmma_commit();
    wait_for<0>(s);  // S is in the registers: each warp now holds its own 16 rows of it

    // The mask, on the tiles that need it only: straddling the diagonal, or holding keys past
    // N_kv. Masked scores become -inf BEFORE the row max, so the max is over visible keys only.
    if (n_block >= first_masked) apply_mask(s, row0, n_start, CausalMask{n_kv, causal, offset});

    // Online softmax, rescaled lazily (step 10): only when some row of the warp moved its max by
    // more than the threshold does the warp move every row's state to its new max.
    const Rows m_new = row_max(s, m_i);
    if (any_max_moved(m_i, m_new, scale_log2, Cfg::RESCALE_THRESHOLD)) {
      const Rows alpha = rescale_factor(m_i, scale_log2, exp2_offset(m_new, scale_log2));  // 0 on the first
      rescale(o_i, alpha);
      l_i = l_i * alpha;
      m_i = m_new;
    }
    // P against the max the state is kept at (c·m_i, 0 while m_i = -inf): ≤ 2^threshold.
    const Acc<BLOCK_N> p_t = exp2_rows(s, scale_log2, exp2_offset(m_i, scale_log2));
    FragA<BLOCK_N> p = to_bf16(p_t);  // P in bf16: the A operand of P·V, straight from registers
    l_i = l_i + row_sum(p_t);

    // O += P·V: the rescaled O and the new P are final before the tensor cores read them.
    wgmma_begin(o_i, p);
    mma_pv_async(o_i, p, v_tile);
    ptx::wgmma_commit();
    wait_for<0>(o_i);  // O is back, and v_tile is free for the copy the next barrier lets in
  }

  const int tile_row0 = warp * ROWS_PER_WARP;  // the warp's first row in the block
  // ---- normalise: finish the row sums across the quad, then one divide per row (deferred).
  const Rows l = quad_sum(l_i);

  // ---- store: bf16 pairs straight from the accumulators; rows past N_q are not written.
  store_rows(o_ptr, params.o_stride.seq, o_i, safe_inverse(l), tile_row0, n_q - m_start);
  // LSE = scale·m + ln(l), -inf for a row that saw no key; one lane per row writes it.
  if (params.lse != nullptr) {
    float* lse_ptr = params.lse + (b * params.heads_q + h) * int64_t(n_q) + m_start;  // (B, H_q, N_q) fp32
    store_row_values(lse_ptr, log_sum_exp(m_i, l, scale_log2), tile_row0, n_q - m_start);
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

// Per head dim in order of preference (the heuristic's tie-break). Two warpgroups (BLOCK_M = 128)
// in every entry: three would not split the cp.async copies evenly (device/smem_tile.h). Every
// entry is compiled (for sm_90a alone), so each one added costs CI minutes: add one only if some
// shape measurably wins with it.
const tuner::Tuner kTuner(11, FA_BUILD_ID,
                          {
                              config<64, Config<128, 128, 2>>(),   // one wgmma n128 per 16 dims of Q·Kᵀ
                              config<64, Config<128, 64, 3>>(),    // half the score registers, 3 tiles in flight
                              config<64, Config<128, 64, 2>>(),    // ... double-buffered
                              config<128, Config<128, 128, 2>>(),  // the largest tile: 160 KiB of shared memory
                              config<128, Config<128, 64, 2>>(),   // half the score registers
                              config<128, Config<128, 64, 3>>(),   // three K/V tiles in flight
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
  c.only_sm = 90;                          // wgmma: sm_90a code, compute capability 9.0 only
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  if (Status st = check_device(kCaps); !st.ok()) return st;  // sm_90a code on a GPU that can run it
  return kTuner.run(p, stream);  // the cached config for this problem, tuned on its first call
}

FA_REGISTER_STEP({11, "wgmma", /*base=*/10,
                  "Hopper's warpgroup MMA: Q·Kᵀ and P·V as wgmma from shared memory (P from registers), sm_90a", kCaps,
                  &forward, ""})

}  // namespace fa::step11
