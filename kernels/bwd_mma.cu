// The production backward on mma.sync (any sm_80+ GPU), generalised from step 23 (128 keys per
// block, 8 warps in FlashAttention-2's arrangement with Pᵀ and dSᵀ shared through shared memory,
// two stages of Q/dO/LSE/D in flight, dQ through fp32 vector atomics on sm_90, the deterministic
// mode's turnstiles with the Q tiles walked down). Not a lesson: the steps
// never include it. Both production kernels register it as their backward (kernels/fwd_mma.cu,
// kernels/fwd_hopper.cu) until a Hopper backward exists. What the lesson hard-wired is a policy:
//
//   Mask      which Q tiles see a KV tile, and the element test the backward re-applies
//             (kernels/mask.h): by default the call's causal flag, either alignment, as the steps.
//
// With the default policy it computes what step 23 computes with step 23's instructions
// (static.kernels.bwd_mma.same_as_step23 compares the counts).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "device/backward_tile.h"
#include "device/mask.h"
#include "device/ptx/cp_async.h"
#include "device/ptx/sync.h"
#include "device/q_tile_walk.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "fa/registry.h"
#include "kernels/backward.h"
#include "kernels/kernels.h"
#include "kernels/launch.h"
#include "kernels/mask.h"
#include "kernels/score_mod.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"

