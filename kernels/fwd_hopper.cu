// The production forward on Hopper (sm_90a), generalised from step 16: a producer warpgroup that
// loads Q and a ring of K/V tiles with the copy engine (TMA), consumer warpgroups of 64 rows each
// on wgmma, the next S = Q·Kᵀ overlapped with the last P·V, lazy rescaling, a persistent grid. Not
// a lesson: the steps never include it. What step 16 hard-wired is a policy here:
//
//   Mask      which KV tiles a Q tile visits and which need the element test (kernels/mask.h);
//             CausalFlag by default: the call's causal flag, either alignment, at run time.
//   ScoreMod  a hook on each score tile before the mask and the row max, and on each row before
//             the store (kernels/score_mod.h): Identity, or the call's softcap, ALiBi and sinks.
//   Scheduler which work tiles a block takes, turn by turn (kernels/scheduler.h): persistent.
//   Epilogue  how O and LSE leave (kernels/epilogue.h): TmaStore (through shared memory and the
//             copy engine) or RegisterStore; part of the configuration, and of its tuner name.
//   Sequences where each sequence's rows are (kernels/sequences.h): Batched, or Packed (varlen),
//             one instantiation each, picked by the call.
//
// And the element type T of Q, K, V and O: bf16, as step 16, or fp16 where the build compiles it
// (FA_DTYPES): the shared tiles' type, from which the wgmmas take their .bf16 or .f16 form, P's and
// O's rounding; TMA moves bytes, so the copies are the same (the maps name the type all the same:
// library/tma.cpp).
//
// Packed sequences (cu_seqlens) run here when they are longer than a decode: the maps describe
// the packed (total, H, D) tensors, the producer skips the Q tiles past a sequence's end and hands
// the consumers each sequence's rows and lengths. The maps clip only at the tensor's end, so a
// sequence's last tiles hold its neighbour's rows: Q's are computed and never stored, K's are
// masked like any key past N_kv, V's are zeroed in shared memory before P·V reads them (0 · NaN
// would be NaN), and a warpgroup whose rows run past the sequence copies the ones that exist from
// its O tile instead of storing the map's box (docs/production_layer.md).
//
// With the default policies it compiles, configuration by configuration, to step 16's count of
// HGMMA, UTMALDG, UTMASTG and MUFU.EX2 (static.kernels.hopper.same_as_step16).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "device/ptx/mbarrier.h"
#include "device/smem_tile.h"
#include "device/warp_tile.h"
#include "device/warpgroup_tile.h"
#include "fa/registry.h"
#include "kernels/epilogue.h"
#include "kernels/kernels.h"
#include "kernels/launch.h"
#include "kernels/mask.h"
#include "kernels/scheduler.h"
#include "kernels/sequences.h"
#include "kernels/score_mod.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/tma.h"
#include "library/split_kv.h"
#include "library/tuner.h"

