// The production backward on Hopper (sm_90a), generalised from step 24, put on step 33's
// instruction diet (wgmma descriptors advanced by addition, the warp index warp-uniform, the dSᵀ
// stores' addresses not hoisted) and warp-specialised as step 34: a producer warp loads K and V
// once and each work item's Q and dO through TMA and its LSE and D rows by its lanes, behind
// full/empty mbarriers; two consumer warpgroups of 64 keys each compute the five products as
// wgmma, Pᵀ and dSᵀ from registers into dV and dK, dQ = dS·K from dSᵀ in shared memory (two tiles)
// read transposed. dQ is staged in shared memory and added by the copy engine, its bulk reduces
// issued by a warp of their own (step 36); at D = 64 the Q tiles have 128 queries, each consumer's
// dQ its own 64 queries over all 128 keys (step 37). The deterministic mode's turnstiles, with the
// Q tiles walked down, are taken by that warp. Not a lesson: the steps never include it. The Hopper
// production kernel (kernels/fwd_hopper.cu) registers it as its backward. What the lesson
// hard-wired is a policy:
//
//   Mask      which Q tiles see a KV tile, and the element test the backward re-applies
//             (kernels/mask.h): by default the call's causal flag, either alignment, as the steps.
//
// With the default policy it computes what step 37 computes with step 37's instructions
// (static.kernels.bwd_hopper.same_as_step37 compares the counts). The preprocess and the convert
// are kernels/backward.h's, shared with the mma.sync backward.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "device/backward_tile.h"
#include "device/mask.h"
#include "device/ptx/mbarrier.h"
#include "device/ptx/sync.h"
#include "device/q_tile_walk.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "device/warpgroup_tile.h"
#include "fa/registry.h"
#include "kernels/backward.h"
#include "kernels/kernels.h"
#include "kernels/launch.h"
#include "kernels/mask.h"
#include "kernels/score_mod.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/tma.h"

