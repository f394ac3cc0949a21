// Step 16 — the epilogue through shared memory: each consumer writes its 64 rows of O, scaled
// and rounded to bf16, into a swizzled tile of shared memory, and one of its threads hands the
// tile to the copy engine (a TMA store) instead of every thread storing its values to global
// memory.
//
// What changed since step 15:
//  - Shared memory holds one O tile per consumer after the ring, in the 128-byte swizzle that
//    both wgmma and the copy engine use. At D = 128 the ring had filled 225 of the 227 KiB:
//    <192, 64> pays for the tiles with one ring stage, and <128, 128, 3> keeps its stages and
//    step 15's store from the registers (Config::O_VIA_SMEM), which measured faster there.
//  - The store: the consumer's first thread waits until its previous store has read the tile
//    (cp.async.bulk.wait_group.read), the warpgroup meets on its own named barrier, writes the
//    tile, fences it for the async proxy, meets again, and the first thread issues one
//    cp.async.bulk.tensor store per 64-column panel. Rows past N_q are clipped by the tensor
//    map, so the store needs no row test. LSE is still written from the registers.
//  - The kernel takes a fourth tensor map, O's, in boxes of 64 rows.
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

namespace fa::step16 {
namespace {

using namespace fa::tile;
using fa::ptx::mbarrier_wait;

// One kernel configuration: query rows per block, keys per K/V tile, K/V tiles in flight, and
// whether O leaves through shared memory (the TMA store) or, as in step 15, from the registers.
template <int BLOCK_M_, int BLOCK_N_, int STAGES_, bool O_VIA_SMEM_ = true>
struct Config {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int STAGES = STAGES_;
  static constexpr bool O_VIA_SMEM = O_VIA_SMEM_;
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
  // Shared memory: the Q tile, then STAGES × (K tile, V tile), then (O_VIA_SMEM) the consumers'
  // O tiles (BLOCK_M rows together), all (rows, HEAD_DIM) bf16 in wgmma's swizzle, plus 1 KiB to
  // move the start up to a 1024-byte boundary.
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return kWgmmaAlignment +
           WgmmaLayout<BLOCK_M, HEAD_DIM>::bytes((O_VIA_SMEM ? 2 : 1) * BLOCK_M + STAGES * 2 * BLOCK_N);
  }
};

// __launch_bounds__(threads, 1): the register cap at entry that setmaxnreg needs.
template <int HEAD_DIM, typename Cfg>
__global__ void __launch_bounds__(Cfg::NUM_THREADS, 1)
    attention_kernel(const AttentionParams params, const float scale_log2, const int64_t offset,
                     const __grid_constant__ QkvTileMaps maps, const __grid_constant__ CUtensorMap o_map) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N;
  constexpr int STAGES = Cfg::STAGES, ROWS_PER_WARP = Cfg::ROWS_PER_WARP;
  using QLayout = WgmmaLayout<BLOCK_M, HEAD_DIM>;
  using KVLayout = WgmmaLayout<BLOCK_N, HEAD_DIM>;
  extern __shared__ uint4 smem[];  // 16-byte aligned; wgmma's swizzle atoms need 1024 (below)
  const SmemTile<BLOCK_M, QLayout> q_tile{aligned_for_wgmma(smem)};                       // (BLOCK_M, HEAD_DIM)
  const SmemTile<BLOCK_N, KVLayout> kv_tiles{q_tile.ptr + BLOCK_M * QLayout::kRowElems};  // STAGES × [K, then V]
  using OLayout = WgmmaLayout<Cfg::WARPGROUP_ROWS, HEAD_DIM>;                             // one consumer's 64 rows of O
  [[maybe_unused]] bf16* const o_tiles =
      next_tile(kv_tiles, 2 * STAGES).ptr;  // CONSUMERS × (64, HEAD_DIM), after the ring
  // Per ring slot: "full" (its K and V have landed: the producer's arrival and the bytes) and
  // "empty" (every consumer warp is done with it: 4 · CONSUMERS arrivals); the same pair for Q,
  // whose "empty" every consumer thread arrives at (128 · CONSUMERS: see release_q).
  __shared__ uint64_t q_full, q_empty, kv_full[STAGES], kv_empty[STAGES];
  auto bar = [](uint64_t& b) { return uint32_t(__cvta_generic_to_shared(&b)); };