namespace fa::kernels::hopper {
namespace {

using namespace fa::tile;
using fa::ptx::mbarrier_wait;

constexpr int kWarpgroupThreads = 128;  // four warps issue one wgmma together
constexpr int kWarpgroupRows = 64;      // the rows one wgmma computes: 16 per warp
constexpr int kProducerRegs = 24;       // what the producer keeps after setmaxnreg, at least
constexpr int kProducerRegsRoomy = 32;  // ... and where that costs the consumers no register
constexpr int kMaxConsumerRegs = 240;   // the most setmaxnreg gives a thread (below the 255 cap)

// Named barriers: 0 is __syncthreads(); consumer warpgroup c (1, 2, ...) meets its own four warps
// on barrier c; all the consumers meet on the one after the last of those.
__device__ __forceinline__ int consumer_barrier(int warpgroup) {
  return warpgroup;
}
template <int CONSUMERS>
__device__ __forceinline__ int all_consumers_barrier() {
  return CONSUMERS + 1;
}

// One kernel configuration: query rows per block, keys per K/V tile, K/V tiles in flight, and the
// epilogue (whether O leaves through shared memory and the copy engine).
template <int BLOCK_M_, int BLOCK_N_, int STAGES_, class Epilogue_ = TmaStore>
struct Config {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int STAGES = STAGES_;
  using Epilogue = Epilogue_;
  static constexpr const char* VARIANT = Epilogue::kName;  // in the tuner's name: "O=smem", "O=registers"
  static constexpr int ROWS_PER_WARP = 16;
  static constexpr int CONSUMERS = BLOCK_M / kWarpgroupRows;  // consumer warpgroups
  static constexpr int NUM_WARPS = 4 * (1 + CONSUMERS);       // the producer warpgroup first
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static_assert(BLOCK_M % kWarpgroupRows == 0, "whole warpgroups");
  // Registers per thread after setmaxnreg (step 13's arithmetic): the block's pool is its entry
  // cap times its threads; the producer gives most of its share back, the consumers share the rest.
  static constexpr int ENTRY_REGS = 65536 / NUM_THREADS / 8 * 8;
  static constexpr int consumer_regs(int producer_regs) {
    const int fit =
        (NUM_THREADS * ENTRY_REGS - kWarpgroupThreads * producer_regs) / (kWarpgroupThreads * CONSUMERS) / 8 * 8;
    return fit < kMaxConsumerRegs ? fit : kMaxConsumerRegs;
  }
  // The packed producer's sequence lookups spill at 24 registers with 3 or 4 consumers, whose share
  // is the same at 32 (rounded down to 8 either way).
  static constexpr int PRODUCER_REGS =
      consumer_regs(kProducerRegsRoomy) == consumer_regs(kProducerRegs) ? kProducerRegsRoomy : kProducerRegs;
  static constexpr int CONSUMER_REGS = consumer_regs(PRODUCER_REGS);
  static_assert(kWarpgroupThreads * (PRODUCER_REGS + CONSUMERS * CONSUMER_REGS) <= NUM_THREADS * ENTRY_REGS,
                "the consumers would ask setmaxnreg for more registers than the block holds");
  static_assert(BLOCK_N == 64 || BLOCK_N == 128 || BLOCK_N == 80, "the wgmma shapes wrapped: N = 64, 80, 128");
  static constexpr float RESCALE_THRESHOLD = 8.0f;  // P <= 2^8 until a row's max moves by more
  // Shared memory: Q, STAGES × (K, V), then (TmaStore) the consumers' O tiles, all in wgmma's
  // swizzle, plus 1 KiB to move the start up to a 1024-byte boundary.
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return kWgmmaAlignment +
           WgmmaLayout<BLOCK_M, HEAD_DIM>::bytes((Epilogue::kSmemTile ? 2 : 1) * BLOCK_M + STAGES * 2 * BLOCK_N);
  }
};

// ---- the kernel --------------------------------------------------------------------------------

// T: the element type of Q, K, V and O (bf16 or fp16).
template <int HEAD_DIM, typename Cfg, typename T, typename Sequences = Batched, typename MaskT = CausalFlag,
          typename ScoreMod = Identity, typename Scheduler = PersistentScheduler>
__global__ void __launch_bounds__(Cfg::NUM_THREADS, 1)
    attention_kernel(const AttentionParams params, const float scale_log2, const int64_t offset,
                     const ScoreModArgs mods, const __grid_constant__ QkvTileMaps maps,
                     const __grid_constant__ CUtensorMap o_map) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N;
  constexpr int STAGES = Cfg::STAGES, ROWS_PER_WARP = Cfg::ROWS_PER_WARP;
  using Epilogue = typename Cfg::Epilogue;
  using QLayout = WgmmaLayout<BLOCK_M, HEAD_DIM>;
  using KVLayout = WgmmaLayout<BLOCK_N, HEAD_DIM>;
  using OLayout = WgmmaLayout<kWarpgroupRows, HEAD_DIM>;  // one consumer's rows of O
  extern __shared__ uint4 smem[];                         // 16-byte aligned; wgmma's swizzle atoms need 1024
  const SmemTile<BLOCK_M, QLayout, T> q_tile{aligned_for_wgmma<T>(smem)};
  const SmemTile<BLOCK_N, KVLayout, T> kv_tiles{q_tile.ptr + BLOCK_M * QLayout::kRowElems};  // STAGES × [K, then V]
  [[maybe_unused]] T* const o_tiles = next_tile(kv_tiles, 2 * STAGES).ptr;                   // TmaStore: after the ring
  // Per ring slot "full" (K and V landed) and "empty" (every consumer warp is done with it); the
  // same pair for Q, whose "empty" every consumer thread arrives at. At D = 256 K and V have a "full"
  // each (k_full, v_full), so that a tile's Q·Kᵀ need not wait for its V: with two 64 KB stages the
  // next V's copy then runs under Q·Kᵀ (measured on an H100: D = 256 +5-10 %; D = 192, three stages,
  // −8-12 %, and D = 64 −2 %, so there one barrier, k_full, stands for both).
  constexpr bool kSplitFull = HEAD_DIM == 256;
  __shared__ uint64_t q_full, q_empty, k_full[STAGES], v_full[kSplitFull ? STAGES : 1], kv_empty[STAGES];
  auto bar = [](uint64_t& b) { return uint32_t(__cvta_generic_to_shared(&b)); };