namespace fa::kernels::bwd {
namespace {

using namespace fa::tile;
using fa::ptx::cp_async_commit;
using fa::ptx::cp_async_wait;

// 1. The preprocess (D and the LSE in exp2 units) and 3. the convert: kernels/backward.h.

// One backward configuration: BLOCK_M queries per Q tile, BLOCK_N keys per block, Q tiles in
// flight (STAGES: the current one and the next). The 8 warps tile the block's work three ways:
//   Sᵀ, dPᵀ (BLOCK_N keys × BLOCK_M queries): 4 warps down the keys × 2 across the queries, each
//      a (32, BLOCK_M / 2) block;
//   dV, dK (BLOCK_N keys × HEAD_DIM): 4 warps down the keys × 2 across D, each (32, HEAD_DIM / 2),
//      from Pᵀ and dSᵀ in shared memory (a warp needs every query of its keys' rows, and computed
//      only half of them);
//   dQ (BLOCK_M queries × HEAD_DIM): the 16-row tiles of the Q tile × slices of D, as in step 22.
// dK and dV stay in registers: (32, HEAD_DIM / 2) fp32 each, HEAD_DIM / 2 floats a thread each (128
// together at D = 128, as in step 22: the same keys per block, split across D instead). At D = 192
// and 256 (Part VI) a block has 64 keys, 16 a warp: (16, HEAD_DIM / 2) each, 96 and 128 together.
template <int BLOCK_M_, int BLOCK_N_>
struct BwdConfig {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int NUM_WARPS = 8;
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static constexpr int KEY_WARPS = 4;                        // warps down the keys (scores, dK, dV)
  static constexpr int KEYS_PER_WARP = BLOCK_N / KEY_WARPS;  // 32 (16 at D = 192, 256)
  static constexpr int KEY_TILES = KEYS_PER_WARP / 16;       // the warp's 16-key row tiles
  static constexpr int QUERY_WARPS = NUM_WARPS / KEY_WARPS;  // warps across the queries of Sᵀ: 2
  static constexpr int QUERIES_PER_WARP = BLOCK_M / QUERY_WARPS;
  static_assert((KEYS_PER_WARP == 32 || KEYS_PER_WARP == 16) && QUERIES_PER_WARP % 16 == 0,
                "each warp's score block is (16 or 32, 16·n)");
  // Pᵀ and dSᵀ, (BLOCK_N keys, BLOCK_M queries): swizzled rows need 64 columns or more; 32 are
  // padded by 16 bytes, which keeps ldmatrix and the 4-byte stores free of bank conflicts too.
  using PtLayout = std::conditional_t<BLOCK_M % 64 == 0, SwizzledLayout<BLOCK_M>, PaddedLayout<BLOCK_M>>;
  static constexpr int D_SPLITS = NUM_WARPS / KEY_WARPS;  // warps across D for dK and dV: 2
  // dQ = dS·K: the block's BLOCK_M query rows in 16-row tiles, the warps split over the row tiles
  // and, if there are more warps than row tiles, over column slices of D.
  static constexpr int ROW_TILES = BLOCK_M / 16;
  static constexpr int COL_SPLITS = NUM_WARPS / ROW_TILES;
  static_assert(NUM_WARPS % ROW_TILES == 0, "whole row tiles per warp");
  static constexpr int STAGES = 2;
  // Shared memory: K, V (BLOCK_N, D), STAGES × [Q, dO] (BLOCK_M, D), Pᵀ and dSᵀ (BLOCK_N, BLOCK_M),
  // T (16 bits); then STAGES × [the Q tile's LSE (exp2 units), D], fp32. dS for dQ is dSᵀ read transposed
  // (load_a_trans), not a third tile.
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return MmaTileLayout<HEAD_DIM>::bytes(2 * BLOCK_N + STAGES * 2 * BLOCK_M) + 2 * PtLayout::bytes(BLOCK_N) +
           STAGES * 2 * BLOCK_M * int(sizeof(float));
  }
};

// 2. The main kernel: grid = (KV tiles, B·H_kv). DETERMINISTIC: every Q tile's dQ additions are
// made block by block in the order of the KV tiles, through that tile's turnstile.
template <int HEAD_DIM, typename Cfg, bool DETERMINISTIC, typename MaskT, typename ScoreMod, typename T>
__device__ __forceinline__ void backward_blocks(const BackwardParams& bp, const float* delta, const float* lse2,
                                                float* dq_accum, int* turnstiles, const float scale_log2,
                                                const int64_t offset, const ScoreModArgs& mods) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, NUM_THREADS = Cfg::NUM_THREADS;
  constexpr int DQ_COLS = HEAD_DIM / Cfg::COL_SPLITS;  // the columns of dQ one warp computes
  constexpr int KV_COLS = HEAD_DIM / Cfg::D_SPLITS;    // the columns of dK and dV one warp keeps
  constexpr int WK = Cfg::KEYS_PER_WARP, WQ = Cfg::QUERIES_PER_WARP, KT = Cfg::KEY_TILES;
  using Layout = MmaTileLayout<HEAD_DIM>;   // D = 32 and 96: padded rows (Part VI)
  using PtLayout = typename Cfg::PtLayout;  // Pᵀ and dSᵀ: rows are keys
  const AttentionParams& params = bp.fwd;
  extern __shared__ uint4 smem[];
  const SmemTile<BLOCK_N, Layout, T> k_tile{reinterpret_cast<T*>(smem)};  // (BLOCK_N, HEAD_DIM)
  const SmemTile<BLOCK_N, Layout, T> v_tile = next_tile(k_tile, 1);       // (BLOCK_N, HEAD_DIM)
  constexpr int STAGES = Cfg::STAGES;
  const SmemTile<BLOCK_M, Layout, T> qdo_tiles{v_tile.ptr + BLOCK_N * Layout::kRowElems};  // STAGES × [Q, dO]
  const SmemTile<BLOCK_N, PtLayout, T> pt_tile{qdo_tiles.ptr + STAGES * 2 * BLOCK_M * Layout::kRowElems};  // Pᵀ
  const SmemTile<BLOCK_N, PtLayout, T> dst_tile = next_tile(pt_tile, 1);                                   // dSᵀ
  float* const lse_d_tiles =
      reinterpret_cast<float*>(dst_tile.ptr + BLOCK_N * PtLayout::kRowElems);  // STAGES × [LSE, D]