namespace fa::kernels::bwd_hopper {
namespace {

using namespace fa::tile;
using fa::ptx::mbarrier_wait;

// One backward configuration: BLOCK_M queries per Q tile (64 at D = 128, 128 at D = 64), BLOCK_N =
// 128 keys per block; a producer warpgroup (its first warp loads, its second hands dQ to the copy
// engine, the other two leave) and two consumer warpgroups of four warps. Consumer w owns keys
// [64w, 64w + 64): its Sᵀ, dPᵀ (64, BLOCK_M) and its dK, dV (64, HEAD_DIM) are wgmma accumulators,
// each warp holding 16 keys' rows of them. dQ = dS·K (BLOCK_M, HEAD_DIM) is one (64, 64) product
// per consumer over all 128 keys: at D = 128 each takes one of K's two 64-column panels; at D = 64
// each takes one of the Q tile's two 64-query panels. Part VI: D = 96 runs as D = 128 and D = 32
// as D = 64, the tiles' last panel half used (device/smem_tile.h's WgmmaLayout: the copy engine
// fills the columns past the head dim with zeros); dK, dV and the staged dQ hold whole panels, of
// which the head dim's columns are stored and added.
template <int HEAD_DIM>
struct BwdConfig {
  static constexpr int BLOCK_M = HEAD_DIM <= 64 ? 128 : 64;  // D = 32: D = 64's tiles
  static constexpr int BLOCK_N = 128;
  static constexpr int CONSUMERS = 2;                    // consumer warpgroups
  static constexpr int NUM_WARPS = 4 * (1 + CONSUMERS);  // the producer warpgroup first
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static constexpr int CONSUMER_THREADS = 128 * CONSUMERS;
  static constexpr int KEYS_PER_WARPGROUP = BLOCK_N / CONSUMERS;            // 64: one wgmma's M
  static constexpr int D_PANELS = WgmmaLayout<BLOCK_N, HEAD_DIM>::kPanels;  // dQ's 64-column blocks
  static constexpr int Q_PANELS = BLOCK_M / 64;                             // dQ's 64-row blocks
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
  // each consumer writing its (64, 64) product into two of them, and added into global memory from
  // there by a bulk reduce. DQ_STAGES items: two at D = 128 (the consumers stage item t while the
  // copy engine reads item t − 1's), one at D = 64 (a second does not fit beside the 128-query tiles).
  static constexpr int DQ_STAGE_FLOATS = BLOCK_M * 64 * D_PANELS;  // one item's dQ (whole panels)
  static constexpr int DQ_STAGES = HEAD_DIM <= 64 ? 1 : 2;
  // Shared memory: K, V, STAGES × [Q, dO], two dSᵀ tiles, T (16 bits) in wgmma's swizzle (each tile a
  // multiple of 1024 bytes, so every one starts on a swizzle-atom boundary); the dQ stages, fp32 in
  // TMA's swizzle (1024-byte aligned too); then STAGES × [the Q tile's LSE (exp2 units), D]; and
  // 1 KiB to align the start. 226 KB at D = 128, 195 KB at D = 64, of the 227 a block may have.
  static constexpr int smem_bytes() {
    return kWgmmaAlignment + KVLayout::bytes(2 * BLOCK_N) + QLayout::bytes(STAGES * 2 * BLOCK_M) +
           DsLayout::bytes(2 * BLOCK_N) + (DQ_STAGES * DQ_STAGE_FLOATS + STAGES * 2 * BLOCK_M) * int(sizeof(float));
  }
};

// The tensor maps of the backward: K and V in boxes of BLOCK_N rows, Q and dO of BLOCK_M (loads);
// dQ's fp32 accumulator, (B·H_q, N_q, HEAD_DIM) in (BLOCK_M, 32) boxes (the dQ warp's reduces).
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
  int first_kv_tile;  // the first KV tile that sees the Q tile, where its turn starts (0 but under a window)
};

// The named barrier of the consumers together (0 is __syncthreads', which no role may use once the
// roles have split).
constexpr int kConsumersBarrier = 1;

// 2. The main kernel: grid = (KV tiles, B·H_kv). DETERMINISTIC: every Q tile's dQ additions are
// made block by block in the order of the KV tiles, through that tile's turnstile.
// __launch_bounds__(threads, 1): the register cap at entry that setmaxnreg needs. T: the element type
// of Q, K, V, O, dO and the gradients, bf16 or fp16 (the shared tiles' type, from which the wgmmas
// take their .bf16 or .f16 form; Pᵀ's and dSᵀ's rounding; the maps name it).
template <int HEAD_DIM, typename Cfg, bool DETERMINISTIC, typename MaskT = CausalFlag, typename ScoreMod = Identity,
          typename T = bf16>
__global__ void __launch_bounds__(Cfg::NUM_THREADS, 1)
    backward_kernel(const BackwardParams bp, const float* delta, const float* lse2, int* turnstiles,
                    const float scale_log2, const int64_t offset, const __grid_constant__ BwdTileMaps maps,
                    const ScoreModArgs mods) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, CONSUMER_THREADS = Cfg::CONSUMER_THREADS;
  using QLayout = typename Cfg::QLayout;
  using KVLayout = typename Cfg::KVLayout;
  using DsLayout = typename Cfg::DsLayout;
  constexpr int DQ_STAGES = Cfg::DQ_STAGES;
  const AttentionParams& params = bp.fwd;
  extern __shared__ uint4 smem[];  // 16-byte aligned; wgmma's swizzle atoms need 1024 (below)
  const SmemTile<BLOCK_N, KVLayout, T> kv_tiles{aligned_for_wgmma<T>(smem)};  // K, V: (BLOCK_N, HEAD_DIM) each
  constexpr int STAGES = Cfg::STAGES;
  const SmemTile<BLOCK_M, QLayout, T> qdo_tiles{kv_tiles.ptr + 2 * BLOCK_N * KVLayout::kRowElems};  // STAGES × [Q, dO]
  const SmemTile<BLOCK_N, DsLayout, T> dst_tiles{qdo_tiles.ptr + STAGES * 2 * BLOCK_M * QLayout::kRowElems};  // 2 × dSᵀ
  float* const dq_stages = reinterpret_cast<float*>(dst_tiles.ptr + 2 * BLOCK_N * DsLayout::kRowElems);
  float* const lse_d_tiles = dq_stages + DQ_STAGES * Cfg::DQ_STAGE_FLOATS;  // STAGES × [LSE, D]
  // Where each dQ stage's products go: written by the consumers' first thread with them,
  // read by the dQ warp, under the same two mbarriers.
  __shared__ DqItem dq_item[DQ_STAGES];
  // The handshakes: "kv" (K and V have landed), per stage "full" (the item's Q and dO have landed,
  // the copy engine's bytes and the producer warp's 32 arrivals, one per lane after its LSE and D
  // stores) and "empty" (every consumer thread is done with the stage: 256 arrivals). Per dQ
  // stage "dq_full" (both consumers' products are in it: 256 arrivals) and "dq_empty"
  // (the copy engine has read it: the dQ warp's lane 0).
  __shared__ uint64_t kv_full, full[STAGES], empty[STAGES], dq_full[DQ_STAGES], dq_empty[DQ_STAGES];
  auto bar = [](uint64_t& b) { return uint32_t(__cvta_generic_to_shared(&b)); };

