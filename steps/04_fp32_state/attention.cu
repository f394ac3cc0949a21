// Step 04 — tensor cores: Q·Kᵀ and P·V on mma.sync (bf16 operands, fp32 accumulators); the
// softmax state m_i, l_i, o_i stays fp32 in registers.
//
// What changed since step 03 (fp32 FMAs on CUDA cores):
//  - Both matmuls run on tensor cores, `mma.sync.m16n8k16` with bf16 inputs and fp32 sums. Each
//    warp owns 16 query rows; its Q rows live in registers as mma A fragments for the whole loop.
//  - K and V tiles come from shared memory through `ldmatrix` (plain for K, `.trans` for V), so
//    no lane computes per-element addresses, and the tiles are stored with an XOR swizzle so
//    those loads are free of bank conflicts.
//  - The tiles are loaded with `cp.async` into a ring of STAGES buffers: tile j+1 is in flight
//    while tile j is being multiplied (double buffering with STAGES = 2).
//  - P is rounded to bf16 in registers: the fp32 accumulator layout of S is exactly the A-operand
//    layout of the next mma, so P never goes through shared memory.
//  - exp(x) becomes 2^x with log2(e)·scale folded into one multiply per score (the measured
//    choice; see README.md, "Where to put the scale").
// What it costs: bf16 rounding of P (relative 2^-9 per weight; S, m, l and O stay fp32), head
// dims fixed at compile time (64, 128), 16-byte aligned rows, and a lot more code. What it buys:
// the matmuls at tensor-core speed (README.md has the measured TFLOP/s).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "common/cuda_check.h"
#include "common/mask.h"
#include "common/ptx/cp_async.h"
#include "common/ptx/ldmatrix.h"
#include "common/ptx/mma.h"
#include "common/ptx/swizzle.h"
#include "common/tiles.h"
#include "fa/registry.h"
#include "fa/steps.h"