  const int warp = int(threadIdx.x) / 32;
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);

  // ---- pointers: this block's KV tile of (batch b, KV head h_kv).
  const int n_start = int(blockIdx.x) * BLOCK_N;
  const int64_t b = blockIdx.y / params.heads_kv, h_kv = blockIdx.y % params.heads_kv;
  const T* k_ptr = static_cast<const T*>(params.k) + b * params.k_stride.batch + h_kv * params.k_stride.head +
                   int64_t(n_start) * params.k_stride.seq;
  const T* v_ptr = static_cast<const T*>(params.v) + b * params.v_stride.batch + h_kv * params.v_stride.head +
                   int64_t(n_start) * params.v_stride.seq;
  // This warp's blocks: keys [key0, key0 + WK) (scores, dK, dV); queries [WQ·q_warp, +WQ) of the
  // Q tile (scores); columns [d0, d0 + KV_COLS) of dK and dV.
  const int k_warp = warp % Cfg::KEY_WARPS, q_warp = warp / Cfg::KEY_WARPS;
  const int key_row0 = k_warp * WK, key0 = n_start + key_row0, d0 = q_warp * KV_COLS;

  // The Q tiles that see some key of this KV tile, [m_first, m_end): from the mask's first to the last
  // (a window's end before the last Q tile).
  const QTileSpan q_span = MaskT::q_tile_span(params, offset, n_start, BLOCK_N, BLOCK_M);
  const int m_first = int(q_span.first), m_end = int(q_span.end);

  // ---- load K and V once; they stay in shared memory for every Q tile.
  const int kv_rows = min(BLOCK_N, n_kv - n_start);
  load_tile_async<NUM_THREADS>(k_tile, k_ptr, params.k_stride.seq, kv_rows);
  load_tile_async<NUM_THREADS>(v_tile, v_ptr, params.v_stride.seq, kv_rows);
  cp_async_commit();

  // ---- init state: dK and dV of the warp's WK keys × KV_COLS columns, KT 16-row tiles each, fp32.
  Acc<KV_COLS> dk[KT], dv[KT];