  // The warp index from lane 0, warp-uniform as in step 33.
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0), role = warp / 4;  // 0: producer
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);

  // ---- this block's KV tile of (batch b, KV head h_kv).
  const int n_start = int(blockIdx.x) * BLOCK_N;
  const int64_t b = blockIdx.y / params.heads_kv, h_kv = blockIdx.y % params.heads_kv;

  // The Q tiles that see some key of this KV tile: from the mask's first to the last.
  const QTileSpan q_span = MaskT::q_tile_span(params, offset, n_start, BLOCK_N, BLOCK_M);
  const int m_first = int(q_span.first), m_end = int(q_span.end);  // a window's end before the last Q tile
  // The work items: every (query head of the group, Q tile from m_first on), one flat list in that
  // order; item t's Q, dO, LSE and D go to stage t % STAGES, its dSᵀ to tile t % 2. An item is
  // (hq, walk.tile(k)), the next one k + 1 or the next head's first (no division in the loop).
  // The deterministic mode walks each head's Q tiles down (step 22).
  const int group = int(params.heads_q / params.heads_kv);
  const QTileWalk walk{m_first, m_end, /*down=*/DETERMINISTIC};
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
        // Deterministic: this block's turn on the Q tile, counted from the first KV tile that sees it
        // (0 at compile time for the causal flag: nothing read for it).
        [[maybe_unused]] const int turn = int(blockIdx.x) - (MaskT::kFromFirstKey ? 0 : item.first_kv_tile);
        if constexpr (DETERMINISTIC) {
          while (ptx::ld_acquire_gpu(turnstiles + item.turnstile) != turn) {
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
          ptx::st_release_gpu(turnstiles + item.turnstile, turn + 1);
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
      ptx::mbarrier_arrive_expect_tx(bar(kv_full), KVLayout::bytes(2 * BLOCK_N));  // whole panels
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
        ptx::mbarrier_arrive_expect_tx(bar(full[stage]), QLayout::bytes(2 * BLOCK_M));
        load_tile_tma(next_tile(qdo_tiles, 2 * stage), &maps.qkv.q, m_start, int(h), int(b), bar(full[stage]));
        load_tile_tma(next_tile(qdo_tiles, 2 * stage + 1), &maps.d_o, m_start, int(h), int(b), bar(full[stage]));
      } else {
        ptx::mbarrier_arrive(bar(full[stage]));
      }
      if (++k == m_end) k = m_first, ++hq;
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

  // ---- init state: dK and dV of the warp's 16 keys × HEAD_DIM columns, fp32 wgmma accumulators
  // (every column of the tiles' panels: at D = 96, 32 of zeros past the head dim's).
  constexpr int KV_COLS = KVLayout::kRowElems;
  Acc<KV_COLS> dk = zeros<KV_COLS>(), dv = zeros<KV_COLS>();
  if (items > 0) mbarrier_wait(bar(kv_full), 0);  // K and V have landed

  for (int t = 0, hq = 0, k = m_first; t < items; ++t) {
    const int m_block = walk.tile(k);
    const int64_t bh = b * params.heads_q + h_kv * group + hq;
    const int m_start = m_block * BLOCK_M;
    if (++k == m_end) k = m_first, ++hq;
    const int stage = t % STAGES;
    const SmemTile<BLOCK_M, QLayout, T> q_tile = next_tile(qdo_tiles, 2 * stage);
    const SmemTile<BLOCK_M, QLayout, T> do_tile = next_tile(qdo_tiles, 2 * stage + 1);
    const float* const lse2_tile = lse_d_tiles + stage * 2 * BLOCK_M;
    const float* const delta_tile = lse2_tile + BLOCK_M;
    const SmemTile<BLOCK_N, DsLayout, T> dst_tile = next_tile(dst_tiles, t % 2);
    // K and V stay put; opaque() keeps their wgmma descriptors out of the registers between items.
    const SmemTile<BLOCK_N, KVLayout, T> k_tile = opaque(kv_tiles), v_tile = next_tile(k_tile, 1);
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
    // The score modifications the forward applied (kernels/score_mod.h): the query head's slope, the cap.
    ScoreMod::make(params, mods, b, bh - b * params.heads_q).transposed(s, key0, m_start);
    // The mask, transposed (rows are keys): queries past N_q and whatever the policy hides get
    // −inf, so that their P is 0; only on a warp's (16 keys, BLOCK_M) block that is not fully visible.
    if (MaskT::block_masked(params, int(offset), m_start, BLOCK_M, key0, 16)) {
      const auto visible = MaskT::element(params, offset);  // (query, key) -> visible, keys past N_kv included
      apply_mask(s, key0, m_start, [=](int key, int query) { return (query < n_q) & visible(query, key); });
    }
    s = exp2_cols(s, scale_log2, lse2_tile);  // Pᵀ from the stored LSE, in place of Sᵀ
    wait_for<0>(dp);
    // dSᵀ = Pᵀ ∘ (dPᵀ − D), times the cap's derivative under ScoreMods (its slope read again rather
    // than held from the scores to here).
    const Acc<BLOCK_M> ds = ScoreMod::reload(params, mods, b, bh - b * params.heads_q)
                                .ds_transposed(s, dp, delta_tile, lse2_tile, key0, m_start);
    // dSᵀ to shared memory as it is, (keys, queries): dQ needs every key of a query's row, and
    // this consumer computed 64 of the block's 128. Tile t % 2: the other one may still be read
    // by the other consumer's dQ of item t − 1.
    store_tile_rows(dst_tile, ds, key_row0, 0, int(opaque_thread_index() % 32));  // addresses computed here

    // dV += Pᵀ·dO and dK += dSᵀ·Q (times c at the end): Pᵀ and dSᵀ from the registers they were
    // computed in, the warp's FragA of its 16 keys, every query of the Q tile.
    FragA<BLOCK_M> p_frag = to_a<T>(s), ds_frag = to_a<T>(ds);
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
      dq_item[dq_stage] = DqItem{m_start, int(bh), bh * turnstiles_per_head + m_start / int(kBackwardTurnstileRows),
                                 int(MaskT::kv_tile_first(params, offset, m_start, BLOCK_M, BLOCK_N))};
    ptx::mbarrier_arrive(bar(dq_full[dq_stage]));
  }

  // ---- store: dK = c · Σ dSᵀ·Q and dV, in T, rows past N_kv not written.
  T* dk_ptr =
      static_cast<T*>(bp.dk) + b * bp.dk_stride.batch + h_kv * bp.dk_stride.head + int64_t(n_start) * bp.dk_stride.seq;
  T* dv_ptr =
      static_cast<T*>(bp.dv) + b * bp.dv_stride.batch + h_kv * bp.dv_stride.head + int64_t(n_start) * bp.dv_stride.seq;
  store_rows(dk_ptr, bp.dk_stride.seq, head_columns<HEAD_DIM>(dk), rows(scale_log2 / kLog2e), key_row0, kv_rows);
  store_rows(dv_ptr, bp.dv_stride.seq, head_columns<HEAD_DIM>(dv), rows(1.0f), key_row0, kv_rows);
}