  const int warp = int(threadIdx.x) / 32;
  const int warpgroup = warp / 4;                        // 0: the producer; 1 .. CONSUMERS: the consumers
  const int wg_row0 = kWarpgroupRows * (warpgroup - 1);  // a consumer's first row in the block
  constexpr bool varlen = Sequences::kPacked;            // packed sequences: maps of (1, H, total, D)

  // ---- work tiles: the Scheduler's, decoded by the producer alone into the KV tiles to visit and
  // handed to the consumers in `scheduled`. With varlen, Q tiles count to the longest sequence's.
  const Tiles tiles{int(cdiv(params.seqlen_q, BLOCK_M)), params.batch * params.heads_q, MaskT::longest_first(params)};
  struct Work {
    int bh;  // batch · H_q + query head; -1: no more tiles
    int m_start, n_blocks, first_masked;
    int q_row, kv_row;  // the tile's first row in Q's and O's maps, its sequence's first key in K's and V's
    int n_q, n_kv;      // the sequence's queries and keys
    int offset;         // its causal diagonal: key j visible to query i when j <= i + offset
    // A window's range (kFromFirstKey false): the first KV tile visited, and the first fully visible
    // one (tiles before it are masked too). n_blocks counts from `first`. Both 0 for the other masks.
    // Visited from the last back (kBack), `first` is the last tile.
    int first, first_full;
  };
  // The KV tiles are visited in key order, the i-th KV tile first + i; ScoreMod::kDiagonalFirst
  // (one-sided ALiBi, whose bias rises toward the diagonal) visits them from the last back, the
  // i-th KV tile first − i with `first` the last. Which tiles need the element test is the same.
  constexpr bool kBack = ScoreMod::kDiagonalFirst;
  static_assert(!(kBack && (varlen || MaskT::kFromFirstKey)),
                "visited from the last back: a window's range (a packed sequence's last KV tile is zeroed "
                "as the last one visited)");
  auto visited = [](const Work& w, int i) { return MaskT::kFromFirstKey ? i : w.first + (kBack ? -i : i); };
  // The next work tile at or after the scheduler's turn `turn` (advanced past it): a varlen tile
  // past its sequence's last query is no work, and skipped.
  auto work = [&](int& turn) {
    Work w{-1, 0, 0, 0, 0, 0, 0, 0, 0};
    for (;;) {
      const typename Scheduler::Work t = Scheduler::work(tiles, turn++);
      if (t.bh < 0) return w;
      w.bh = int(t.bh);
      w.m_start = t.m_block * BLOCK_M;
      const int b = w.bh / int(params.heads_q);
      const SequenceRows q_seq = Sequences::queries(params, b);
      if constexpr (varlen) {  // the sequence's own Q tiles, causal ones refolded into pairs of equal cost
        const int own = (q_seq.length + BLOCK_M - 1) / BLOCK_M;
        const int m_block = tiles.longest_first ? refold_tile(t.m_block, tiles.m_tiles, own) : t.m_block;
        if (m_block >= own) continue;  // past the sequence's last query: no work
        w.m_start = m_block * BLOCK_M;
      }
      const SequenceRows kv_seq = Sequences::keys(params, b);
      w.q_row = int(q_seq.first) + w.m_start;
      w.kv_row = int(kv_seq.first);
      w.n_q = q_seq.length;
      w.n_kv = kv_seq.length;
      w.offset = varlen ? int(sequence_causal_offset(params, w.n_q, w.n_kv)) : int(offset);
      // The KV tiles [0, end) of all BLOCK_M rows (as step 16 counts them); from the first with a
      // masked element on, the element test. A window's range starts at `first`, and its tiles
      // before `first_full` are masked too.
      const TileRange range = MaskT::range(params, w.n_kv, w.offset, w.m_start, BLOCK_M, BLOCK_N);
      w.n_blocks = int(range.end) - (MaskT::kFromFirstKey ? 0 : int(range.first));
      if constexpr (!MaskT::kFromFirstKey) {
        w.first = int(range.first) + (kBack ? w.n_blocks - 1 : 0);
        w.first_full = int(range.first_full);
      }
      w.first_masked = int(range.end_full);
      return w;
    }
  };
  auto batch_of = [&](const Work& w) { return w.bh / int(params.heads_q); };
  auto head_of = [&](const Work& w) { return w.bh % int(params.heads_q); };
  auto map_batch = [&](const Work& w) { return varlen ? 0 : batch_of(w); };  // a packed map has one batch entry
  // Two entries: tile iter's is rewritten for tile iter + 2 only after Q of tile iter + 1 was
  // released, when every consumer is past tile iter's store.
  __shared__ Work scheduled[2];
  auto release_q = [&] { ptx::mbarrier_arrive(bar(q_empty)); };

