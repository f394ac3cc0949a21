// The production forward on mma.sync (any sm_80+ GPU), generalised from step 10 (lazy rescaling,
// 32 query rows per warp, a cp.async ring). Not a lesson: the steps never include it. What the
// lesson hard-wired is a policy here:
//
//   Mask      which KV tiles a Q tile visits and which need the element test (kernels/mask.h):
//             by default the call's causal flag (either alignment) at run time, as step 10; a
//             sliding window is one more policy, with masked tiles at both ends of the range.
//   ScoreMod  a hook on each score tile before the row max, and on each row before the store
//             (kernels/score_mod.h): Identity (no instruction), or the call's softcap, ALiBi and sinks.
//   Scheduler which Q tile and (batch, head) a block works on (Grid: one block per tile, the
//             longest causal tiles first).
//   Epilogue  how O and LSE leave (RegisterStore: 16-bit pairs from the accumulators).
//
// And the element type T of Q, K, V and O: bf16, as step 10, or fp16 where the build compiles it
// (FA_DTYPES). T is the shared tiles' type, from which the products take their instruction
// (mma.sync's .bf16 or .f16), P's and O's rounding; the softmax in fp32 is the same for both.
//
// With the default policies it computes what step 10 computes, with step 10's instructions per KV
// tile (static.kernels.mma checks the HMMA count and that nothing spills; the bf16 instantiations
// are step 10's instructions, static.kernels.mma.same_as_step10).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "device/mask.h"
#include "device/ptx/cp_async.h"
#include "device/smem_tile.h"
#include "device/warp_tile.h"
#include "fa/registry.h"
#include "kernels/epilogue.h"
#include "kernels/kernels.h"
#include "kernels/launch.h"
#include "kernels/mask.h"
#include "kernels/scheduler.h"
#include "kernels/score_mod.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/split_kv.h"
#include "library/tuner.h"

namespace fa::kernels::mma {
namespace {

using namespace fa::tile;
using fa::ptx::cp_async_commit;
using fa::ptx::cp_async_wait;

constexpr int kWarpSize = 32;
constexpr int kMmaRows = 16;  // rows of one m16n8k16 tile

// One kernel configuration: query rows per block, keys per K/V tile, K/V tiles in flight, and
// 16-row mma tiles per warp (step 10's 2; 1 where a warp's O would not fit its registers at 32 rows:
// D = 192 and 256, whose (16, D) fp32 O alone is D / 2 registers a thread; and two of D = 96's
// configurations, 8 or 4 warps of 16 rows with 64-key tiles).
template <int BLOCK_M_, int BLOCK_N_, int STAGES_, int M_TILES_ = 2>
struct Config {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int STAGES = STAGES_;
  static constexpr const char* VARIANT = "";                // nothing but the sizes tells two configurations apart
  static constexpr int M_TILES = M_TILES_;                  // 16-row mma tiles per warp
  static constexpr int ROWS_PER_WARP = kMmaRows * M_TILES;  // each warp owns 32 query rows (16 with one tile)
  static constexpr int NUM_WARPS = BLOCK_M / ROWS_PER_WARP;
  static constexpr int NUM_THREADS = NUM_WARPS * kWarpSize;
  // Rescale only when a row's max rose by more than this (exp2 units): P <= 2^8 until then.
  static constexpr float RESCALE_THRESHOLD = 8.0f;
  // Shared memory: the Q tile, then STAGES × (K tile, V tile), all (rows, HEAD_DIM) 16-bit (MmaTileLayout:
  // step 08's swizzle, or step 04's padded rows at D = 32, 96, 192).
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return MmaTileLayout<HEAD_DIM>::bytes(BLOCK_M + STAGES * 2 * BLOCK_N);
  }
};

// ---- the kernel --------------------------------------------------------------------------------

// T: the element type of Q, K, V and O (bf16 or fp16).
template <int HEAD_DIM, typename Cfg, typename T, typename MaskT = CausalFlag, typename ScoreMod = Identity,
          typename Scheduler = GridScheduler, typename Epilogue = RegisterStore>
__global__ void __launch_bounds__(Cfg::NUM_THREADS)
    attention_kernel(const AttentionParams params, const float scale_log2, const int64_t offset,
                     const ScoreModArgs mods) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, NUM_THREADS = Cfg::NUM_THREADS;
  constexpr int STAGES = Cfg::STAGES, M_TILES = Cfg::M_TILES, ROWS_PER_WARP = Cfg::ROWS_PER_WARP;
  using Layout = MmaTileLayout<HEAD_DIM>;
  extern __shared__ uint4 smem[];  // uint4: 16-byte aligned, as cp.async and ldmatrix need
  const SmemTile<BLOCK_M, Layout, T> q_tile{reinterpret_cast<T*>(smem)};                 // (BLOCK_M, HEAD_DIM)
  const SmemTile<BLOCK_N, Layout, T> kv_ring{q_tile.ptr + BLOCK_M * Layout::kRowElems};  // STAGES × [K, then V]