namespace fa::step04 {
namespace {

using bf16 = __nv_bfloat16;
using namespace fa::ptx;

constexpr int BLOCK_M = 64;              // query rows per block (4 warps; measured faster than 128)
constexpr int BLOCK_N = 64;              // keys per K/V tile
constexpr int STAGES = 2;                // K/V tiles in flight: 2 = double buffering
constexpr int NUM_WARPS = BLOCK_M / 16;  // each warp owns 16 query rows (one mma row tile)
constexpr int NUM_THREADS = NUM_WARPS * 32;

// Shared memory: the Q tile, then STAGES × (K tile, V tile), all (rows, HEAD_DIM) bf16 swizzled.
template <int HEAD_DIM>
constexpr int smem_bytes() {
  return (BLOCK_M + STAGES * 2 * BLOCK_N) * HEAD_DIM * int(sizeof(bf16));
}

// Where the softmax scale goes is a template parameter, so that the lesson's experiment (README.md,
// "Where to put the scale") runs this very kernel; forward() uses (c), folded_exp2. The multiply
// of placements (a) and (b) only exists in their instantiations (`if constexpr`).
struct ScaleArgs {
  float scale;     // the softmax scale (placements a and b multiply by it)
  float exp2_mul;  // p = 2^(exp2_mul·s − exp2_mul·m): log2(e)·scale for (c), log2(e) otherwise
};

// Copies ROWS × HEAD_DIM bf16 from global memory (row stride `stride` elements) into a swizzled
// shared tile with cp.async, one 16-byte chunk per copy. Rows >= valid_rows are zero-filled: a
// ragged last tile never holds stale data (V) or NaN (0 × NaN would poison P·V).
// All threads together copy ROWS_PER_PASS rows per pass; as that is a multiple of 8, a thread's
// chunk has the same swizzle in every pass and its shared address just steps by a constant.
template <int ROWS, int HEAD_DIM>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* src, int64_t stride, int valid_rows) {
  constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
  constexpr int ROWS_PER_PASS = NUM_THREADS / CHUNKS;
  static_assert(ROWS % ROWS_PER_PASS == 0 && ROWS_PER_PASS % 8 == 0, "tile must split evenly over the threads");
  const int row0 = int(threadIdx.x) / CHUNKS, col = (int(threadIdx.x) % CHUNKS) * 8;
  const uint32_t smem0 = smem_u32(tile + swizzled_offset(row0, col, HEAD_DIM));
#pragma unroll
  for (int pass = 0; pass < ROWS / ROWS_PER_PASS; ++pass) {
    const int row = row0 + pass * ROWS_PER_PASS;
    const bool valid = row < valid_rows;
    const bf16* g = src + (valid ? row * stride + col : 0);
    cp_async_16(smem0 + pass * ROWS_PER_PASS * HEAD_DIM * int(sizeof(bf16)), g, valid);
  }
}

template <int HEAD_DIM, ScalePlacement PLACEMENT>
__global__ void __launch_bounds__(NUM_THREADS) attention_kernel(const AttentionParams params, const ScaleArgs scale) {
  static_assert(HEAD_DIM % 64 == 0, "the swizzle needs rows of at least 8 chunks of 16 bytes");
  extern __shared__ uint4 smem[];                // uint4: 16-byte aligned, as cp.async and ldmatrix need
  bf16* q_tile = reinterpret_cast<bf16*>(smem);  // (BLOCK_M, HEAD_DIM) bf16
  bf16* kv_tiles = q_tile + BLOCK_M * HEAD_DIM;  // STAGES × [(BLOCK_N, HEAD_DIM) K, then V]

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
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
  const int n_blocks = int(cdiv(n_kv, BLOCK_N));

  // Issues the copies of K/V tile n_block into ring buffer n_block % STAGES.
  auto load_kv = [&](int n_block) {
    bf16* k_tile = kv_tiles + (n_block % STAGES) * 2 * BLOCK_N * HEAD_DIM;
    bf16* v_tile = k_tile + BLOCK_N * HEAD_DIM;
    const int n_start = n_block * BLOCK_N;
    const int rows = min(BLOCK_N, n_kv - n_start);
    load_tile<BLOCK_N, HEAD_DIM>(k_tile, k_ptr + n_start * params.k_stride.seq, params.k_stride.seq, rows);
    load_tile<BLOCK_N, HEAD_DIM>(v_tile, v_ptr + n_start * params.v_stride.seq, params.v_stride.seq, rows);
  };

  // ---- load Q: one cp.async group for Q, then the first STAGES-1 K/V tiles start flying too.
  load_tile<BLOCK_M, HEAD_DIM>(q_tile, q_ptr, params.q_stride.seq, min(BLOCK_M, n_q - m_start));
  cp_async_commit();
  for (int stage = 0; stage < STAGES - 1; ++stage) {
    if (stage < n_blocks) load_kv(stage);
    cp_async_commit();  // an empty group is fine: it keeps the group count the same everywhere
  }
  cp_async_wait<STAGES - 1>();  // the oldest group, Q, has landed (K/V may still be in flight)
  __syncthreads();              // ... for every thread's copies
  // This warp's 16 rows of Q as A fragments, in registers for the whole KV loop.
  uint32_t q_frag[HEAD_DIM / 16][4];
  const unsigned q_off = 2 * swizzled_offset(warp * 16 + ldsm_a_row(lane), ldsm_a_colblock(lane) * 8, HEAD_DIM);
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
    ldmatrix_x4(q_frag[kk], smem_u32(q_tile) + swizzle_move_right(q_off, kk * 16));
  if constexpr (PLACEMENT == ScalePlacement::q_bf16) {  // (a): Q·scale, rounded back to bf16
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float2 x = unpack_bf16x2(q_frag[kk][r]);
        q_frag[kk][r] = pack_bf16x2(x.x * scale.scale, x.y * scale.scale);
      }
  }