#pragma unroll
  for (int r = 0; r < KT; ++r) dk[r] = zeros<KV_COLS>(), dv[r] = zeros<KV_COLS>();

  // ---- the work items: every (query head of the group, Q tile from m_first on), one flat list in
  // that order; item t's Q, dO, LSE and D go to stage t % STAGES. An item is (hq, m_block), the
  // next one the following Q tile or the next head's first (no division in the loop).
  const int group = int(params.heads_q / params.heads_kv);
  const QTileWalk walk{m_first, m_end, /*down=*/DETERMINISTIC};  // step 22: deterministic, last tile first
  const int items = group * walk.count();
  // Issues the copies of item t = (hq, m_block) into its stage (kernels/backward.h).
  auto load_item = [&](int t, int hq, int m_block) {
    bwd_common::load_work_item<NUM_THREADS>(bp, b, h_kv * group + hq, m_block, next_tile(qdo_tiles, 2 * (t % STAGES)),
                                            next_tile(qdo_tiles, 2 * (t % STAGES) + 1),
                                            lse_d_tiles + (t % STAGES) * 2 * BLOCK_M, lse2, delta);
  };

  // ---- prologue: K and V were committed above; item 0 joins them.
  if (items > 0) load_item(0, 0, walk.tile(m_first));
  cp_async_commit();

  for (int t = 0, hq = 0, k = m_first; t < items; ++t) {
    const int m_block = walk.tile(k);
    const int64_t bh = b * params.heads_q + h_kv * group + hq;
    const int m_start = m_block * BLOCK_M;
    const SmemTile<BLOCK_M, Layout, T> q_tile = next_tile(qdo_tiles, 2 * (t % STAGES));
    const SmemTile<BLOCK_M, Layout, T> do_tile = next_tile(qdo_tiles, 2 * (t % STAGES) + 1);
    const float* const lse2_tile = lse_d_tiles + (t % STAGES) * 2 * BLOCK_M;
    const float* const delta_tile = lse2_tile + BLOCK_M;
    cp_async_wait<0>();  // item t's copies (and, at t = 0, K and V) have landed ...
    __syncthreads();     // ... for every thread; and every warp is done with item t − 1's stage
    // Item t + 1 starts flying into the other stage while item t computes.
    if (++k == m_end) k = m_first, ++hq;  // (hq, walk.tile(k)) is item t + 1 from here on
    if (t + 1 < items) load_item(t + 1, hq, walk.tile(k));
    cp_async_commit();

    // Sᵀ = K_w·Q_wᵀ and dPᵀ = V_w·dO_wᵀ: the warp's WK keys against its WQ queries, KT 16-key row
    // tiles each, so every Q (dO) fragment feeds each row tile.
    // At D = 192 and 256 K and V opaque in each item (device/smem_tile.h): their lane addresses
    // computed where they are used, not held across the loop in registers that dK and dV (96 and 128
    // floats a thread) leave too few of (held, the window kernels spilled 4-8 bytes on sm_80).
    const SmemTile<BLOCK_N, Layout, T> k_it = [&] {
      if constexpr (HEAD_DIM > 128)
        return opaque(k_tile);
      else
        return k_tile;
    }();
    const SmemTile<BLOCK_N, Layout, T> v_it = next_tile(k_it, 1);
    const int q0 = m_start + q_warp * WQ;  // the warp's first query
    const SmemTile<WQ, Layout, T> q_rows = row_block<WQ>(q_tile, q_warp), do_rows = row_block<WQ>(do_tile, q_warp);
    Acc<WQ> s[KT];
    mma_qk_tiles(s, k_it, key_row0, q_rows);
    // The score modifications the forward applied (kernels/score_mod.h), on the same scores: the
    // query head's ALiBi slope, the cap.
    const ScoreMod score_mod = ScoreMod::make(params, mods, b, bh - b * params.heads_q);
#pragma unroll
    for (int r = 0; r < KT; ++r) score_mod.transposed(s[r], key0 + 16 * r, q0);
    // The mask, transposed (rows are keys): queries past N_q and whatever the policy hides get
    // −inf, so that their P is 0; only on a warp block that is not fully visible.
    if (MaskT::block_masked(params, int(offset), q0, WQ, key0, WK)) {
      const auto visible = MaskT::element(params, offset);  // (query, key) -> visible, keys past N_kv included
#pragma unroll
      for (int r = 0; r < KT; ++r)
        apply_mask(s[r], key0 + 16 * r, q0, [=](int key, int query) { return (query < n_q) & visible(query, key); });
    }
    // Pᵀ from the stored LSE, in place of Sᵀ before dPᵀ is computed: the scores and dPᵀ are never
    // live together (with both, D = 128's deterministic kernel spilled).
#pragma unroll
    for (int r = 0; r < KT; ++r) s[r] = exp2_cols(s[r], scale_log2, lse2_tile + q_warp * WQ);
    Acc<WQ> dp[KT];
    mma_qk_tiles(dp, v_it, key_row0, do_rows);
#pragma unroll
    for (int r = 0; r < KT; ++r) {
      const Acc<WQ>& p = s[r];
      // dSᵀ = Pᵀ ∘ (dPᵀ − D), times the cap's derivative under ScoreMods (its slope read again: held
      // from the scores to here, it spilled).
      const Acc<WQ> ds =
          ScoreMod::reload(params, mods, b, bh - b * params.heads_q)
              .ds_transposed(p, dp[r], delta_tile + q_warp * WQ, lse2_tile + q_warp * WQ, key0 + 16 * r, q0);
      // Both to shared memory as they are, (keys, queries): the products below need every query
      // of a key's row, and this warp computed only WQ of them.
      store_tile_rows(pt_tile, p, key_row0 + 16 * r, q_warp * WQ);
      store_tile_rows(dst_tile, ds, key_row0 + 16 * r, q_warp * WQ);
    }
    __syncthreads();  // Pᵀ and dSᵀ of the whole block are in shared memory

    // dV += Pᵀ·dO and dK += dSᵀ·Q (times c at the end): the warp's WK keys (A fragments of Pᵀ and
    // dSᵀ, all BLOCK_M queries) on its KV_COLS columns of dO and Q.
    {
      FragA<BLOCK_M> a[KT];
#pragma unroll
      for (int r = 0; r < KT; ++r) a[r] = load_a<BLOCK_M>(pt_tile, key_row0 + 16 * r);
      mma_pv_rows<KT>(dv, a, do_tile, d0);
#pragma unroll
      for (int r = 0; r < KT; ++r) a[r] = load_a<BLOCK_M>(dst_tile, key_row0 + 16 * r);
      mma_pv_rows<KT>(dk, a, q_tile, d0);
    }

    // dQ += dS·K: each warp takes 16 query rows of dS (dSᵀ read transposed) and a slice of D, and
    // adds c · dS·K into the fp32 accumulator.
    // In two halves of the keys: half the A fragments live at a time. At D = 256 the warp's 64
    // columns in two chunks of 32, each added before the next is computed: with all 64 live beside
    // dK and dV, the window and score-modification kernels spilled at 255 registers.
    constexpr int DQ_CHUNK = HEAD_DIM > 128 && DQ_COLS % 32 == 0 ? 32 : DQ_COLS;
    const int row_tile = warp / Cfg::COL_SPLITS, col0 = (warp % Cfg::COL_SPLITS) * DQ_COLS;
    auto dq_chunk = [&](int c0) {
      Acc<DQ_CHUNK> dq = zeros<DQ_CHUNK>();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const FragA<BLOCK_N / 2> ds_rows =
            load_a_trans<BLOCK_N / 2>(row_block<BLOCK_N / 2>(dst_tile, h), row_tile * 16);
        mma_pv_cols(dq, ds_rows, row_block<BLOCK_N / 2>(k_it, h), c0);
      }
      return dq;
    };
    // Deterministic: wait for this block's turn on the Q tile (its KV tile number, counted from the
    // first KV tile that sees the Q tile: 0 but under a window), add, pass it on. The turnstiles a
    // head has are computed here, not held across the loop (held, D = 96's window kernels spilled).
    // Two adjacent columns per atomic: dQ's accumulator rows are HEAD_DIM floats from the start of
    // the workspace (16-byte aligned, validated) and every chunk's first column is a multiple of 16,
    // so every pair is 8-byte aligned.
    auto add = [&](const Acc<DQ_CHUNK>& dq, int c0) {
      atomic_add_rows_x2(dq_accum + (bh * n_q + m_start) * HEAD_DIM, HEAD_DIM, dq, scale_log2 / kLog2e, row_tile * 16,
                         c0, n_q - m_start);
    };
    auto turn = [&] {
      const int64_t turnstiles_per_head = (n_q + kBackwardTurnstileRows - 1) / kBackwardTurnstileRows;
      return bwd_common::DqTurn<DETERMINISTIC>{
          turnstiles + bh * turnstiles_per_head + m_start / int(kBackwardTurnstileRows),
          int(blockIdx.x) - int(MaskT::kv_tile_first(params, offset, m_start, BLOCK_M, BLOCK_N))};
    };
    if constexpr (DQ_CHUNK == DQ_COLS) {
      const Acc<DQ_COLS> dq = dq_chunk(col0);
      const auto t_dq = turn();
      t_dq.wait();
      add(dq, col0);
      t_dq.pass();
    } else {
      const auto t_dq = turn();
      t_dq.wait();
#pragma unroll
      for (int c = 0; c < DQ_COLS / DQ_CHUNK; ++c) add(dq_chunk(col0 + c * DQ_CHUNK), col0 + c * DQ_CHUNK);
      t_dq.pass();
    }
  }
  cp_async_wait<0>();  // a block with no work item still has K and V in flight: let them land

  // ---- store: dK = c · Σ dSᵀ·Q and dV, in T, rows past N_kv not written.
  T* dk_ptr =
      static_cast<T*>(bp.dk) + b * bp.dk_stride.batch + h_kv * bp.dk_stride.head + int64_t(n_start) * bp.dk_stride.seq;
  T* dv_ptr =
      static_cast<T*>(bp.dv) + b * bp.dv_stride.batch + h_kv * bp.dv_stride.head + int64_t(n_start) * bp.dv_stride.seq;
