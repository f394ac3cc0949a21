// Step 12 — the copy engine: Q, K and V tiles come by TMA (`cp.async.bulk.tensor`), one thread
// issuing a whole tile per instruction, and each ring slot says "full" through an mbarrier that
// counts the bytes landed.
//
// What changed since step 11:
//  - Loads: load_tile_async (cp.async by all 256 threads, 16 bytes each, rows past N masked by
//    hand) becomes load_tile_tma (device/smem_tile.h): thread 0 issues one copy per 64-column
//    panel; the tensor map (library/tma.h, built by the launcher, passed as __grid_constant__)
//    knows the strides, applies wgmma's 128-byte swizzle and fills rows past N with zeros.
//  - "Tile j has landed": cp_async_wait + fence.proxy.async + __syncthreads becomes a wait on the
//    slot's mbarrier with the parity of its use (j / STAGES) % 2. TMA writes through the async
//    proxy, the one wgmma reads through: no proxy fence.
//  - "Slot free": still the __syncthreads at the top of each iteration (every warpgroup waited for
//    its P·V of the tile before); thread 0 refills the slot just after it.
// What it buys, measured on an H200: README.md.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "device/mask.h"
#include "device/ptx/mbarrier.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "device/warpgroup_tile.h"
#include "fa/registry.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/tma.h"
#include "library/tuner.h"

namespace fa::step12 {
namespace {

using namespace fa::tile;
using fa::ptx::mbarrier_wait;

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
    attention_kernel(const AttentionParams params, const float scale_log2, const int64_t offset,
                     const __grid_constant__ QkvTileMaps maps) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N;
  constexpr int STAGES = Cfg::STAGES, ROWS_PER_WARP = Cfg::ROWS_PER_WARP;
  using QLayout = WgmmaLayout<BLOCK_M, HEAD_DIM>;
  using KVLayout = WgmmaLayout<BLOCK_N, HEAD_DIM>;
  extern __shared__ uint4 smem[];  // 16-byte aligned; wgmma's swizzle atoms need 1024 (below)
  const SmemTile<BLOCK_M, QLayout> q_tile{aligned_for_wgmma(smem)};                       // (BLOCK_M, HEAD_DIM)
  const SmemTile<BLOCK_N, KVLayout> kv_tiles{q_tile.ptr + BLOCK_M * QLayout::kRowElems};  // STAGES × [K, then V]
  // One mbarrier per ring slot ("its K and V have landed") and one for Q: 64-bit words in shared
  // memory, each completing one phase per use when its expected bytes have arrived.
  __shared__ uint64_t q_full, kv_full[STAGES];
  auto bar = [](uint64_t& b) { return uint32_t(__cvta_generic_to_shared(&b)); };

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
  // Q, K and V are addressed through the tensor maps: coordinates (column, row, head, batch).
  bf16* o_ptr = static_cast<bf16*>(params.o) + b * params.o_stride.batch + h * params.o_stride.head +
                int64_t(m_start) * params.o_stride.seq;
  const int row0 = m_start + warp * ROWS_PER_WARP;  // this warp's first query row
  const bool causal = params.causal;                // key j visible to row i iff j <= i + offset
  const int n_blocks = kv_tile_end(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);  // stop at the diagonal
  const int first_masked = kv_tile_first_masked(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);

  // The K and V tiles of KV tile n_block: ring slot n_block % STAGES, K first.
  auto k_tile_of = [&](int n_block) { return next_tile(kv_tiles, 2 * (n_block % STAGES)); };
  auto v_tile_of = [&](int n_block) { return next_tile(kv_tiles, 2 * (n_block % STAGES) + 1); };
  // Thread 0 only: announces the slot's bytes, then issues the copies of KV tile n_block (rows past
  // N_kv are outside the tensor map and arrive as zeros).
  auto load_kv = [&](int n_block) {
    uint64_t& full = kv_full[n_block % STAGES];
    ptx::mbarrier_arrive_expect_tx(bar(full), 2 * BLOCK_N * HEAD_DIM * 2);
    load_tile_tma(k_tile_of(n_block), &maps.k, n_block * BLOCK_N, int(h_kv), int(b), bar(full));
    load_tile_tma(v_tile_of(n_block), &maps.v, n_block * BLOCK_N, int(h_kv), int(b), bar(full));
  };

