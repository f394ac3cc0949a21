// Step 04 — tensor cores: Q·Kᵀ and P·V on mma.sync (bf16 operands, fp32 accumulators); the
// softmax state m_i, l_i, o_i stays fp32 in registers.
//
// What changed since step 03 (fp32 FMAs on CUDA cores, a quad of lanes per query row):
//  - Each warp owns 16 query rows and computes on whole tiles: `mma.sync.m16n8k16` multiplies a
//    16×16 bf16 tile by a 16×8 one into fp32 sums, in registers spread over the 32 lanes (the
//    "fragments" of device/ptx/mma.h). The kernel is written in the warp-tile vocabulary of
//    device/warp_tile.h, so the KV loop reads as the algorithm: s = mma_qk(q, k_tile), row_max,
//    exp2_rows, rescale, mma_pv.
//  - Q, K and V tiles go through shared memory and come out of it with `ldmatrix`, which loads a
//    lane's fragments without per-element addressing (plain for Q and K, `.trans` for V).
//    The tiles' rows are padded by 16 bytes, so ldmatrix's 8-row reads hit 8 different bank
//    groups (device/smem_tile.h, PaddedLayout). One K/V buffer, filled with plain 16-byte loads:
//    the block waits for each tile before computing on it (step 08 overlaps the two).
//  - P is rounded to bf16 in registers: the fp32 accumulator layout of S is exactly the A-operand
//    layout of the next mma, so P never goes through shared memory. S, m, l and O stay fp32.
//  - exp(x) becomes 2^x with log2(e)·scale folded into one multiply per score (README.md, "Where
//    to put the scale", has the measured alternatives).
// What it costs: bf16 rounding of P (relative 2^-9 per weight), head dims fixed at compile time
// (64, 128), 16-byte aligned rows. What it buys, measured on an H200 (B=2 H=16 N=4096 D=64):
// 206 TFLOP/s against step 03's 12.5, 16×; still a quarter of the bf16 GEMM rate, because every
// warp waits for each tile's loads before its tensor cores have work (README.md).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "device/mask.h"
#include "device/smem_tile.h"
#include "device/warp_tile.h"
#include "fa/registry.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"

namespace fa::step04 {
namespace {

using namespace fa::tile;

constexpr int BLOCK_M = 64;              // query rows per block
constexpr int BLOCK_N = 64;              // keys per K/V tile
constexpr int NUM_WARPS = BLOCK_M / 16;  // each warp owns 16 query rows (one mma row tile)
constexpr int NUM_THREADS = NUM_WARPS * 32;

// Shared memory: the Q tile, then one K tile and one V tile, all (rows, HEAD_DIM) bf16, padded.
template <int HEAD_DIM>
constexpr int smem_bytes() {
  return PaddedLayout<HEAD_DIM>::bytes(BLOCK_M + 2 * BLOCK_N);
}

template <int HEAD_DIM>
__global__ void __launch_bounds__(NUM_THREADS) attention_kernel(const AttentionParams params, const float scale_log2) {
  using Layout = PaddedLayout<HEAD_DIM>;
  extern __shared__ uint4 smem[];  // uint4: 16-byte aligned, as ldmatrix and the 16-byte stores need
  const SmemTile<BLOCK_M, Layout> q_tile{reinterpret_cast<bf16*>(smem)};             // (BLOCK_M, HEAD_DIM)
  const SmemTile<BLOCK_N, Layout> k_tile{q_tile.ptr + BLOCK_M * Layout::kRowElems};  // (BLOCK_N, HEAD_DIM)
  const SmemTile<BLOCK_N, Layout> v_tile{k_tile.ptr + BLOCK_N * Layout::kRowElems};  // (BLOCK_N, HEAD_DIM)

  const int warp = int(threadIdx.x) / 32;
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);

  // ---- pointers: grid = (Q tiles, B·H_q); 64-bit offsets, every tensor through its own strides.
  const int m_block = int(blockIdx.x);
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
  const int n_blocks = int(cdiv(n_kv, BLOCK_N));

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
    // Keys past N_kv (only in the last tile) get -inf: exp gives exactly 0 and the max ignores them.
    if (n_start + BLOCK_N > n_kv) apply_mask(s, row0, n_start, KeyBound{n_kv});

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

template <int HEAD_DIM>
Status launch(const AttentionParams& p, cudaStream_t stream) {
  constexpr int smem = smem_bytes<HEAD_DIM>();
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = p.effective_scale() * kLog2e;  // p = 2^(scale_log2·(s − m))
  // Above 48 KiB of dynamic shared memory a kernel must opt in (once per device).
  if (Status st = opt_in_shared_memory(reinterpret_cast<const void*>(attention_kernel<HEAD_DIM>), smem); !st.ok())
    return st;
  const int64_t bh = p.batch * p.heads_q;  // y holds up to 65535 (batch, head) pairs, z the rest
  const dim3 grid(unsigned(cdiv(p.seqlen_q, BLOCK_M)), unsigned(std::min<int64_t>(bh, 65535)),
                  unsigned(cdiv(bh, 65535)));
  attention_kernel<HEAD_DIM><<<grid, NUM_THREADS, smem, stream>>>(p, scale_log2);
  FA_LAUNCH_RETURN();
  return Status::Ok();
}

const Capabilities kCaps = [] {
  Capabilities c;
  c.head_dims = {64, 128};
  c.causal = false;
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
  return p.head_dim == 64 ? launch<64>(p, stream) : launch<128>(p, stream);
}

FA_REGISTER_STEP({4, "fp32_state", /*base=*/3,
                  "tensor cores: mma.sync bf16 Q·Kᵀ and P·V, ldmatrix from padded shared memory; m, l, O stay fp32",
                  kCaps, &forward, "BLOCK_M=64 BLOCK_N=64 warps=4"})

}  // namespace fa::step04