  auto k_tile_of = [&](int pos) { return next_tile(kv_tiles, 2 * (pos % STAGES)); };
  auto v_tile_of = [&](int pos) { return next_tile(kv_tiles, 2 * (pos % STAGES) + 1); };
  // The producer's one thread: once the slot's previous use is released, the copies of KV tile
  // n_block of work tile w into ring position pos (rows past N_kv are outside the map: zeros).
  auto load_kv = [&](const Work& w, int n_block, int pos) {
    const int slot = pos % STAGES, use = pos / STAGES;
    if (use > 0) mbarrier_wait(bar(kv_empty[slot]), (use - 1) % 2);
    const int h_kv = int(kv_head_of(head_of(w), params.heads_q, params.heads_kv));
    const int row = (varlen ? w.kv_row : 0) + n_block * BLOCK_N;
    const int tile_bytes = KVLayout::bytes(BLOCK_N);  // whole panels, as the copy engine fills them
    ptx::mbarrier_arrive_expect_tx(bar(k_full[slot]), kSplitFull ? tile_bytes : 2 * tile_bytes);
    load_tile_tma(k_tile_of(pos), &maps.k, row, h_kv, map_batch(w), bar(k_full[slot]));
    if constexpr (kSplitFull) ptx::mbarrier_arrive_expect_tx(bar(v_full[slot]), tile_bytes);
    load_tile_tma(v_tile_of(pos), &maps.v, row, h_kv, map_batch(w), bar(kSplitFull ? v_full[slot] : k_full[slot]));
  };