  // ---- load Q: thread 0 initialises the barriers (one arrival each: its own arrive_expect_tx),
  // makes them visible to the copy engine, and once the block has seen them, issues Q and the
  // first STAGES-1 K/V tiles. Q stays in shared memory, where each warpgroup's wgmmas read it.
  const bool producer = threadIdx.x == 0;
  if (producer) {
    ptx::mbarrier_init(bar(q_full), 1);
    for (int stage = 0; stage < STAGES; ++stage) ptx::mbarrier_init(bar(kv_full[stage]), 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
  if (producer) {
    ptx::mbarrier_arrive_expect_tx(bar(q_full), BLOCK_M * HEAD_DIM * 2);
    load_tile_tma(q_tile, &maps.q, m_start, int(h), int(b), bar(q_full));
    for (int stage = 0; stage < STAGES - 1; ++stage)
      if (stage < n_blocks) load_kv(stage);
  }
  mbarrier_wait(bar(q_full), 0);  // Q has landed (its barrier's first phase: parity 0)

  // ---- init state: each lane holds rows g and g + 8 of the warp's 16 rows (device/warp_tile.h),
  // also where the warpgroup's wgmma puts them.
  Acc<HEAD_DIM> o_i = zeros<HEAD_DIM>();  // (16, HEAD_DIM) fp32, unnormalised output
  Rows m_i = rows(-INFINITY);             // running row max, in raw score units (fp32)
  Rows l_i = rows(0.0f);                  // running row sum over THIS lane's columns (fp32);
                                          // the 4 lanes of a row are summed once, at the end

  // ---- KV loop
  for (int n_block = 0; n_block < n_blocks; ++n_block) {
    const int n_start = n_block * BLOCK_N;
    __syncthreads();  // every warpgroup's wgmmas on tile n_block-1 are done: its slot is free
    if (producer && n_block + STAGES - 1 < n_blocks) load_kv(n_block + STAGES - 1);  // into that slot
    // Tile n_block has landed: its slot's barrier completed phase n_block / STAGES (its use count).
    mbarrier_wait(bar(kv_full[n_block % STAGES]), (n_block / STAGES) % 2);
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
  // The tensor maps, by value: boxes of one tile's rows, one 64-column panel wide.
  QkvTileMaps maps;  // Q in boxes of BLOCK_M rows, K and V of BLOCK_N (library/tma.h)
  if (Status st = make_qkv_tile_maps(&maps, p, Cfg::BLOCK_M, Cfg::BLOCK_N); !st.ok()) return st;
  const int64_t bh = p.batch * p.heads_q;  // y holds up to 65535 (batch, head) pairs, z the rest
  const dim3 grid(unsigned(cdiv(p.seqlen_q, Cfg::BLOCK_M)), unsigned(std::min<int64_t>(bh, 65535)),
                  unsigned(cdiv(bh, 65535)));
  attention_kernel<HEAD_DIM, Cfg><<<grid, Cfg::NUM_THREADS, smem, stream>>>(p, scale_log2, p.causal_offset(), maps);
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

// Per head dim in order of preference (the heuristic's tie-break): step 11's. Every entry is
// compiled (for sm_90a alone), so each one added costs CI minutes: add one only if some shape
// measurably wins with it.
const tuner::Tuner kTuner(12, FA_BUILD_ID,
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
  c.broadcast = false;                     // TMA maps step every dimension: no zero strides
  c.tma = true;                            // ... 32-bit coordinates, 40-bit byte strides
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  if (Status st = check_device(kCaps); !st.ok()) return st;  // sm_90a code on a GPU that can run it
  return kTuner.run(p, stream);  // the cached config for this problem, tuned on its first call
}

FA_REGISTER_STEP({12, "tma_pipeline", /*base=*/11,
                  "Q, K and V tiles by the copy engine (TMA), one thread per tile; mbarriers count the bytes landed",
                  kCaps, &forward, ""})

}  // namespace fa::step12