  const int warp = int(threadIdx.x) / 32;
  const int warpgroup = warp / 4;                             // 0: the producer; 1 .. CONSUMERS: the consumers
  const int wg_row0 = Cfg::WARPGROUP_ROWS * (warpgroup - 1);  // a consumer's first row in the block
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);

  // ---- work tiles: the block's k-th is persistent_tile(k, ...) in the order of work_tile: heads
  // outer, Q tiles inner; causal: folded into pairs of equal cost (device/tiles.h). The producer
  // alone works this out, and hands each tile to the consumers in `scheduled` (below).
  const bool causal = params.causal;  // key j visible to row i iff j <= i + offset
  const int m_tiles = (n_q + BLOCK_M - 1) / BLOCK_M;
  const int tiles = m_tiles * int(params.batch * params.heads_q);  // at most kMaxWorkTiles (launch refuses more)
  struct Work {
    int bh;  // batch · H_q + query head; -1: no more tiles
    int m_start, n_blocks, first_masked;
  };
  auto work = [&](int t) {
    Work w{-1, 0, 0, 0};
    if (t >= tiles) return w;
    const WorkTile tile = work_tile(t, m_tiles, causal);
    w.bh = tile.bh;
    w.m_start = tile.m_tile * BLOCK_M;
    w.n_blocks = kv_tile_end(w.m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);  // stop at the diagonal
    w.first_masked = kv_tile_first_masked(w.m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);
    return w;
  };
  auto batch_of = [&](const Work& w) { return w.bh / int(params.heads_q); };
  auto head_of = [&](const Work& w) { return w.bh % int(params.heads_q); };
  // The producer's note to the consumers of which tile comes next: written before it announces the
  // tile's Q on q_full (whose arrival releases the write; the consumers' wait acquires it). Two
  // entries: tile iter's is rewritten for tile iter + 2 only after Q of tile iter + 1 was released,
  // when every consumer is past tile iter's store. (Worked out by every consumer thread instead,
  // the decode costs the D = 128 consumers registers they do not have.)
  __shared__ Work scheduled[2];
  // Every consumer thread releases Q (and with it the note of the tile before) itself: an arrival
  // orders the arriving thread's own earlier reads, and every thread read the note.
  auto release_q = [&] { ptx::mbarrier_arrive(bar(q_empty)); };

  // The K and V tiles of the block's ring position `pos` (its pos-th K/V tile over all its work
  // tiles): slot pos % STAGES, K first.
  auto k_tile_of = [&](int pos) { return next_tile(kv_tiles, 2 * (pos % STAGES)); };
  auto v_tile_of = [&](int pos) { return next_tile(kv_tiles, 2 * (pos % STAGES) + 1); };
  // The producer's one thread: once the slot's previous use is released, announces its bytes and
  // issues the copies of KV tile n_block of work tile w into ring position pos (rows past N_kv are
  // outside the map: zeros).
  auto load_kv = [&](const Work& w, int n_block, int pos) {
    const int slot = pos % STAGES, use = pos / STAGES;
    if (use > 0) mbarrier_wait(bar(kv_empty[slot]), (use - 1) % 2);  // use - 1 is released
    ptx::mbarrier_arrive_expect_tx(bar(kv_full[slot]), 2 * BLOCK_N * HEAD_DIM * 2);
    const int h_kv = int(kv_head_of(head_of(w), params.heads_q, params.heads_kv));
    load_tile_tma(k_tile_of(pos), &maps.k, n_block * BLOCK_N, h_kv, batch_of(w), bar(kv_full[slot]));
    load_tile_tma(v_tile_of(pos), &maps.v, n_block * BLOCK_N, h_kv, batch_of(w), bar(kv_full[slot]));
  };

  // Barriers: initialised by one thread, made visible to the copy engine, seen by the block.
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(bar(q_full), 1);
    ptx::mbarrier_init(bar(q_empty), 128 * Cfg::CONSUMERS);
    for (int stage = 0; stage < STAGES; ++stage) {
      ptx::mbarrier_init(bar(kv_full[stage]), 1);
      ptx::mbarrier_init(bar(kv_empty[stage]), 4 * Cfg::CONSUMERS);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on, the roles meet only on mbarriers

  // ---- the producer: per work tile, Q (once the consumers released the last one), then every
  // K/V tile, each as soon as its slot is free.
  if (warpgroup == 0) {
    ptx::warpgroup_reg_dealloc<Cfg::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      int pos = 0;  // ring position: K/V tiles this block has loaded so far
      for (int iter = 0;; ++iter) {
        const Work w = work(persistent_tile(iter, int(blockIdx.x), int(gridDim.x), causal));
        // The first K/V tile before Q: its slot is free early, while the last tile's Q may still
        // be in use; Q once the consumers have released it; then the rest.
        if (w.n_blocks > 0) load_kv(w, 0, pos++);
        if (iter > 0) mbarrier_wait(bar(q_empty), (iter - 1) % 2);  // the last tile's Q is released
        scheduled[iter % 2] = w;
        if (w.bh < 0) {  // no more tiles: the consumers learn it from q_full's next phase
          ptx::mbarrier_arrive(bar(q_full));
          break;
        }
        ptx::mbarrier_arrive_expect_tx(bar(q_full), BLOCK_M * HEAD_DIM * 2);
        load_tile_tma(q_tile, &maps.q, w.m_start, head_of(w), batch_of(w), bar(q_full));
        for (int n_block = 1; n_block < w.n_blocks; ++n_block) load_kv(w, n_block, pos++);
      }
    }
    return;
  }

  // ---- the consumers: per work tile, step 13's loop, with the ring position carried across tiles.
  ptx::warpgroup_reg_alloc<Cfg::CONSUMER_REGS>();
  const int tile_row0 = (warp - 4) * ROWS_PER_WARP;  // the warp's first row in the block
  int pos = 0;
  for (int iter = 0;; ++iter) {
    mbarrier_wait(bar(q_full), iter % 2);  // this tile's Q has landed (the barrier's iter-th phase)
    const Work w = scheduled[iter % 2];
    if (w.bh < 0) break;
    const int row0 = w.m_start + tile_row0;  // this warp's first query row

    // ---- init state: each lane holds rows g and g + 8 of the warp's 16 rows (device/warp_tile.h),
    // also where the warpgroup's wgmma puts them.
    Acc<HEAD_DIM> o_i = zeros<HEAD_DIM>();  // (16, HEAD_DIM) fp32, unnormalised output
    Rows m_i = rows(-INFINITY);             // running row max, in raw score units (fp32)
    Rows l_i = rows(0.0f);                  // running row sum over THIS lane's columns (fp32);
                                            // the 4 lanes of a row are summed once, at the end

    // The softmax of one S tile (step 10's lazy rescale): masks it if it needs a mask, moves m and
    // l, turns S into P (fp32, in place), and says whether O must be rescaled by alpha once the
    // P·V in flight is done. P's bf16 copy, the next P·V's A operand, is made after that wait:
    // ptxas serialises every wgmma if a wgmma's A registers are written while one is in flight.
    auto softmax = [&](Acc<BLOCK_N>& s, int n_block, Rows& alpha) {
      if (n_block >= w.first_masked) apply_mask(s, row0, n_block * BLOCK_N, CausalMask{n_kv, causal, offset});
      const Rows m_new = row_max(s, m_i);
      const bool moved = any_max_moved(m_i, m_new, scale_log2, Cfg::RESCALE_THRESHOLD);
      if (moved) {
        alpha = rescale_factor(m_i, scale_log2, exp2_offset(m_new, scale_log2));  // 0 on the first
        l_i = l_i * alpha;
        m_i = m_new;
      }
      // P against the max the state is kept at (c·m_i, 0 while m_i = -inf): ≤ 2^threshold.
      s = exp2_rows(s, scale_log2, exp2_offset(m_i, scale_log2));
      l_i = l_i + row_sum(s);
      return moved;
    };
    // Waits until the tile at ring position q_pos has landed.
    auto wait_full = [&](int q_pos) { mbarrier_wait(bar(kv_full[q_pos % STAGES]), (q_pos / STAGES) % 2); };

    // ---- KV loop, pipelined by one tile
    if (w.n_blocks > 0) {
      // Prologue: S and P of the first tile (no P·V in flight yet: O is rescaled at once).
      Acc<BLOCK_N> s;
      wait_full(pos);
      wgmma_begin(s);
      mma_qk_async(s, q_tile, wg_row0, k_tile_of(pos));
      ptx::wgmma_commit();
      wait_for<0>(s);
      if (w.n_blocks == 1) release_q();  // Q's last use
      Rows alpha;
      if (softmax(s, 0, alpha)) rescale(o_i, alpha);
      FragA<BLOCK_N> p = to_bf16(s);
      for (int n_block = 1; n_block < w.n_blocks; ++n_block, ++pos) {
        // S_next = Q·K_{j+1}ᵀ, then O += P_j·V_j: two groups, in this order on the tensor cores.
        // One wgmma_begin for both: once the first group is in flight, no ordinary instruction
        // may define a register the second reads (ptxas would serialise every wgmma).
        Acc<BLOCK_N> s_next;
        wait_full(pos + 1);
        wgmma_begin(s_next, o_i, p);
        mma_qk_async(s_next, q_tile, wg_row0, k_tile_of(pos + 1));
        ptx::wgmma_commit();
        mma_pv_async(o_i, p, v_tile_of(pos));
        ptx::wgmma_commit();
        wait_for<1>(s_next);  // Q·Kᵀ is done; P·V may still run while the softmax below does
        if (n_block + 1 == w.n_blocks) release_q();
        const bool moved_next = softmax(s_next, n_block, alpha);
        wait_for<0>(o_i, p);  // P_j·V_j is in O (and P_j's registers are free), V_j's slot too
        if (lane_id() == 0) ptx::mbarrier_arrive(bar(kv_empty[pos % STAGES]));
        if (moved_next) rescale(o_i, alpha);  // now that no product writes O
        p = to_bf16(s_next);                  // ... and no product reads P
      }
      // Epilogue: the last P·V.
      wgmma_begin(o_i, p);
      mma_pv_async(o_i, p, v_tile_of(pos));
      ptx::wgmma_commit();
      wait_for<0>(o_i, p);
      if (lane_id() == 0) ptx::mbarrier_arrive(bar(kv_empty[pos % STAGES]));
      ++pos;
    }
    if (w.n_blocks == 0) release_q();  // no key: Q unused

    // ---- normalise: finish the row sums across the quad, then one divide per row (deferred).
    const Rows l = quad_sum(l_i);

    // ---- store: which tile this was is read again (registers are short). O goes through this
    // consumer's shared tile: once its last store has read the tile (wait_group.read; only the
    // issuing thread can ask, the named barrier tells the other 127), the warpgroup writes bf16
    // pairs into it, fences them for the copy engine, meets again, and one thread stores the
    // tile; rows past N_q are outside O's tensor map and are not written. Without the tile
    // (!O_VIA_SMEM), step 15's store: bf16 pairs straight from the accumulators.
    const Work done = scheduled[iter % 2];
    if constexpr (Cfg::O_VIA_SMEM) {
      // (Worked out here, not before the loop, where two more live registers cost the D = 128
      // consumers a spill.)
      const SmemTile<Cfg::WARPGROUP_ROWS, OLayout> o_tile{o_tiles + (warpgroup - 1) * Cfg::WARPGROUP_ROWS * HEAD_DIM};
      const bool o_leader = threadIdx.x % 128 == 0;  // the consumer's thread that issues its O stores
      if (o_leader) ptx::bulk_wait_group_read<0>();
      ptx::named_barrier_sync(warpgroup, 128);  // barrier 1..CONSUMERS: this consumer's four warps
      store_rows_to_tile(o_tile, o_i, safe_inverse(l), tile_row0 - wg_row0);
      ptx::fence_proxy_async_shared();  // the writes above, before the copy engine's reads
      ptx::named_barrier_sync(warpgroup, 128);
      if (o_leader) {
        store_tile_tma(o_tile, &o_map, done.m_start + wg_row0, head_of(done), batch_of(done));
        ptx::bulk_commit_group();
      }
    } else {
      bf16* o_ptr = static_cast<bf16*>(params.o) + int64_t(batch_of(done)) * params.o_stride.batch +
                    int64_t(head_of(done)) * params.o_stride.head + int64_t(w.m_start) * params.o_stride.seq;
      store_rows(o_ptr, params.o_stride.seq, o_i, safe_inverse(l), tile_row0, n_q - w.m_start);
    }
    // LSE = scale·m + ln(l), -inf for a row that saw no key; one lane per row writes it.
    if (params.lse != nullptr) {
      float* lse_ptr = params.lse + int64_t(done.bh) * n_q + w.m_start;  // (B, H_q, N_q) fp32
      store_row_values(lse_ptr, log_sum_exp(m_i, l, scale_log2), tile_row0, n_q - w.m_start);
    }
  }
  // The block's shared memory must outlive the copy engine's last read of it, and O's writes
  // must be done before the kernel is.
  if (Cfg::O_VIA_SMEM && threadIdx.x % 128 == 0) ptx::bulk_wait_group<0>();
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
  // O in boxes of one consumer's 64 rows. Built for every configuration, the one that stores from
  // the registers too: what the step accepts (strides TMA can express) does not depend on which
  // configuration the tuner picks.
  CUtensorMap o_map;
  if (Status st =
          make_tile_map(&o_map, "o", p.o, p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.o_stride, Cfg::WARPGROUP_ROWS);
      !st.ok())
    return st;
  // As many blocks as run at once (one per SM for these configs), never more than there are tiles.
  const int64_t tiles = cdiv(p.seqlen_q, Cfg::BLOCK_M) * p.batch * p.heads_q;
  if (tiles > kMaxWorkTiles)
    return Status::Unsupported("persistent grid: more than 2^31 work tiles (B·H_q·N_q / BLOCK_M)");
  int resident = 0;
  if (Status st = resident_blocks(reinterpret_cast<const void*>(attention_kernel<HEAD_DIM, Cfg>), Cfg::NUM_THREADS,
                                  smem, &resident);
      !st.ok())
    return st;
  const dim3 grid(unsigned(std::min<int64_t>(tiles, resident)));
  attention_kernel<HEAD_DIM, Cfg>
      <<<grid, Cfg::NUM_THREADS, smem, stream>>>(p, scale_log2, p.causal_offset(), maps, o_map);
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
          &launch<HEAD_DIM, Cfg>,
          Cfg::O_VIA_SMEM ? "O=smem" : "O=registers"};  // part of the name: the cache tells them apart
}

