// Step 06 — autotuning: the tile sizes become template parameters, a short compile-time list of
// configurations is built per head dim, and one call into the tuner picks among them per problem.
//
// What changed since step 05:
//  - BLOCK_M and BLOCK_N come from a Config type; warps = BLOCK_M / 16 (each warp still owns 16
//    query rows). The kernel body is unchanged.
//  - kTuner holds the configurations of both head dims, in order of preference. Each one is a
//    compiled kernel (CI compiles all of them, so the list stays short); those needing more
//    shared memory than the GPU allows per block are never run.
//  - forward() is one call, kTuner.run(): the tuner (library/tuner.h) looks the problem's key up
//    (shape, GPU and FA_BUILD_ID, the build system's hash of what was compiled), times every
//    config on scratch outputs on a miss and caches the winner; FA_AUTOTUNE=0 or a stream being
//    captured into a CUDA graph gets a shape-aware heuristic instead. The build id in the key is
//    what keeps a rebuilt kernel from reusing old timings (seed bug #10, stale autotune cache).
// What it costs: every configuration to compile, and the first call of each new problem key
// times them all before it returns. Measured on an H200: a later call costs 6.2–7.0 µs of host
// time, the launch included; a first call at B=1 H=16 N=32k D=128 causal 0.4 s (README.md).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "device/mask.h"
#include "device/smem_tile.h"
#include "device/tiles.h"
#include "device/warp_tile.h"
#include "fa/registry.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "library/tuner.h"