  const int warp = int(threadIdx.x) / kWarpSize;
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);

  // ---- pointers: 64-bit offsets, every tensor through its own strides.
  const Tiles tiles{int(cdiv(n_q, BLOCK_M)), params.batch * params.heads_q, MaskT::longest_first(params)};
  const typename Scheduler::Work work = Scheduler::work(tiles, 0);
  if (work.bh >= params.batch * params.heads_q) return;  // the few spare blocks of the last z slice
  const int64_t b = work.bh / params.heads_q, h = work.bh % params.heads_q;
  const int64_t h_kv = kv_head_of(h, params.heads_q, params.heads_kv);
  const int m_start = work.m_block * BLOCK_M;
  const T* q_ptr = static_cast<const T*>(params.q) + b * params.q_stride.batch + h * params.q_stride.head +
                   int64_t(m_start) * params.q_stride.seq;
  const T* k_ptr = static_cast<const T*>(params.k) + b * params.k_stride.batch + h_kv * params.k_stride.head;
  const T* v_ptr = static_cast<const T*>(params.v) + b * params.v_stride.batch + h_kv * params.v_stride.head;
  T* o_ptr = static_cast<T*>(params.o) + b * params.o_stride.batch + h * params.o_stride.head +
             int64_t(m_start) * params.o_stride.seq;
  const int row0 = m_start + warp * ROWS_PER_WARP;  // this warp's first query row

  // The KV tiles this Q tile visits, [first, end), and the fully visible ones among them: for all
  // BLOCK_M rows, as step 10 counts them (rows past N_q are computed, never stored; counting only
  // the existing ones cost a register, and at 255 one spill, in two D = 128 configurations).
  const TileRange range = MaskT::range(params, offset, m_start, BLOCK_M, BLOCK_N);
  const int first = MaskT::kFromFirstKey ? 0 : int(range.first);
  const int n_blocks = int(range.end) - first;
  // The loop counts tiles from `first`: the i-th visited is KV tile first + i, masked before
  // full_first_i and from full_end_i on. A window's first key, key_shift, is folded into K's and V's
  // pointers, the rows the mask sees and the key bound (its test depends on key − row alone besides
  // the bound), so that no register holds `first` through the loop (one more cost WindowFlag's
  // kernels a spill). ScoreMod::kDiagonalFirst (one-sided ALiBi, whose bias rises toward the
  // diagonal) visits the same tiles from the last back: key_shift is then the last tile's first key,
  // the i-th tile's keys start at −i·BLOCK_N from it, and the fully visible tiles' bounds reflect.
  // Only a sign changes in the loop (counting i from the end cost a register, and a spill at D = 128).
  constexpr bool kBack = ScoreMod::kDiagonalFirst;
  constexpr int kStep = kBack ? -BLOCK_N : BLOCK_N;
  const int full_first = MaskT::kFromFirstKey ? 0 : int(range.first_full) - first;
  const int full_end = int(range.end_full) - first;
  const int full_first_i = kBack ? n_blocks - full_end : full_first;
  const int full_end_i = kBack ? n_blocks - full_first : full_end;
  const int key_shift = (first + (kBack ? n_blocks - 1 : 0)) * BLOCK_N;
  const auto element = MaskT::element(params, params.seqlen_kv - key_shift, offset);  // the 32-bit element test
  k_ptr += int64_t(key_shift) * params.k_stride.seq;
  v_ptr += int64_t(key_shift) * params.v_stride.seq;
  const int kv_left = n_kv - key_shift, mask_row0 = row0 - key_shift;  // keys from key_shift; rows shifted alike

  // The i-th visited KV tile lives in ring slot i % STAGES, K first.
  auto k_tile_of = [&](int i) { return next_tile(kv_ring, 2 * (i % STAGES)); };
  auto v_tile_of = [&](int i) { return next_tile(kv_ring, 2 * (i % STAGES) + 1); };
  // Issues the copies of the i-th visited KV tile into its ring slot (rows past N_kv arrive as zeros).
  auto load_kv = [&](int i) {
    const int n_start = i * kStep;  // from key_shift
    const int kv_rows = min(BLOCK_N, kv_left - n_start);
    load_tile_async<NUM_THREADS>(k_tile_of(i), k_ptr + n_start * params.k_stride.seq, params.k_stride.seq, kv_rows);
    load_tile_async<NUM_THREADS>(v_tile_of(i), v_ptr + n_start * params.v_stride.seq, params.v_stride.seq, kv_rows);
  };

  // ---- load Q, and the first STAGES-1 K/V tiles behind it.
  load_tile_async<NUM_THREADS>(q_tile, q_ptr, params.q_stride.seq, min(BLOCK_M, n_q - m_start));
  cp_async_commit();
  for (int stage = 0; stage < STAGES - 1; ++stage) {
    if (stage < n_blocks) load_kv(stage);
    cp_async_commit();  // an empty group keeps the group count the same everywhere
  }
  cp_async_wait<STAGES - 1>();  // the oldest group, Q, has landed
  __syncthreads();

  // ---- init state
  Acc<HEAD_DIM> o_i[M_TILES];  // (16, HEAD_DIM) fp32 each, unnormalised output
  Rows m_i[M_TILES];           // running row max, raw score units
  Rows l_i[M_TILES];           // running row sum over this lane's columns
