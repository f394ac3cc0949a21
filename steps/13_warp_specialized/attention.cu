// Step 13 — warp specialisation: one warpgroup only loads (its one working thread issues the TMA
// copies), the others only compute, and they hand the ring's slots back and forth on two
// mbarriers per slot, "full" and "empty". setmaxnreg moves the registers the producer does not
// need to the consumers.
//
// What changed since step 12:
//  - Roles: warpgroup 0 is the producer, warpgroups 1 .. CONSUMERS the consumers (64 query rows
//    each). The role is one branch of the kernel; each begins with setmaxnreg (dealloc to 24 for
//    the producer, alloc for the consumers), so that the consumers of a 1-block-per-SM kernel get
//    more than 65536 / threads registers each.
//  - "Slot free": the __syncthreads of every iteration becomes an "empty" mbarrier per slot: each
//    consumer warp arrives on it once its P·V of the tile has completed, and the producer waits
//    for the previous use's phase before it refills the slot. No barrier is block-wide any more:
//    the producer runs STAGES tiles ahead, and each consumer warpgroup goes at its own pace.
//  - Larger blocks: BLOCK_M = 256 (4 consumers) shares every K/V tile among twice the rows.
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

namespace fa::step13 {
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
  static constexpr int CONSUMERS = BLOCK_M / WARPGROUP_ROWS;  // consumer warpgroups
  static constexpr int NUM_WARPS = 4 * (1 + CONSUMERS);       // the producer warpgroup first
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static_assert(BLOCK_M % WARPGROUP_ROWS == 0, "whole warpgroups");
  // Registers per thread after setmaxnreg. The block starts with the cap __launch_bounds__ gives
  // (65536 / threads, down to a multiple of 8) on every thread: that is its whole pool. The
  // producer gives most of its share back; the consumers take what that frees, at most 240. A
  // consumer asking for more than the pool holds waits in setmaxnreg forever (a hang).
  static constexpr int ENTRY_REGS = 65536 / NUM_THREADS / 8 * 8;
  static constexpr int PRODUCER_REGS = 24;
  static constexpr int CONSUMER_REGS_FIT = (NUM_THREADS * ENTRY_REGS - 128 * PRODUCER_REGS) / (128 * CONSUMERS) / 8 * 8;
  static constexpr int CONSUMER_REGS = CONSUMER_REGS_FIT < 240 ? CONSUMER_REGS_FIT : 240;
  static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= NUM_THREADS * ENTRY_REGS,
                "the consumers would ask setmaxnreg for more registers than the block holds");
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