template <int HEAD_DIM, typename Cfg, typename MaskT, typename ScoreMod, typename T>
Status launch_backward(const BackwardParams& bp, cudaStream_t stream) {
  const AttentionParams& p = bp.fwd;
  // Shared memory first, before anything is written (BwdConfig::smem_bytes).
  constexpr int smem = Cfg::smem_bytes();
  const auto kernel = bp.deterministic ? backward_kernel<HEAD_DIM, Cfg, true, MaskT, ScoreMod, T>
                                       : backward_kernel<HEAD_DIM, Cfg, false, MaskT, ScoreMod, T>;
  if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
  // The tensor maps, by value, before anything is written: K and V in boxes of BLOCK_N rows, Q and
  // dO of BLOCK_M, dQ's accumulator (the workspace's, (B·H_q, N_q, HEAD_DIM) fp32) in (BLOCK_M, 32)
  // boxes (library/tma.h).
  BwdTileMaps maps;
  if (Status st = make_qkv_tile_maps(&maps.qkv, p, Cfg::BLOCK_M, Cfg::BLOCK_N); !st.ok()) return st;
  if (Status st = make_tile_map(&maps.d_o, "d_o", bp.d_o, p.batch, p.heads_q, p.seqlen_q, p.head_dim, bp.do_stride,
                                Cfg::BLOCK_M, p.dtype);
      !st.ok())
    return st;
  const float* const dq_accum =
      reinterpret_cast<const float*>(static_cast<const char*>(bp.workspace) + backward_workspace(p).dq_accum);
  if (Status st = make_accum_map(&maps.dq, dq_accum, p.batch * p.heads_q, p.seqlen_q, HEAD_DIM, Cfg::BLOCK_M); !st.ok())
    return st;
  return bwd_common::run<HEAD_DIM, T>(bp, stream, [&](const bwd_common::Buffers& w) {
    const dim3 grid(unsigned(cdiv(p.seqlen_kv, Cfg::BLOCK_N)), unsigned(p.batch * p.heads_kv));
    kernel<<<grid, Cfg::NUM_THREADS, smem, stream>>>(bp, w.delta, w.lse2, w.turnstiles, scale_log2(p),
                                                     p.causal_offset(), maps, score_mod_args(p));
    FA_LAUNCH_RETURN();
    return Status::Ok();
  });
}

}  // namespace

