// The production backward on Hopper (sm_90a), generalised from step 24 and put on step 33's
// instruction diet (wgmma descriptors advanced by addition, the warp index warp-uniform, the LSE
// and D in one shot, the dQ atomics' addresses not hoisted): the five products as
// wgmma by two warpgroups of 64 keys each, Pᵀ and dSᵀ from registers into dV and dK, dQ = dS·K from
// dSᵀ in shared memory read transposed, staged and added with 16-byte atomics; two stages of
// Q/dO/LSE/D in flight by cp.async; the deterministic mode's turnstiles with the Q tiles walked
// down. Not a lesson: the steps never include it. The Hopper production kernel
// (kernels/fwd_hopper.cu) registers it as its backward. What the lesson hard-wired is a policy:
//
//   Mask      which Q tiles see a KV tile, and the element test the backward re-applies
//             (kernels/mask.h): by default the call's causal flag, either alignment, as the steps.
//
// With the default policy it computes what step 33 computes with step 33's instructions
// (static.kernels.bwd_hopper.same_as_step33 compares the counts). The preprocess and the convert
// are kernels/backward.h's, shared with the mma.sync backward.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "device/backward_tile.h"
#include "device/mask.h"
#include "device/ptx/cp_async.h"
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
#include "library/cuda_status.h"
#include "library/launch_limits.h"

namespace fa::kernels::bwd_hopper {
namespace {

using namespace fa::tile;
using fa::ptx::cp_async_commit;
using fa::ptx::cp_async_wait;

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
template <int HEAD_DIM, typename Cfg, bool DETERMINISTIC, typename MaskT = CausalFlag>
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

  // The warp index warp-uniform (step 33): the warpgroup's keys and their wgmma descriptors go to
  // the uniform registers.
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0), wg = warp / 4;
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);

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

  // The Q tiles that see some key of this KV tile: from the mask's first to the last.
  const int m_tiles = (n_q + BLOCK_M - 1) / BLOCK_M;
  const int64_t turnstiles_per_head = (n_q + kBackwardTurnstileRows - 1) / kBackwardTurnstileRows;
  const int m_first = int(MaskT::q_tile_first(params, offset, n_start, BLOCK_M));

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
  // Issues the copies of item t = (hq, m_block) into its stage (kernels/backward.h).
  auto load_item = [&](int t, int hq, int m_block) {
    bwd_common::load_work_item<NUM_THREADS, /*ONE_SHOT=*/true>(
        bp, b, h_kv * group + hq, m_block, next_tile(qdo_tiles, 2 * (t % STAGES)),
        next_tile(qdo_tiles, 2 * (t % STAGES) + 1), lse_d_tiles + (t % STAGES) * 2 * BLOCK_M, lse2, delta);
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
    // The mask, transposed (rows are keys): queries past N_q and whatever the policy hides get
    // −inf, so that their P is 0; only on a warp's (16 keys, BLOCK_M) block that is not fully visible.
    if (MaskT::block_masked(params, int(offset), m_start, BLOCK_M, key0, 16)) {
      const auto visible = MaskT::element(params, offset);  // (query, key) -> visible, keys past N_kv included
      apply_mask(s, key0, m_start, [=](int key, int query) { return (query < n_q) & visible(query, key); });
    }
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
    // Deterministic: wait for this block's turn on the Q tile (its KV tile number), add, pass it on.
    const bwd_common::DqTurn<DETERMINISTIC> turn{
        turnstiles + bh * turnstiles_per_head + m_start / int(kBackwardTurnstileRows), int(blockIdx.x)};
    turn.wait();
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
    turn.pass();
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

template <int HEAD_DIM, typename Cfg>
Status launch_backward(const BackwardParams& bp, cudaStream_t stream) {
  const AttentionParams& p = bp.fwd;
  // Shared memory first, before anything is written (182 KB at D = 128, 118 KB at D = 64).
  constexpr int smem = Cfg::smem_bytes();
  const auto kernel = bp.deterministic ? backward_kernel<HEAD_DIM, Cfg, true> : backward_kernel<HEAD_DIM, Cfg, false>;
  if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem); !st.ok()) return st;
  return bwd_common::run<HEAD_DIM>(bp, stream, [&](const bwd_common::Buffers& w) {
    const dim3 grid(unsigned(cdiv(p.seqlen_kv, Cfg::BLOCK_N)), unsigned(p.batch * p.heads_kv));
    kernel<<<grid, Cfg::NUM_THREADS, smem, stream>>>(bp, w.delta, w.lse2, w.dq_accum, w.turnstiles, scale_log2(p),
                                                     p.causal_offset());
    FA_LAUNCH_RETURN();
    return Status::Ok();
  });
}

}  // namespace

Capabilities backward_caps() {
  Capabilities c = forward_caps({64, 128});
  c.only_sm = 90;                   // wgmma: sm_90a code, compute capability 9.0 only
  c.deterministic_backward = true;  // BackwardParams::deterministic: dQ added in a fixed order
  return c;
}

Status backward(const BackwardParams& bp, cudaStream_t stream) {
  static const Capabilities caps = backward_caps();
  if (Status st = validate_backward(bp, caps); !st.ok()) return st;
  if (Status st = check_device(caps); !st.ok()) return st;  // sm_90a code on a GPU that can run it
  if (Status st = bwd_common::check_backward_grids(bp.fwd); !st.ok()) return st;
  if constexpr (head_dim_built(64))
    if (bp.fwd.head_dim == 64) return launch_backward<64, BwdConfig<64>>(bp, stream);
  if constexpr (head_dim_built(128))
    if (bp.fwd.head_dim == 128) return launch_backward<128, BwdConfig<128>>(bp, stream);
  return Status::Unsupported("the Hopper backward has no kernel at head dim " + std::to_string(bp.fwd.head_dim));
}

}  // namespace fa::kernels::bwd_hopper