#pragma unroll
  for (int t = 0; t < M_TILES; ++t) {
    o_i[t] = zeros<HEAD_DIM>();
    m_i[t] = rows(-INFINITY);
    l_i[t] = rows(0.0f);
  }
  const ScoreMod score_mod = ScoreMod::make(params, mods, b, h);

  // ---- KV loop
  for (int i = 0; i < n_blocks; ++i) {
    const int n_start = i * kStep;  // keys from key_shift: key_shift + n_start is the tile's first
    cp_async_wait<STAGES - 2>();    // tile i has landed (this thread's copies)
    __syncthreads();                // everyone's; and every warp is done reading tile i-1
    if (i + STAGES - 1 < n_blocks) load_kv(i + STAGES - 1);  // into the slot just freed
    cp_async_commit();
    const SmemTile<BLOCK_N, Layout, T> k_tile = k_tile_of(i), v_tile = v_tile_of(i);
    const bool masked = i < full_first_i || i >= full_end_i;

    Acc<BLOCK_N> s[M_TILES];
    mma_qk_tiles(s, q_tile, warp * ROWS_PER_WARP, k_tile);  // S_t = Q_t·Kᵀ

    FragA<BLOCK_N> p[M_TILES];  // P_t in T (V's type), the A operand of P·V
#pragma unroll
    for (int t = 0; t < M_TILES; ++t) {
      score_mod(s[t], row0 + kMmaRows * t, key_shift + n_start);
      // Masked scores become -inf before the row max, on the tiles that need it only; the rows
      // shifted by key_shift like the keys (the element test's bound is N_kv − key_shift).
      if (masked) apply_mask(s[t], mask_row0 + kMmaRows * t, n_start, element);
      const Rows m_new = row_max(s[t], m_i[t]);
      if (any_max_moved(m_i[t], m_new, scale_log2, Cfg::RESCALE_THRESHOLD)) {
        const Rows alpha = rescale_factor(m_i[t], scale_log2, exp2_offset(m_new, scale_log2));
        rescale(o_i[t], alpha);
        l_i[t] = l_i[t] * alpha;
        m_i[t] = m_new;
      }
      const Acc<BLOCK_N> p_t = exp2_rows(s[t], scale_log2, exp2_offset(m_i[t], scale_log2));
      p[t] = to_a<T>(p_t);
      l_i[t] = l_i[t] + row_sum(p_t);
    }
    mma_pv_tiles(o_i, p, v_tile);  // O_t += P_t·V
  }

  // ---- normalise and store
  float* lse_ptr = params.lse ? params.lse + (b * params.heads_q + h) * int64_t(n_q) + m_start : nullptr;