Capabilities backward_caps() {
  Capabilities c = forward_caps({32, 64, 96, 128});
  c.dtypes = built_dtypes();             // the forwards' types: bf16, and fp16 where the build has it
  c.only_sm = 90;                        // wgmma: sm_90a code, compute capability 9.0 only
  c.deterministic_backward = true;       // BackwardParams::deterministic: dQ added in a fixed order
  c.broadcast = false;                   // Q, dO, K, V through TMA maps: no zero strides,
  c.tma = true;                          // 32-bit coordinates, 40-bit byte strides
  c.sliding_window = true;               // window_size: WindowFlag's kernels, as the forward's
  c.softcap = c.alibi = c.sinks = true;  // Mods kernels (the cap's derivative), and the sinks' gradient
  return c;
}

// The kernel for call bp's element type, mask and score modifications (kernels/score_mod.h says
// which): fp16 where the build compiles it (validation refused every type it left out).
template <int HEAD_DIM, typename Cfg>
Status launch_for(const BackwardParams& bp, cudaStream_t stream) {
  return with_backward_policies(bp.fwd, [&](auto mask, auto mod) {
    return with_element_type<bf16, fp16>(bp.fwd.dtype, [&]<typename T>() {
      return launch_backward<HEAD_DIM, Cfg, decltype(mask), decltype(mod), T>(bp, stream);
    });
  });
}

Status backward(const BackwardParams& bp, cudaStream_t stream) {
  static const Capabilities caps = backward_caps();
  if (Status st = validate_backward(bp, caps); !st.ok()) return st;
  if (Status st = check_device(caps); !st.ok()) return st;  // sm_90a code on a GPU that can run it
  if (Status st = bwd_common::check_backward_grids(bp.fwd); !st.ok()) return st;
  // The dQ warp's reduces name a Q tile by 32-bit coordinates (step 26).
  if (bp.fwd.batch * bp.fwd.heads_q > INT32_MAX)
    return Status::Unsupported(
        "the Hopper backward's dQ reduce addresses B·H_q with 32-bit coordinates: at most "
        "2^31 - 1 (got " +
        std::to_string(bp.fwd.batch * bp.fwd.heads_q) + ")");
  if constexpr (head_dim_built(32))  // Part VI: D = 64's tiles, the panel half used
    if (bp.fwd.head_dim == 32) return launch_for<32, BwdConfig<32>>(bp, stream);
  if constexpr (head_dim_built(64))
    if (bp.fwd.head_dim == 64) return launch_for<64, BwdConfig<64>>(bp, stream);
  if constexpr (head_dim_built(96))  // Part VI: D = 128's tiles, the second panel half used
    if (bp.fwd.head_dim == 96) return launch_for<96, BwdConfig<96>>(bp, stream);
  if constexpr (head_dim_built(128))
    if (bp.fwd.head_dim == 128) return launch_for<128, BwdConfig<128>>(bp, stream);
  return Status::Unsupported("the Hopper backward has no kernel at head dim " + std::to_string(bp.fwd.head_dim));
}

}  // namespace fa::kernels::bwd_hopper
