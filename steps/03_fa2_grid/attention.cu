// Step 03 — FlashAttention-2: one block per (Q tile, batch·head), the running state in registers.
//
// Changed since step 02 (FA1), the two changes of the FlashAttention-2 paper:
//   1. The loops are swapped and the Q tiles are spread over the grid. A block owns one Q tile of
//      BLOCK_M rows for its whole life: it loads the tile once, keeps m_i, l_i and o_i in
//      registers while it streams over all K/V tiles, and writes O once. Nothing but the final O
//      goes back to global memory, and the grid has cdiv(N_q, BLOCK_M)·B·H blocks instead of B·H.
//   2. Fewer non-matmul operations: o_i is kept un-normalised (only rescaled by alpha) and divided
//      by l_i once after the last tile, instead of undoing and redoing the division every tile.
// Grid order (cdiv(N_q, BLOCK_M), B·H): blockIdx.x varies fastest in launch order, so the Q tiles
// of one head are launched next to each other and run at the same time; they all read the same
// K/V tiles, which the first of them brings into L2 for the others. With (B·H, Q tiles) the
// blocks running together would belong to different heads, each pulling its own K/V from HBM.
// Q and K/V keep separate strides and lengths (N_q != N_kv), the last Q tile is masked on the
// store, and the last K/V tile is masked to -inf as before. Still fp32 on CUDA cores.
//
// What it costs: each block reads all of K and V of its head (cdiv(N_q, BLOCK_M) times per head
// in total, mostly from L2), and the register state limits a block to BLOCK_M = 64 rows. The
// arithmetic still runs on CUDA cores at fp32 rate, a fraction of what the tensor cores offer:
// step 04 moves both matmuls onto them.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "device/mask.h"
#include "device/online_softmax.h"
#include "device/row_slice.h"
#include "fa/registry.h"