// __launch_bounds__(threads, 1): the register cap at entry that setmaxnreg needs.
template <int HEAD_DIM, typename Cfg>
__global__ void __launch_bounds__(Cfg::NUM_THREADS, 1)
    attention_kernel(const AttentionParams params, const float scale_log2, const int64_t offset,
                     const __grid_constant__ QkvTileMaps maps) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N;
  constexpr int STAGES = Cfg::STAGES, ROWS_PER_WARP = Cfg::ROWS_PER_WARP;
  using QLayout = WgmmaLayout<BLOCK_M, HEAD_DIM>;
  using KVLayout = WgmmaLayout<BLOCK_N, HEAD_DIM>;
  extern __shared__ uint4 smem[];  // 16-byte aligned; wgmma's swizzle atoms need 1024 (below)
  const SmemTile<BLOCK_M, QLayout> q_tile{aligned_for_wgmma(smem)};                       // (BLOCK_M, HEAD_DIM)
  const SmemTile<BLOCK_N, KVLayout> kv_tiles{q_tile.ptr + BLOCK_M * QLayout::kRowElems};  // STAGES × [K, then V]
  // Per ring slot: "full" (its K and V have landed: the producer's arrival and the bytes) and
  // "empty" (every consumer warp is done with it: 4 · CONSUMERS arrivals); and "full" for Q.
  __shared__ uint64_t q_full, kv_full[STAGES], kv_empty[STAGES];
  auto bar = [](uint64_t& b) { return uint32_t(__cvta_generic_to_shared(&b)); };

  const int warp = int(threadIdx.x) / 32;
  const int warpgroup = warp / 4;                             // 0: the producer; 1 .. CONSUMERS: the consumers
  const int wg_row0 = Cfg::WARPGROUP_ROWS * (warpgroup - 1);  // a consumer's first row in the block
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
  const int row0 = m_start + (warp - 4) * ROWS_PER_WARP;  // a consumer warp's first query row
  const bool causal = params.causal;                      // key j visible to row i iff j <= i + offset
  const int n_blocks = kv_tile_end(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);  // stop at the diagonal
  const int first_masked = kv_tile_first_masked(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);

  // The K and V tiles of KV tile n_block: ring slot n_block % STAGES, K first.
  auto k_tile_of = [&](int n_block) { return next_tile(kv_tiles, 2 * (n_block % STAGES)); };
  auto v_tile_of = [&](int n_block) { return next_tile(kv_tiles, 2 * (n_block % STAGES) + 1); };
  // The producer's one thread: once the slot's previous use is released, announces its bytes and
  // issues the copies of KV tile n_block (rows past N_kv are outside the map: zeros).
  auto load_kv = [&](int n_block) {
    const int slot = n_block % STAGES, use = n_block / STAGES;
    if (use > 0) mbarrier_wait(bar(kv_empty[slot]), (use - 1) % 2);  // use - 1 is released
    ptx::mbarrier_arrive_expect_tx(bar(kv_full[slot]), 2 * BLOCK_N * HEAD_DIM * 2);
    load_tile_tma(k_tile_of(n_block), &maps.k, n_block * BLOCK_N, int(h_kv), int(b), bar(kv_full[slot]));
    load_tile_tma(v_tile_of(n_block), &maps.v, n_block * BLOCK_N, int(h_kv), int(b), bar(kv_full[slot]));
  };

  // Barriers: initialised by one thread, made visible to the copy engine, seen by the block.
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(bar(q_full), 1);
    for (int stage = 0; stage < STAGES; ++stage) {
      ptx::mbarrier_init(bar(kv_full[stage]), 1);
      ptx::mbarrier_init(bar(kv_empty[stage]), 4 * Cfg::CONSUMERS);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on, the roles meet only on mbarriers

  // ---- the producer: Q, then every K/V tile, each as soon as its slot is free.
  if (warpgroup == 0) {
    ptx::warpgroup_reg_dealloc<Cfg::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      ptx::mbarrier_arrive_expect_tx(bar(q_full), BLOCK_M * HEAD_DIM * 2);
      load_tile_tma(q_tile, &maps.q, m_start, int(h), int(b), bar(q_full));
      for (int n_block = 0; n_block < n_blocks; ++n_block) load_kv(n_block);
    }
    return;
  }

  // ---- the consumers
  ptx::warpgroup_reg_alloc<Cfg::CONSUMER_REGS>();
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
    wait_for<0>(o_i);  // O is back, and this warp is done with the slot: release it
    if (lane_id() == 0) ptx::mbarrier_arrive(bar(kv_empty[n_block % STAGES]));
  }

  const int tile_row0 = (warp - 4) * ROWS_PER_WARP;  // the warp's first row in the block
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

// Per head dim in order of preference (the heuristic's tie-break). Four consumers (BLOCK_M = 256)
// get 112 registers each, three 160, two 240 (D = 128 with four consumers spills at 112). Every entry is compiled (for
// sm_90a alone), so each one added costs CI minutes: add one only if some shape measurably wins with it.
const tuner::Tuner kTuner(13, FA_BUILD_ID,
                          {
                              config<64, Config<256, 64, 4>>(),    // 4 consumers, 4 tiles in flight
                              config<64, Config<192, 128, 3>>(),   // 3 consumers, 128-key tiles
                              config<64, Config<128, 128, 3>>(),   // 2 consumers, 128-key tiles
                              config<128, Config<192, 64, 4>>(),   // 3 consumers at 160 registers
                              config<128, Config<192, 128, 2>>(),  // ... with 128-key tiles
                              config<128, Config<128, 128, 2>>(),  // 2 consumers at 240 registers
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

FA_REGISTER_STEP({13, "warp_specialized", /*base=*/12,
                  "a producer warpgroup loads, consumer warpgroups compute; full/empty mbarriers; setmaxnreg", kCaps,
                  &forward, ""})

}  // namespace fa::step13