#pragma unroll
  for (int r = 0; r < KT; ++r) {
    store_rows(dk_ptr + d0, bp.dk_stride.seq, dk[r], rows(scale_log2 / kLog2e), key_row0 + 16 * r, kv_rows);
    store_rows(dv_ptr + d0, bp.dv_stride.seq, dv[r], rows(1.0f), key_row0 + 16 * r, kv_rows);
  }
}

// Whether this pass compiles sm_90 code (or the host's): at D = 256 the kernel is built there alone.
// On sm_80 its dK and dV (128 floats a thread) left the window and score-modification kernels 4-16
// bytes of spill at 255 registers, whatever was tried (dQ in 32- and 16-column chunks, K and V
// opaque in the loop); the call is refused there by name (backward()), not run slowly.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kSm90Code = false;
#else
constexpr bool kSm90Code = true;
#endif
FA_HD constexpr bool built_here(int head_dim) {
  return head_dim < 256 || kSm90Code;
}

// T: the element type of Q, K, V, O, dO and the gradients: bf16, or fp16 where the build compiles it (FA_DTYPES).
template <int HEAD_DIM, typename Cfg, bool DETERMINISTIC, typename MaskT = CausalFlag, typename ScoreMod = Identity,
          typename T = bf16>
__global__ void __launch_bounds__(Cfg::NUM_THREADS)
    backward_kernel(const BackwardParams bp, const float* delta, const float* lse2, float* dq_accum, int* turnstiles,
                    const float scale_log2, const int64_t offset, const ScoreModArgs mods) {
  if constexpr (built_here(HEAD_DIM))
    backward_blocks<HEAD_DIM, Cfg, DETERMINISTIC, MaskT, ScoreMod, T>(bp, delta, lse2, dq_accum, turnstiles, scale_log2,
                                                                      offset, mods);
}