  // ---- init state: this lane's share of rows g = lane/4 (index 0) and g + 8 (index 1).
  float o_i[HEAD_DIM / 8][4];  // (16, HEAD_DIM) fp32 per warp as HEAD_DIM/8 accumulator tiles
#pragma unroll
  for (int dt = 0; dt < HEAD_DIM / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_i[dt][e] = 0.0f;
  float m_i[2] = {-INFINITY, -INFINITY};  // running row max, in raw score units (fp32)
  float l_i[2] = {0.0f, 0.0f};            // running row sum over THIS lane's columns (fp32);
                                          // the 4 lanes of a row are summed once, at the end

  // Byte offsets of this lane's ldmatrix rows in a K and a V tile, for the first 16×16 block. The
  // other blocks are compile-time steps away: 16 rows down = + 16·HEAD_DIM·2 bytes, 16 columns
  // right = XOR (swizzle_move_right). Computed once, they cost no registers inside the loop.
  const unsigned k_off = 2 * swizzled_offset(ldsm_k_row(lane), ldsm_k_colblock(lane) * 8, HEAD_DIM);
  const unsigned v_off = 2 * swizzled_offset(ldsm_v_row(lane), ldsm_v_colblock(lane) * 8, HEAD_DIM);
  constexpr unsigned ROWS16_BYTES = 16 * HEAD_DIM * sizeof(bf16);

  // ---- KV loop
  for (int n_block = 0; n_block < n_blocks; ++n_block) {
    cp_async_wait<STAGES - 2>();  // tile n_block has landed (this thread's copies)
    __syncthreads();              // everyone's copies; and everyone is done reading tile n_block-1
    if (n_block + STAGES - 1 < n_blocks) load_kv(n_block + STAGES - 1);  // into the buffer just freed
    cp_async_commit();

    const bf16* k_tile = kv_tiles + (n_block % STAGES) * 2 * BLOCK_N * HEAD_DIM;  // (BLOCK_N, HEAD_DIM)
    const bf16* v_tile = k_tile + BLOCK_N * HEAD_DIM;                             // (BLOCK_N, HEAD_DIM)

    // S = Q·Kᵀ on tensor cores: (16, HEAD_DIM) × (HEAD_DIM, BLOCK_N) per warp, fp32 accumulators.
    float s[BLOCK_N / 8][4];  // (16, BLOCK_N) fp32 as BLOCK_N/8 accumulator tiles
#pragma unroll
    for (int nt = 0; nt < BLOCK_N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
      uint32_t k_frag[BLOCK_N / 16][4];  // B fragments of key tiles 2nn and 2nn+1 (16 keys × 16 dims)
#pragma unroll
      for (int nn = 0; nn < BLOCK_N / 16; ++nn)
        ldmatrix_x4(k_frag[nn], smem_u32(k_tile) + nn * ROWS16_BYTES + swizzle_move_right(k_off, kk * 16));
#pragma unroll
      for (int nn = 0; nn < BLOCK_N / 16; ++nn) {
        mma_bf16_16816(s[2 * nn], q_frag[kk], k_frag[nn][0], k_frag[nn][1]);
        mma_bf16_16816(s[2 * nn + 1], q_frag[kk], k_frag[nn][2], k_frag[nn][3]);
      }
    }
    if constexpr (PLACEMENT == ScalePlacement::scores_fp32) {  // (b): fp32 scores · scale
#pragma unroll
      for (int nt = 0; nt < BLOCK_N / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= scale.scale;
    }
    // Keys past N_kv (only in the last tile) get -inf: exp gives exactly 0 and the max ignores them.
    const int n_start = n_block * BLOCK_N;
    if (n_start + BLOCK_N > n_kv) {
#pragma unroll
      for (int nt = 0; nt < BLOCK_N / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (n_start + nt * 8 + mma_c_col(lane, e) >= n_kv) s[nt][e] = -INFINITY;
    }

    // Online softmax, per row: new max, rescale factor for the old state, P = 2^(c·s − c·m).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m_new = m_i[r];
#pragma unroll
      for (int nt = 0; nt < BLOCK_N / 8; ++nt) m_new = fmaxf(m_new, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      // The 4 lanes of a quad hold the row's columns: combine their maxima.
      m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
      m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
      // A row that has seen only -inf keeps m = -inf; use 0 then, so -inf − (−inf) never makes NaN.
      const float m_scaled = m_new == -INFINITY ? 0.0f : m_new * scale.exp2_mul;
      const float alpha = exp2_approx(m_i[r] * scale.exp2_mul - m_scaled);  // 0 on the first tile
      m_i[r] = m_new;
      float row_sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < BLOCK_N / 8; ++nt)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[nt][e] = exp2_approx(s[nt][e] * scale.exp2_mul - m_scaled);  // one FFMA + one MUFU.EX2
          row_sum += s[nt][e];
        }
      l_i[r] = l_i[r] * alpha + row_sum;
#pragma unroll
      for (int dt = 0; dt < HEAD_DIM / 8; ++dt) {
        o_i[dt][2 * r] *= alpha;
        o_i[dt][2 * r + 1] *= alpha;
      }
    }

    // P in bf16, straight from the S accumulators (same layout as an A fragment, no shuffles).
    uint32_t p[BLOCK_N / 16][4];  // (16, BLOCK_N) bf16 as BLOCK_N/16 A fragments
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
      accumulators_to_a(p[kk], s[2 * kk], s[2 * kk + 1]);
    }

    // O += P·V on tensor cores: (16, BLOCK_N) × (BLOCK_N, HEAD_DIM), accumulating into fp32 o_i.
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
#pragma unroll
      for (int dd = 0; dd < HEAD_DIM / 16; ++dd) {
        uint32_t v_frag[4];  // B fragments of dim tiles 2dd and 2dd+1 (16 keys × 16 dims), transposed
        ldmatrix_x4_trans(v_frag, smem_u32(v_tile) + kk * ROWS16_BYTES + swizzle_move_right(v_off, dd * 16));
        mma_bf16_16816(o_i[2 * dd], p[kk], v_frag[0], v_frag[1]);
        mma_bf16_16816(o_i[2 * dd + 1], p[kk], v_frag[2], v_frag[3]);
      }
    }
  }

  // ---- normalise: finish the row sums across the quad, then one divide per row (deferred).
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv_l[r] = l > 0.0f ? 1.0f / l : 0.0f;  // l = 0 only if a row saw no key: O = 0, not NaN
  }

  // ---- store: bf16 pairs straight from the accumulators; rows past N_q are not written.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + lane / 4 + 8 * r;
    if (m_start + row >= n_q) continue;
    bf16* o_row = o_ptr + row * params.o_stride.seq;