  if (threadIdx.x == 0) {
    ptx::mbarrier_init(bar(q_full), 1);
    ptx::mbarrier_init(bar(q_empty), kWarpgroupThreads * Cfg::CONSUMERS);
    for (int stage = 0; stage < STAGES; ++stage) {
      ptx::mbarrier_init(bar(k_full[stage]), 1);
      if constexpr (kSplitFull) ptx::mbarrier_init(bar(v_full[stage]), 1);
      ptx::mbarrier_init(bar(kv_empty[stage]), 4 * Cfg::CONSUMERS);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();  // from here on, the roles meet only on mbarriers and named barriers

  // ---- the producer: per work tile, the first K/V tile, Q once released, then the rest.
  if (warpgroup == 0) {
    ptx::warpgroup_reg_dealloc<Cfg::PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      int pos = 0;   // ring position: K/V tiles this block has loaded so far
      int turn = 0;  // the scheduler's turns taken (iter counts those handed out)
      for (int iter = 0;; ++iter) {
        const Work w = work(turn);
        if (w.n_blocks > 0) load_kv(w, visited(w, 0), pos++);
        if (iter > 0) mbarrier_wait(bar(q_empty), (iter - 1) % 2);
        scheduled[iter % 2] = w;
        if (w.bh < 0) {  // no more tiles: the consumers learn it from q_full's next phase
          ptx::mbarrier_arrive(bar(q_full));
          break;
        }
        ptx::mbarrier_arrive_expect_tx(bar(q_full), QLayout::bytes(BLOCK_M));
        load_tile_tma(q_tile, &maps.q, w.q_row, head_of(w), map_batch(w), bar(q_full));
        for (int i = 1; i < w.n_blocks; ++i) load_kv(w, visited(w, i), pos++);
      }
    }
    return;
  }

  // ---- the consumers
  ptx::warpgroup_reg_alloc<Cfg::CONSUMER_REGS>();
  const int tile_row0 = (warp - 4) * ROWS_PER_WARP;  // the warp's first row in the block
  int pos = 0;
  for (int iter = 0;; ++iter) {
    mbarrier_wait(bar(q_full), iter % 2);
    const Work w = scheduled[iter % 2];
    if (w.bh < 0) break;
    const ScoreMod score_mod = ScoreMod::make(params, mods, batch_of(w), head_of(w));
    const int row0 = w.m_start + tile_row0;  // this warp's first query row

    // (16, O_COLS) fp32, unnormalised output: every column of V's panels (at D = 96, 32 columns of
    // zeros past the head dim's; device/warpgroup_tile.h's mma_pv_async)
    constexpr int O_COLS = KVLayout::kRowElems;
    Acc<O_COLS> o_i = zeros<O_COLS>();
    Rows m_i = rows(-INFINITY);  // running row max, raw score units
    Rows l_i = rows(0.0f);       // running row sum over this lane's columns

    // The softmax of the i-th visited S tile, lazily rescaled; says whether O must be rescaled by
    // alpha once the P·V in flight is done.
    auto softmax = [&](Acc<BLOCK_N>& s, int i, Rows& alpha) {
      const int n_block = visited(w, i);
      score_mod(s, row0, n_block * BLOCK_N);
      if (n_block >= w.first_masked || (!MaskT::kFromFirstKey && n_block < w.first_full)) {
        if constexpr (varlen) {
          // The sequence's length and diagonal read again where they are needed, the tile's first
          // row folded into the diagonal: kept in registers through the loop, they cost the 3- and
          // 4-consumer configurations a spill.
          const Work& seq = scheduled[iter % 2];
          apply_mask(s, tile_row0, n_block * BLOCK_N, MaskT::element(params, seq.n_kv, seq.offset + seq.m_start));
        } else {
          apply_mask(s, row0, n_block * BLOCK_N, MaskT::element(params, offset));
        }
      }
      const Rows m_new = row_max(s, m_i);
      const bool moved = any_max_moved(m_i, m_new, scale_log2, Cfg::RESCALE_THRESHOLD);
      if (moved) {
        alpha = rescale_factor(m_i, scale_log2, exp2_offset(m_new, scale_log2));
        l_i = l_i * alpha;
        m_i = m_new;
      }
      s = exp2_rows(s, scale_log2, exp2_offset(m_i, scale_log2));
      l_i = l_i + row_sum(s);
      return moved;
    };
    auto wait_k = [&](int q_pos) { mbarrier_wait(bar(k_full[q_pos % STAGES]), (q_pos / STAGES) % 2); };
    auto wait_v = [&](int q_pos) {  // K's wait covered V unless kSplitFull
      if constexpr (kSplitFull) mbarrier_wait(bar(v_full[q_pos % STAGES]), (q_pos / STAGES) % 2);
    };

    // ---- KV loop, pipelined by one tile: S_{j+1} = Q·K_{j+1}ᵀ issued before O += P_j·V_j.
    if (w.n_blocks > 0) {
      Acc<BLOCK_N> s;
      wait_k(pos);
      wgmma_begin(s);
      mma_qk_async(s, q_tile, wg_row0, k_tile_of(pos));
      ptx::wgmma_commit();
      wait_for<0>(s);
      if (w.n_blocks == 1) release_q();
      Rows alpha;
      if (softmax(s, 0, alpha)) rescale(o_i, alpha);
      FragA<BLOCK_N> p = to_a<T>(s);  // P in V's type
      for (int n_block = 1; n_block < w.n_blocks; ++n_block, ++pos) {
        Acc<BLOCK_N> s_next;
        wait_k(pos + 1);
        wgmma_begin(s_next, o_i, p);
        mma_qk_async(s_next, q_tile, wg_row0, k_tile_of(pos + 1));
        ptx::wgmma_commit();
        wait_v(pos);  // V may land after K: Q·Kᵀ of the next tile is already issued
        mma_pv_async(o_i, p, v_tile_of(pos));
        ptx::wgmma_commit();
        wait_for<1>(s_next);
        if (n_block + 1 == w.n_blocks) release_q();
        const bool moved_next = softmax(s_next, n_block, alpha);
        wait_for<0>(o_i, p);
        if (lane_id() == 0) ptx::mbarrier_arrive(bar(kv_empty[pos % STAGES]));
        if (moved_next) rescale(o_i, alpha);
        p = to_a<T>(s_next);
      }
      wait_v(pos);  // the last tile's V has landed: before the zeros below, and before P·V
      // A packed sequence's last V tile past its end: the neighbour's rows, zeroed by all the
      // consumers before any of them reads the tile.
      if constexpr (varlen) {
        const int tail = scheduled[iter % 2].n_kv - (w.n_blocks - 1) * BLOCK_N;  // keys of the tile that exist
        if (tail < BLOCK_N) {
          zero_rows(v_tile_of(pos), tail, int(threadIdx.x) - kWarpgroupThreads, kWarpgroupThreads * Cfg::CONSUMERS);
          ptx::fence_proxy_async_shared();  // the zeros, before wgmma (the async proxy) reads them
          ptx::named_barrier_sync(all_consumers_barrier<Cfg::CONSUMERS>(), kWarpgroupThreads * Cfg::CONSUMERS);
        }
      }
      wgmma_begin(o_i, p);
      mma_pv_async(o_i, p, v_tile_of(pos));
      ptx::wgmma_commit();
      wait_for<0>(o_i, p);
      if (lane_id() == 0) ptx::mbarrier_arrive(bar(kv_empty[pos % STAGES]));
      ++pos;
    }
    if (w.n_blocks == 0) release_q();

    // ---- normalise and store: the tile is read again from `scheduled` (registers are short).
    Rows l = quad_sum(l_i);
    score_mod.finish(o_i, m_i, l, params,
                     head_of(scheduled[iter % 2]));  // a sink's term in the denominator and the LSE
    const Work done = scheduled[iter % 2];
    Out<SmemTile<kWarpgroupRows, OLayout, T>, T> out;
    const int64_t b = batch_of(done), h = head_of(done);
    const SequenceRows q_seq{done.q_row - done.m_start, done.n_q};
    out.valid_rows = done.n_q - done.m_start;
    if constexpr (Epilogue::kSmemTile) {
      out.tile = {o_tiles + (warpgroup - 1) * kWarpgroupRows * OLayout::kRowElems};
      out.direct = varlen && out.valid_rows < wg_row0 + kWarpgroupRows;
      out.tile_row0 = tile_row0 - wg_row0;
      out.barrier = consumer_barrier(warpgroup);
      out.map = &o_map;
      out.map_row = done.q_row + wg_row0;
      out.head = int(h);
      out.batch = map_batch(done);
    }
    if constexpr (!Epilogue::kSmemTile || varlen) {
      out.o = static_cast<T*>(params.o) + sequence_offset(params.o_stride, b, q_seq, varlen) +
              h * params.o_stride.head + int64_t(done.m_start) * params.o_stride.seq;
      out.o_row_stride = params.o_stride.seq;
    }
    // (B, H_q, N_q), or with varlen (H_q, total_q)
    out.lse = params.lse != nullptr ? params.lse + lse_offset(params, b, h, q_seq, done.m_start, varlen) : nullptr;
    out.row0 = tile_row0;
    Epilogue::store(out, head_columns<HEAD_DIM>(o_i), m_i, l, scale_log2);
  }
  Epilogue::finish();
}

// Whether a configuration leaves out the one-modification kernel of Mods bits `bits` because it
// spills on sm_90 (8 to 40 bytes, D = 64's three and four consumers: softcap, one-sided ALiBi; 8
// bytes, D = 96's three: one-sided ALiBi): a call that would run it runs the two-consumer
// configuration of its head dim instead (ModsFallback). (The general ScoreMods kernel, whose cap
// and slope tests branch per tile, fits in all of them.)
template <int HEAD_DIM, typename Cfg>
constexpr bool mods_elsewhere(unsigned bits) {
  const bool alibi_one_sided = bits == (kAlibiMod | kOneSided);
  return Cfg::BLOCK_M > 128 &&
         ((HEAD_DIM <= 64 && (bits == kCapMod || alibi_one_sided)) || (HEAD_DIM == 96 && alibi_one_sided));
}
template <int HEAD_DIM>
using ModsFallback = std::conditional_t<HEAD_DIM <= 64, Config<128, 128, 4>, Config<128, 128, 3, RegisterStore>>;

// The host side of one configuration: the tuner calls Launcher::launch<HEAD_DIM, Cfg>, for every
// element type alike (the tuner's key holds the type, so each is timed on its own).
struct Launcher {
  template <int HEAD_DIM, typename Cfg>
  static Status launch(const AttentionParams& p, cudaStream_t stream) {
    return with_element_type<bf16, fp16>(p.dtype, [&]<typename T>() { return launch_as<T, HEAD_DIM, Cfg>(p, stream); });
  }