namespace fa::step06 {
namespace {

using namespace fa::tile;

// One kernel configuration: query rows per block, keys per K/V tile.
template <int BLOCK_M_, int BLOCK_N_>
struct Config {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int NUM_WARPS = BLOCK_M / 16;  // each warp owns 16 query rows (one mma row tile)
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  // Shared memory: the Q tile, then one K tile and one V tile, all (rows, HEAD_DIM) bf16, padded.
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return PaddedLayout<HEAD_DIM>::bytes(BLOCK_M + 2 * BLOCK_N);
  }
};

template <int HEAD_DIM, typename Cfg>
__global__ void __launch_bounds__(Cfg::NUM_THREADS)
    attention_kernel(const AttentionParams params, const float scale_log2, const int64_t offset) {
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, NUM_THREADS = Cfg::NUM_THREADS;
  using Layout = PaddedLayout<HEAD_DIM>;
  extern __shared__ uint4 smem[];  // uint4: 16-byte aligned, as ldmatrix and the 16-byte stores need
  const SmemTile<BLOCK_M, Layout> q_tile{reinterpret_cast<bf16*>(smem)};             // (BLOCK_M, HEAD_DIM)
  const SmemTile<BLOCK_N, Layout> k_tile{q_tile.ptr + BLOCK_M * Layout::kRowElems};  // (BLOCK_N, HEAD_DIM)
  const SmemTile<BLOCK_N, Layout> v_tile{k_tile.ptr + BLOCK_N * Layout::kRowElems};  // (BLOCK_N, HEAD_DIM)

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
  const int row0 = m_start + warp * 16;  // this warp's first query row
  const bool causal = params.causal;     // key j visible to row i iff j <= i + offset
  const int n_blocks = kv_tile_end(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);  // stop at the diagonal
  const int first_masked = kv_tile_first_masked(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);

  // ---- load Q: the block copies its Q tile; each warp keeps its 16 rows as A fragments in
  // registers for the whole KV loop.
  load_tile<NUM_THREADS>(q_tile, q_ptr, params.q_stride.seq, min(BLOCK_M, n_q - m_start));
  __syncthreads();
  const FragA<HEAD_DIM> q = load_a<HEAD_DIM>(q_tile, warp * 16);  // (16, HEAD_DIM) bf16

  // ---- init state: each lane holds rows g and g + 8 of its warp's 16 (device/warp_tile.h).
  Acc<HEAD_DIM> o_i = zeros<HEAD_DIM>();  // (16, HEAD_DIM) fp32, unnormalised output
  Rows m_i = rows(-INFINITY);             // running row max, in raw score units (fp32)
  Rows l_i = rows(0.0f);                  // running row sum over THIS lane's columns (fp32);
                                          // the 4 lanes of a row are summed once, at the end

  // ---- KV loop
  for (int n_block = 0; n_block < n_blocks; ++n_block) {
    const int n_start = n_block * BLOCK_N;
    __syncthreads();                                   // every warp is done reading the previous K/V tile
    const int kv_rows = min(BLOCK_N, n_kv - n_start);  // rows past N_kv arrive as zeros
    load_tile<NUM_THREADS>(k_tile, k_ptr + n_start * params.k_stride.seq, params.k_stride.seq, kv_rows);
    load_tile<NUM_THREADS>(v_tile, v_ptr + n_start * params.v_stride.seq, params.v_stride.seq, kv_rows);
    __syncthreads();  // ... and the new one is complete, every thread's part of it

    Acc<BLOCK_N> s = mma_qk(q, k_tile);  // S = Q·Kᵀ: (16, BLOCK_N) fp32 on tensor cores
    // The mask, on the tiles that need it only: straddling the diagonal, or holding keys past
    // N_kv. Masked scores become -inf BEFORE the row max, so the max is over visible keys only.
    if (n_block >= first_masked) apply_mask(s, row0, n_start, CausalMask{n_kv, causal, offset});

    // Online softmax: new max, rescale factor for the old state, P = 2^(c·s − c·m).
    const Rows m_new = row_max(s, m_i);
    const Rows m_scaled = exp2_offset(m_new, scale_log2);          // c·m_new, 0 while m_new = -inf
    const Rows alpha = rescale_factor(m_i, scale_log2, m_scaled);  // 0 on the first tile
    rescale(o_i, alpha);
    const Acc<BLOCK_N> p = exp2_rows(s, scale_log2, m_scaled);  // one FFMA + one MUFU.EX2 each

    mma_pv(o_i, to_bf16(p), v_tile);  // O += P·V: P rounded to bf16, O accumulates in fp32
    // The row sums after P·V: nothing waits for them, so the compiler can issue P·V as soon as
    // the first P fragment exists and put the sums' adds in the tensor cores' shadow.
    l_i = l_i * alpha + row_sum(p);
    m_i = m_new;
  }

  // ---- normalise: finish the row sums across the quad, then one divide per row (deferred).
  const Rows l = quad_sum(l_i);

  // ---- store: bf16 pairs straight from the accumulators; rows past N_q are not written.
  store_rows(o_ptr, params.o_stride.seq, o_i, safe_inverse(l), warp * 16, n_q - m_start);
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
          /*stages=*/0,
          Cfg::template smem_bytes<HEAD_DIM>(),
          &launch<HEAD_DIM, Cfg>};
}

// Per head dim in order of preference (the heuristic's tie-break). Every entry is compiled for
// every architecture, so each one added costs CI minutes: add one only if some shape on some GPU
// measurably wins with it.
const tuner::Tuner kTuner(6, FA_BUILD_ID,
                          {
                              config<64, Config<64, 64>>(),    // step 05's tiles
                              config<64, Config<64, 128>>(),   // half the barriers and max/sum passes per key
                              config<64, Config<128, 128>>(),  // 8 warps share each K/V tile
                              config<128, Config<128, 64>>(),  // 8 warps share each K/V tile
                              config<128, Config<64, 64>>(),   // step 05's tiles: twice the blocks
                          });

const Capabilities kCaps = [] {
  Capabilities c;
  c.head_dims = {64, 128};
  c.causal = true;
  c.lse = false;
  c.gqa = true;
  c.tensor_cores = true;
  c.max_seqlen = kTileMaxSeqlen;           // 32-bit row indices
  c.max_batch_heads = kTileMaxBatchHeads;  // B·H_q over the grid's y and z
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  return kTuner.run(p, stream);  // the cached config for this problem, tuned on its first call
}

FA_REGISTER_STEP({6, "autotune", /*base=*/5,
                  "compile-time configs, one tuner call: the fastest config per problem key (shape, GPU, build), "
                  "cached",
                  kCaps, &forward, ""})

}  // namespace fa::step06