namespace fa::step03 {
namespace {

using bf16 = __nv_bfloat16;

constexpr int BLOCK_M = 64;                    // query rows per Q tile, one quad per row
constexpr int BLOCK_N = 32;                    // keys per K/V tile
constexpr int kThreads = BLOCK_M * kRowLanes;  // 256 threads

template <int HEAD_DIM>
__global__ void __launch_bounds__(kThreads, 1) attention_kernel(const AttentionParams params, const float scale) {
  constexpr int SLICE = row_slice_size<HEAD_DIM>();           // values of a row held by each lane
  __shared__ __align__(16) float k_tile[BLOCK_N * HEAD_DIM];  // (BLOCK_N, HEAD_DIM) fp32
  __shared__ __align__(16) float v_tile[BLOCK_N * HEAD_DIM];  // (BLOCK_N, HEAD_DIM) fp32

  // ---- pointers: the block's Q tile and (batch, head) come from the grid
  const int lane = row_lane();
  const int64_t q_start = int64_t(blockIdx.x) * BLOCK_M;
  const int64_t bh = int64_t(blockIdx.z) * gridDim.y + blockIdx.y;  // z is used only past 65535 (b, h) pairs
  if (bh >= params.batch * params.heads_q) return;                  // the last z slice may be partly empty
  const int64_t b = bh / params.heads_q, h = bh % params.heads_q;
  const int64_t hk = kv_head_of(h, params.heads_q, params.heads_kv);
  const bf16* q_ptr = static_cast<const bf16*>(params.q) + b * params.q_stride.batch + h * params.q_stride.head;
  const bf16* k_ptr = static_cast<const bf16*>(params.k) + b * params.k_stride.batch + hk * params.k_stride.head;
  const bf16* v_ptr = static_cast<const bf16*>(params.v) + b * params.v_stride.batch + hk * params.v_stride.head;
  bf16* o_ptr = static_cast<bf16*>(params.o) + b * params.o_stride.batch + h * params.o_stride.head;
  const int64_t row = q_start + threadIdx.x / kRowLanes;  // this quad's query row
  const bool row_valid = row < params.seqlen_q;           // the last Q tile may stick out past N_q

  // ---- load Q: once per block; rows past N_q get q = 0 (finite scores, never stored)
  float q_tile[SLICE];  // (HEAD_DIM / 4) fp32: this lane's slice of the row; scale folded in
#pragma unroll
  for (int d = 0; d < SLICE; ++d) q_tile[d] = 0.0f;
  if (row_valid) load_row_slice(q_ptr + row * params.q_stride.seq, lane, q_tile, scale);

  // ---- init state: in registers for the whole KV loop, fp32
  float m_i = -INFINITY;
  float l_i = 0.0f;
  float o_i[SLICE];  // (HEAD_DIM / 4) fp32, un-normalised
#pragma unroll
  for (int d = 0; d < SLICE; ++d) o_i[d] = 0.0f;

  // ---- KV loop
  for (int64_t kv_start = 0; kv_start < params.seqlen_kv; kv_start += BLOCK_N) {
    const int kv_rows = tile_rows(kv_start, BLOCK_N, params.seqlen_kv);  // < BLOCK_N in the last tile
    load_tile<BLOCK_N, HEAD_DIM, kThreads>(k_tile, k_ptr + kv_start * params.k_stride.seq, params.k_stride.seq,
                                           kv_rows);
    load_tile<BLOCK_N, HEAD_DIM, kThreads>(v_tile, v_ptr + kv_start * params.v_stride.seq, params.v_stride.seq,
                                           kv_rows);
    __syncthreads();  // the whole K/V tile is in shared memory before any quad reads it

    // s = scale · q·kᵀ for the BLOCK_N keys of the tile
    float s[BLOCK_N];  // (BLOCK_N) fp32 scores of this quad's row, the same in all 4 lanes
#pragma unroll
    for (int n = 0; n < BLOCK_N; ++n) {
      float k_row[SLICE];
      load_row_slice(k_tile + n * HEAD_DIM, lane, k_row);
      s[n] = row_sum(dot_slice(q_tile, k_row));
    }
    // Keys past N_kv (zero rows of the last tile) get -inf, not their score 0: exp(0 - m) would
    // count them as real keys. Only the last tile can stick out.
    if (kv_start + BLOCK_N > params.seqlen_kv) {
#pragma unroll
      for (int n = 0; n < BLOCK_N; ++n)
        if (kv_start + n >= params.seqlen_kv) s[n] = -INFINITY;
    }

    // The recurrence, one tile at a time: the new max first, then alpha from the OLD max, then
    // l_i and o_i, and m_i last. The tile always holds a real key, so m_new is finite.
    float tile_max = s[0];
#pragma unroll
    for (int n = 1; n < BLOCK_N; ++n) tile_max = fmaxf(tile_max, s[n]);
    const float m_new = fmaxf(m_i, tile_max);
    const float alpha = online_softmax_rescale(m_i, m_new);  // exp(m_i - m_new)
    float(&p)[BLOCK_N] = s;  // P overwrites S in place: a score is dead once exponentiated
    float p_sum = 0.0f;
#pragma unroll
    for (int n = 0; n < BLOCK_N; ++n) {
      p[n] = expf(s[n] - m_new);
      p_sum += p[n];
    }
#pragma unroll
    for (int d = 0; d < SLICE; ++d) o_i[d] *= alpha;  // old terms onto the new max
    l_i = alpha * l_i + p_sum;
    // o_i += p · v_tile
#pragma unroll
    for (int n = 0; n < BLOCK_N; ++n) {
      float v_row[SLICE];
      load_row_slice(v_tile + n * HEAD_DIM, lane, v_row);
#pragma unroll
      for (int d = 0; d < SLICE; ++d) o_i[d] += p[n] * v_row[d];
    }
    m_i = m_new;
    __syncthreads();  // every quad has finished reading this K/V tile before the next load overwrites it
  }

  // ---- normalise: the one division, deferred to after the last tile (l_i >= 1 for real rows)
  const float inv_l = 1.0f / l_i;
#pragma unroll
  for (int d = 0; d < SLICE; ++d) o_i[d] *= inv_l;

  // ---- store: only rows that exist; the last Q tile's extra rows are dropped here
  if (row < params.seqlen_q) store_row_slice(o_ptr + row * params.o_stride.seq, lane, o_i);
}

const Capabilities kCaps = [] {
  Capabilities c;
  c.head_dims = {64, 128};
  c.causal = false;  // the causal mask arrives in step 05
  c.lse = false;     // the log-sum-exp output arrives in step 07
  c.gqa = true;
  c.max_seqlen = kTileMaxSeqlen;           // Q tiles along the grid's x
  c.max_batch_heads = kTileMaxBatchHeads;  // B·H_q over the grid's y and z
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  // Q tiles of one head adjacent in launch order: they share K/V in L2. gridDim.y stops at 65535,
  // so larger B·H spills over into z.
  const int64_t q_tiles = cdiv(p.seqlen_q, BLOCK_M), batch_heads = p.batch * p.heads_q;
  const int64_t grid_y = std::min(batch_heads, kMaxGridYZ), grid_z = cdiv(batch_heads, grid_y);
  if (Status st = check_grid(q_tiles, grid_y, grid_z); !st.ok()) return st;
  const float scale = p.effective_scale();
  const dim3 grid{unsigned(q_tiles), unsigned(grid_y), unsigned(grid_z)};
  if (p.head_dim == 64) {
    attention_kernel<64><<<grid, kThreads, 0, stream>>>(p, scale);
  } else {
    attention_kernel<128><<<grid, kThreads, 0, stream>>>(p, scale);
  }
  FA_LAUNCH_RETURN();
  return Status::Ok();
}

FA_REGISTER_STEP({3, "fa2_grid", /*base=*/2,
                  "FlashAttention-2: grid over (Q tiles, batch·heads), KV loop inside, state in "
                  "registers, one deferred divide",
                  kCaps, &forward, ""})

}  // namespace fa::step03