#pragma unroll
    for (int dt = 0; dt < HEAD_DIM / 8; ++dt)
      *reinterpret_cast<uint32_t*>(o_row + dt * 8 + mma_c_col(lane, 0)) =
          pack_bf16x2(o_i[dt][2 * r] * inv_l[r], o_i[dt][2 * r + 1] * inv_l[r]);
  }
}

template <int HEAD_DIM, ScalePlacement PLACEMENT>
Status launch(const AttentionParams& p, const ScaleArgs& scale, cudaStream_t stream) {
  constexpr int smem = smem_bytes<HEAD_DIM>();
  // Above 48 KiB of dynamic shared memory a kernel must opt in explicitly.
  FA_CUDA_RETURN(
      cudaFuncSetAttribute(attention_kernel<HEAD_DIM, PLACEMENT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t bh = p.batch * p.heads_q;  // y holds up to 65535 (batch, head) pairs, z the rest
  const dim3 grid(unsigned(cdiv(p.seqlen_q, BLOCK_M)), unsigned(std::min<int64_t>(bh, 65535)),
                  unsigned(cdiv(bh, 65535)));
  attention_kernel<HEAD_DIM, PLACEMENT><<<grid, NUM_THREADS, smem, stream>>>(p, scale);
  FA_LAUNCH_RETURN();
  return Status::Ok();
}

template <ScalePlacement PLACEMENT>
Status launch(const AttentionParams& p, const ScaleArgs& scale, cudaStream_t stream) {
  return p.head_dim == 64 ? launch<64, PLACEMENT>(p, scale, stream) : launch<128, PLACEMENT>(p, scale, stream);
}

const Capabilities kCaps = [] {
  Capabilities c;
  c.head_dims = {64, 128};
  c.causal = false;
  c.lse = false;
  c.gqa = true;
  c.tensor_cores = true;
  return c;
}();

std::string describe(const AttentionParams&) {
  return "BLOCK_M=" + std::to_string(BLOCK_M) + " BLOCK_N=" + std::to_string(BLOCK_N) +
         " warps=" + std::to_string(NUM_WARPS) + " stages=" + std::to_string(STAGES);
}

}  // namespace

Status forward_with_scale_placement(const AttentionParams& p, ScalePlacement placement, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  if (Status st = check_tile_limits(p, BLOCK_M); !st.ok()) return st;
  const float scale = p.effective_scale();
  constexpr float kLog2e = 1.4426950408889634f;
  switch (placement) {
    case ScalePlacement::q_bf16:
      return launch<ScalePlacement::q_bf16>(p, {scale, kLog2e}, stream);
    case ScalePlacement::scores_fp32:
      return launch<ScalePlacement::scores_fp32>(p, {scale, kLog2e}, stream);
    case ScalePlacement::folded_exp2:
      break;
  }
  return launch<ScalePlacement::folded_exp2>(p, {scale, scale * kLog2e}, stream);
}

Status forward(const AttentionParams& p, cudaStream_t stream) {
  return forward_with_scale_placement(p, ScalePlacement::folded_exp2, stream);
}

namespace {
const StepRegistrar registrar({4, "fp32_state",
                               "tensor cores: mma.sync bf16 Q·Kᵀ and P·V, ldmatrix, cp.async; m, l, O stay fp32", kCaps,
                               &forward, &describe});
}  // namespace

}  // namespace fa::step04