template <int HEAD_DIM, typename Cfg, typename MaskT, typename ScoreMod, typename T>
Status launch_backward(const BackwardParams& bp, cudaStream_t stream) {
  const AttentionParams& p = bp.fwd;
  // Shared memory first, before anything is written: at D = 128 a block needs 104.5 KB, more than
  // GPUs of compute capability 8.6 and 8.9 give one (99 KB), and there the call is refused as
  // unsupported, so that the library's choice moves on to a kernel that fits.
  constexpr int smem = Cfg::template smem_bytes<HEAD_DIM>();
  const auto kernel = bp.deterministic ? backward_kernel<HEAD_DIM, Cfg, true, MaskT, ScoreMod, T>
                                       : backward_kernel<HEAD_DIM, Cfg, false, MaskT, ScoreMod, T>;
  // D = 256: sm_90 code on an sm_90 GPU alone (kSm90Code; early_launch_allowed asks exactly that).
  if (HEAD_DIM == 256 && !early_launch_allowed(reinterpret_cast<const void*>(kernel)))
    return Status::Unsupported(
        "the mma.sync backward at head dim 256 runs on sm_90 GPUs built for sm_90 only (elsewhere its "
        "registers spill); this GPU or this build has no such code");
  if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
  return bwd_common::run<HEAD_DIM, T>(bp, stream, [&](const bwd_common::Buffers& w) {
    const dim3 grid(unsigned(cdiv(p.seqlen_kv, Cfg::BLOCK_N)), unsigned(p.batch * p.heads_kv));
    kernel<<<grid, Cfg::NUM_THREADS, smem, stream>>>(bp, w.delta, w.lse2, w.dq_accum, w.turnstiles, scale_log2(p),
                                                     p.causal_offset(), score_mod_args(p));
    FA_LAUNCH_RETURN();
    return Status::Ok();
  });
}

}  // namespace

Capabilities backward_caps() {
  Capabilities c = forward_caps({32, 64, 96, 128, 192, 256});
  c.dtypes = built_dtypes();             // the forwards' types: bf16, and fp16 where the build has it
  c.deterministic_backward = true;       // BackwardParams::deterministic: dQ added in a fixed order
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
  if (Status st = bwd_common::check_backward_grids(bp.fwd); !st.ok()) return st;
  if constexpr (head_dim_built(32))  // Part VI: D = 64's tiles (dK, dV: 16 floats a thread each)
    if (bp.fwd.head_dim == 32) return launch_for<32, BwdConfig<64, 128>>(bp, stream);
  if constexpr (head_dim_built(64))
    if (bp.fwd.head_dim == 64) return launch_for<64, BwdConfig<64, 128>>(bp, stream);
  if constexpr (head_dim_built(96))  // Part VI: 64-query tiles, so that dQ's slices are 48 columns
    if (bp.fwd.head_dim == 96) return launch_for<96, BwdConfig<64, 128>>(bp, stream);
  if constexpr (head_dim_built(128))
    if (bp.fwd.head_dim == 128) return launch_for<128, BwdConfig<32, 128>>(bp, stream);
  // Part VI: 64 keys a block (16 a warp), so that dK and dV fit the registers (96 and 128 floats a
  // thread together), and 32-query tiles, so that shared memory holds two stages of Q and dO (110 and
  // 136 KB: an A100's 163 too).
  if constexpr (head_dim_built(192))
    if (bp.fwd.head_dim == 192) return launch_for<192, BwdConfig<32, 64>>(bp, stream);
  if constexpr (head_dim_built(256))
    if (bp.fwd.head_dim == 256) return launch_for<256, BwdConfig<32, 64>>(bp, stream);
  return Status::Unsupported("the production backward has no kernel at head dim " + std::to_string(bp.fwd.head_dim));
}

}  // namespace fa::kernels::bwd