#pragma unroll
  for (int t = 0; t < M_TILES; ++t) {
    const int tile_row0 = warp * ROWS_PER_WARP + kMmaRows * t;
    Rows l = quad_sum(l_i[t]);
    score_mod.finish(o_i[t], m_i[t], l, params, h);  // a sink's term in the denominator and the LSE
    Epilogue::store(Out<NoTile, T>{o_ptr, params.o_stride.seq, lse_ptr, tile_row0, n_q - m_start}, o_i[t], m_i[t], l,
                    scale_log2);
  }
}

// The host side of one configuration: the tuner calls Launcher::launch<HEAD_DIM, Cfg>, for every
// element type alike (the tuner's key holds the type, so each is timed on its own).
struct Launcher {
  template <int HEAD_DIM, typename Cfg>
  static Status launch(const AttentionParams& p, cudaStream_t stream) {
    return with_element_type<bf16, fp16>(p.dtype, [&]<typename T>() { return launch_as<T, HEAD_DIM, Cfg>(p, stream); });
  }

  template <typename T, int HEAD_DIM, typename Cfg>
  static Status launch_as(const AttentionParams& p, cudaStream_t stream) {
    // One configuration's window kernel spills on sm_90 (D = 64, <128, 128, 2>: 8 bytes): a window
    // call asked of it runs its neighbour <128, 64, 2>'s (the same queries per block, 64-key tiles),
    // and it has no window kernel of its own.
    constexpr bool kWindowElsewhere = HEAD_DIM == 64 && Cfg::BLOCK_M == 128 && Cfg::BLOCK_N == 128 && Cfg::STAGES == 2;
    if constexpr (kWindowElsewhere)
      if (p.has_window() || p.has_score_mods()) return launch_as<T, HEAD_DIM, Config<128, 64, 2>>(p, stream);
    constexpr int smem = Cfg::template smem_bytes<HEAD_DIM>();
    // A sliding window runs kernels of its own (WindowFlag: the range starts past tile 0, masked
    // tiles at both ends), score modifications theirs (WindowFlag, which takes any mask, and the Mods
    // kernel of the call's modification: one alone its own, several ScoreMods); every other call the
    // default policies'.
    auto kernel = attention_kernel<HEAD_DIM, Cfg, T>;
    if constexpr (!kWindowElsewhere) {
      if (p.has_score_mods())
        kernel = with_score_mods(p, [](auto m) { return attention_kernel<HEAD_DIM, Cfg, T, WindowFlag, decltype(m)>; });
      else if (p.has_window())
        kernel = attention_kernel<HEAD_DIM, Cfg, T, WindowFlag>;
    }
    if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
    dim3 grid;
    if (Status st = GridScheduler::grid({int(cdiv(p.seqlen_q, Cfg::BLOCK_M)), p.batch * p.heads_q, p.causal}, 0, &grid);
        !st.ok())
      return st;
    kernel<<<grid, Cfg::NUM_THREADS, smem, stream>>>(p, forward_exp2_constant(p), p.causal_offset(), score_mod_args(p));
    FA_LAUNCH_RETURN();
    return Status::Ok();
  }
};