  template <typename T, int HEAD_DIM, typename Cfg>
  static Status launch_as(const AttentionParams& p, cudaStream_t stream) {
    // Packed sequences, a sliding window (WindowFlag: a range past tile 0, masked at both ends; not
    // with packed sequences, which the forward refuses: decode::route), or neither: a kernel each.
    // Score modifications (softcap, ALiBi, sinks; not with packed sequences, which the forward
    // refuses) theirs: WindowFlag, which takes any mask, and the Mods kernel of the call's
    // modification (kernels/score_mod.h: one alone its own, several ScoreMods); nullptr where this
    // configuration leaves that kernel out (mods_elsewhere): the call runs the two-consumer one.
    using Kernel = decltype(&attention_kernel<HEAD_DIM, Cfg, T, Packed>);
    if constexpr (Cfg::BLOCK_N == 80) {
      // 80-key tiles (D = 256) build the plain and the packed kernels alone: the window's and the
      // modifications' spill there (4 to 92 bytes on sm_90), so those calls run the 64-key tiles.
      if (p.cu_seqlens_q == nullptr && (p.has_score_mods() || p.has_window()))
        return launch_as<T, HEAD_DIM, Config<Cfg::BLOCK_M, 64, Cfg::STAGES, typename Cfg::Epilogue>>(p, stream);
    }
    const Kernel kernel = [&]() -> Kernel {
      if (p.cu_seqlens_q != nullptr) return attention_kernel<HEAD_DIM, Cfg, T, Packed>;
      if constexpr (Cfg::BLOCK_N == 80) {
        return attention_kernel<HEAD_DIM, Cfg, T, Batched>;  // (windows and modifications: above)
      } else {
        if (p.has_score_mods())
          return with_score_mods(p, [](auto m) -> Kernel {
            if constexpr (mods_elsewhere<HEAD_DIM, Cfg>(decltype(m)::kBits))
              return nullptr;
            else
              return attention_kernel<HEAD_DIM, Cfg, T, Batched, WindowFlag, decltype(m)>;
          });
        return p.has_window() ? attention_kernel<HEAD_DIM, Cfg, T, Batched, WindowFlag>
                              : attention_kernel<HEAD_DIM, Cfg, T, Batched>;
      }
    }();
    if constexpr (HEAD_DIM <= 64 || HEAD_DIM == 96)  // where mods_elsewhere leaves kernels out
      if (kernel == nullptr) return launch_as<T, HEAD_DIM, ModsFallback<HEAD_DIM>>(p, stream);
    constexpr int smem = Cfg::template smem_bytes<HEAD_DIM>();
    if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
    QkvTileMaps maps;  // Q in boxes of BLOCK_M rows, K and V of BLOCK_N (library/tma.h)
    if (Status st = make_qkv_tile_maps(&maps, p, Cfg::BLOCK_M, Cfg::BLOCK_N); !st.ok()) return st;
    // O in boxes of one consumer's rows; built for every configuration, so that what the kernel
    // accepts does not depend on the epilogue the tuner picks.
    CUtensorMap o_map;
    const bool packed = p.cu_seqlens_q != nullptr;  // varlen: O is (total_q, H_q, D)
    if (Status st = make_tile_map(&o_map, "o", p.o, packed ? 1 : p.batch, p.heads_q, packed ? p.total_q : p.seqlen_q,
                                  p.head_dim, p.o_stride, kWarpgroupRows, p.dtype);
        !st.ok())
      return st;
    int resident = 0;
    if (Status st = resident_blocks(reinterpret_cast<const void*>(kernel), Cfg::NUM_THREADS, smem, &resident); !st.ok())
      return st;
    dim3 grid;
    if (Status st = PersistentScheduler::grid({int(cdiv(p.seqlen_q, Cfg::BLOCK_M)), p.batch * p.heads_q, p.causal},
                                              resident, &grid);
        !st.ok())
      return st;
    kernel<<<grid, Cfg::NUM_THREADS, smem, stream>>>(p, forward_exp2_constant(p), p.causal_offset(), score_mod_args(p),
                                                     maps, o_map);
    FA_LAUNCH_RETURN();
    return Status::Ok();
  }
};

// Step 16's list, its measured order of preference per head dim (steps/16_tma_store/README.md), and
// Part VI's: D = 96 as D = 128's two (the tiles are two panels wide, O 128 columns: the same
// registers and shared memory, three quarters of Q·Kᵀ's wgmmas), D = 32 as D = 64's three (one
// panel, half used: half of Q·Kᵀ's); D = 192 and 256 two consumers with
// 64-key tiles (O alone is D / 2 registers a thread; with the next tile's S issued before P·V,
// 128-key tiles would not fit 240), 2 or 3 stages.
const tuner::Tuner kTuner(
    kProductionHopper, FA_BUILD_ID,
    configs<Launcher>(At<64, Config<256, 64, 5>>{},                    // 4 consumers, 5 tiles in flight
                      At<64, Config<192, 128, 4>>{},                   // 3 consumers, 128-key tiles
                      At<64, Config<128, 128, 4>>{},                   // 2 consumers, 128-key tiles
                      At<128, Config<192, 64, 4>>{},                   // 3 consumers at 160 registers
                      At<128, Config<128, 128, 3, RegisterStore>>{},   // 2 at 240, O from registers
                      At<32, Config<256, 64, 5>>{},                    // Part VI: as D = 64
                      At<32, Config<192, 128, 4>>{},                   //
                      At<32, Config<128, 128, 4>>{},                   //
                      At<96, Config<192, 64, 4>>{},                    // Part VI: as D = 128
                      At<96, Config<128, 128, 3, RegisterStore>>{},    //
                      At<192, Config<128, 64, 2>>{},                   // Part VI: 2 consumers, 64-key tiles
                      At<192, Config<128, 64, 3, RegisterStore>>{},    //
                      At<256, Config<128, 64, 2, RegisterStore>>{},    // 193 KB: O from registers
                      At<256, Config<128, 80, 2, RegisterStore>>{}));  // 225 KB: 80-key tiles

const Capabilities kCaps = [] {
  Capabilities c = forward_caps({32, 64, 96, 128, 192, 256});
  c.only_sm = 90;                           // wgmma: sm_90a code, compute capability 9.0 only
  c.broadcast = false;                      // TMA maps step every dimension: no zero strides
  c.tma = true;                             // 32-bit coordinates, 40-bit byte strides
  c.max_work_tiles = kMaxWorkTiles;         // the persistent grid's 32-bit tile counter,
  c.work_tile_rows = kTuner.min_block_m();  // counted in the smallest tiles any configuration takes
  c.deterministic_backward = true;          // its backward: the Hopper one (kernels/bwd_hopper.cu)
  c.backward_head_dims = forward_caps({32, 64, 96, 128, 192, 256}).head_dims;  // at 32 to 128, the
                                                                               // mma.sync one at 192, 256
  c.split_kv = true;    // decode calls: the decode kernel splits their keys (kernels/fwd_decode.cu)
  c.seqlens_kv = true;  // ... and reads a length per sequence
  c.paged_kv = true;    // ... a paged cache
  c.kv_append = true;   // appends to the cache in the call (the decode kernel)
  c.varlen = true;      // packed sequences (cu_seqlens): decode-sized ones the decode
                        // kernel, longer ones this one
  c.decode_max_packed_rows = kDecodeMaxPackedRows;  // ... for the calls it takes (validation says so)
  c.dtypes = built_dtypes();                        // bf16, and fp16 where the build compiles it;
  c.decode_dtypes = decode::dtypes();               // the decode kernel's: the same types
  c.sliding_window = true;                          // window_size: WindowFlag's kernels (forward and backward)
  c.softcap = c.alibi = c.sinks = true;  // ScoreMods' kernels (kernels/score_mod.h), forward and backward, and
                                         // the decode kernel's; long packed sequences refused (decode::route)
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;  // its last rule: sm_90a code on a GPU that runs it
  bool decode = false;  // a call of a few rows per group: the decode kernel (kernels/fwd_decode.cu)
  if (Status st = decode::route(p, stream, &decode, /*prefill_varlen=*/true); decode || !st.ok()) return st;
  return kTuner.run(p, stream);
}

// Its backward: the Hopper backward at its head dims (32 to 128); at 192 and 256, which it lacks,
// the mma.sync backward (kernels/bwd_mma.cu, 64-key blocks there), as kernel 100's.
Status backward(const BackwardParams& bp, cudaStream_t stream) {
  return bp.fwd.head_dim > 128 ? bwd::backward(bp, stream) : bwd_hopper::backward(bp, stream);
}

// What runs call p: the decode kernel's configuration for the calls it takes, else the tuner's.
std::string describe(const AttentionParams& p) {
  return decode::describe(p, kTuner.describe(p), /*prefill_varlen=*/true);
}

FA_REGISTER_STEP({kProductionHopper, "kernel_hopper", /*base=*/16,
                  "the production forward on Hopper: step 16 with its mask, score hook, scheduler and epilogue "
                  "as policies",
                  kCaps, &forward, "", &backward, &describe})

}  // namespace fa::kernels::hopper