// Per head dim in order of preference (the heuristic's tie-break). Four consumers (BLOCK_M = 256)
// get 112 registers each, three 160, two 240. With two P tiles and one S tile live, D = 128 with
// 128-key tiles needs two consumers (three spill at 160), and D = 128 with four spills at 112.
// D = 64: step 15's, each with room for the O tiles to spare (at most 177 KiB). D = 128 has no
// room: step 15's ring filled 225 of the 227 KiB. <192, 64, 4> gives up a stage for the tiles
// (225 KiB); <128, 128, 3> keeps its stages and step 15's store from the registers, because its O
// tiles would cost a third of its ring (with every D = 128 configuration paying for the tile,
// D = 128 ran 6-22 % slower than step 15 at N >= 4k and at causal N = 2k: README.md).
// Every entry is compiled (for sm_90a alone), so each one added costs CI minutes: add one only if
// some shape measurably wins with it.
const tuner::Tuner kTuner(16, FA_BUILD_ID,
                          {
                              config<64, Config<256, 64, 5>>(),           // 4 consumers, 5 tiles in flight
                              config<64, Config<192, 128, 4>>(),          // 3 consumers, 128-key tiles
                              config<64, Config<128, 128, 4>>(),          // 2 consumers, 128-key tiles
                              config<128, Config<192, 64, 4>>(),          // 3 consumers at 160 registers
                              config<128, Config<128, 128, 3, false>>(),  // 2 consumers at 240, O from registers
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
  c.max_work_tiles = kMaxWorkTiles;        // the persistent grid's 32-bit tile counter,
  // counted in the smallest tiles any configuration takes
  c.work_tile_rows = kTuner.min_block_m();
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  if (Status st = check_device(kCaps); !st.ok()) return st;  // sm_90a code on a GPU that can run it
  return kTuner.run(p, stream);  // the cached config for this problem, tuned on its first call
}

FA_REGISTER_STEP({16, "tma_store", /*base=*/15,
                  "O leaves through shared memory and the copy engine (a TMA store), not from every thread's registers",
                  kCaps, &forward, ""})

}  // namespace fa::step16