// Step 10's list at D = 64 and 128, its measured order of preference per head dim; the other head
// dims (Part VI) from their neighbours': D = 32 and 96 as the next larger, D = 192 and 256 with one
// 16-row tile per warp (their O would not fit two), 64 or 128 queries a block (the larger reads
// each K/V tile for twice the queries, where this GPU's shared memory holds it: the tuner skips a
// configuration that does not fit). D = 256 takes 8 warps (a swizzled row of 32 chunks copied by
// 128 threads is 4 rows a pass, half the swizzle's period: device/smem_tile.h's CopyPlan) and
// 32-key tiles (its 64-key tiles spilled on sm_80, and their window kernels on sm_90), so 128 KB
// at least: a GPU with 99 KB a block (sm_86, sm_89) has no D = 256 configuration, and the call is
// refused by name ("no kernel configuration ... fits"), nothing written.
const tuner::Tuner kTuner(kProductionMma, FA_BUILD_ID,
                          configs<Launcher>(At<32, Config<128, 128, 2>>{},     //
                                            At<32, Config<128, 64, 3>>{},      //
                                            At<32, Config<64, 64, 3>>{},       //
                                            At<64, Config<128, 128, 2>>{},     // 4 warps, 128-key tiles
                                            At<64, Config<128, 64, 3>>{},      // 3 tiles in flight
                                            At<64, Config<128, 64, 2>>{},      //
                                            At<64, Config<64, 64, 3>>{},       // 2 warps: more blocks
                                            At<96, Config<128, 32, 3>>{},      // (64-key tiles at 32 rows a warp
                                            At<96, Config<128, 32, 2>>{},      // spilled their window kernels)
                                            At<96, Config<128, 64, 2, 1>>{},   // 8 warps of 16 rows
                                            At<96, Config<64, 64, 3, 1>>{},    // 4 warps of 16 rows
                                            At<128, Config<128, 64, 2>>{},     //
                                            At<128, Config<128, 64, 3>>{},     //
                                            At<128, Config<128, 32, 3>>{},     // 32-key tiles: fewer registers
                                            At<128, Config<128, 32, 2>>{},     //
                                            At<192, Config<128, 64, 2, 1>>{},  // 8 warps of 16 rows
                                            At<192, Config<64, 64, 2, 1>>{},   // 4 warps of 16 rows
                                            At<192, Config<64, 32, 2, 1>>{},   //
                                            At<256, Config<128, 32, 2, 1>>{},  // 8 warps of 16 rows
                                            At<256, Config<128, 32, 3, 1>>{}));

const Capabilities kCaps = [] {
  Capabilities c = forward_caps({32, 64, 96, 128, 192, 256});  // step 10's: nothing beyond the common ones,
  c.deterministic_backward = true;                             // and the production backward's deterministic mode
  c.backward_head_dims = bwd::backward_caps().head_dims;       // 32 to 128 (kernels/bwd_mma.cu)
  c.split_kv = true;                     // decode calls: the decode kernel splits their keys (kernels/fwd_decode.cu)
  c.seqlens_kv = true;                   // ... and reads a length per sequence (kernels/fwd_decode.cu)
  c.paged_kv = true;                     // ... a paged cache
  c.varlen = true;                       // ... and packed sequences of any length (cu_seqlens)
  c.kv_append = true;                    // ... and appends to the cache in the call (k_new, v_new)
  c.sliding_window = true;               // window_size: WindowFlag's kernels (forward and backward)
  c.softcap = c.alibi = c.sinks = true;  // ScoreMods' kernels (kernels/score_mod.h), forward and backward,
                                         // and the decode kernel's MODS ones
  c.decode_max_packed_rows = kDecodeMaxPackedRows;  // ... for the calls it takes (validation says so)
  c.dtypes = built_dtypes();                        // bf16, and fp16 where the build compiles it;
  c.decode_dtypes = decode::dtypes();               // the decode kernel's: the same types
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  bool decode = false;  // a call of a few rows per group: the decode kernel (kernels/fwd_decode.cu)
  if (Status st = decode::route(p, stream, &decode); decode || !st.ok()) return st;
  return kTuner.run(p, stream);
}

// What runs call p: the decode kernel's configuration for the calls it takes, else the tuner's.
std::string describe(const AttentionParams& p) {
  return decode::describe(p, kTuner.describe(p));
}

FA_REGISTER_STEP({kProductionMma, "kernel_mma", /*base=*/10,
                  "the production forward on mma.sync: step 10 with its mask, score hook, scheduler and epilogue "
                  "as policies",
                  kCaps, &forward, "", &bwd::backward, &describe})

}  // namespace fa::kernels::mma
