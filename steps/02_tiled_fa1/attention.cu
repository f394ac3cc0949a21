// Step 02 — FlashAttention-1: K/V tiles in shared memory, KV loop outside, Q loop inside.
//
// Changed since step 01: keys are no longer read one by one from global memory by every row.
// The block stages a tile of BLOCK_N keys (K and V, widened to fp32) in shared memory once, and
// all its quads compute against that copy. This is the loop order of the FlashAttention paper
// (Algorithm 1): the OUTER loop walks the K/V tiles, the INNER loop walks every Q tile of the
// head. Because a Q tile is visited once per K/V tile, its running state cannot stay in registers
// between visits: m_i, l_i and O live in an fp32 workspace in global memory, are read at the start
// of every (K/V tile, Q tile) visit and written back at its end. As in the paper, O is kept
// normalised after every tile (divided by l_i), so each visit first undoes that division, then
// rescales by alpha, adds P·V and divides again. The last K/V tile is masked with -inf scores.
//
// What it costs: parallelism only over batch·heads (one block per (b, h), e.g. 32 blocks for
// B = 2, H = 16 on a 132-SM GPU), and for every K/V tile the whole O, m and l of the head make a
// round trip through global memory: 2·N_q·(HEAD_DIM + 2)·4 bytes per tile, N_kv/BLOCK_N times.
// Q is re-read N_kv/BLOCK_N times too. README.md counts the bytes. Step 03 swaps the loops.
#include <cuda_bf16.h>

#include <cmath>

#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "device/mask.h"
#include "device/online_softmax.h"
#include "device/row_slice.h"
#include "fa/registry.h"

namespace fa::step02 {
namespace {

using bf16 = __nv_bfloat16;

constexpr int BLOCK_M = 64;                    // query rows per Q tile, one quad per row
constexpr int BLOCK_N = 32;                    // keys per K/V tile
constexpr int kThreads = BLOCK_M * kRowLanes;  // 256 threads
constexpr int kWarpRows = 32 / kRowLanes;      // consecutive rows of a Q tile owned by one warp

// The running state of every query row, fp32, in global memory: FA1's loop order forces it there.
struct Workspace {
  float* o;  // (B·H_q, N_q, HEAD_DIM), kept normalised (divided by l) between tiles
  float* m;  // (B·H_q, N_q) running max
  float* l;  // (B·H_q, N_q) running sum
};

template <int HEAD_DIM>
__global__ void __launch_bounds__(kThreads, 1)
    attention_kernel(const AttentionParams params, const float scale, const Workspace ws) {
  constexpr int SLICE = row_slice_size<HEAD_DIM>();           // values of a row held by each lane
  __shared__ __align__(16) float k_tile[BLOCK_N * HEAD_DIM];  // (BLOCK_N, HEAD_DIM) fp32
  __shared__ __align__(16) float v_tile[BLOCK_N * HEAD_DIM];  // (BLOCK_N, HEAD_DIM) fp32

  // ---- pointers: one block per (batch, head); it walks every Q tile of that head itself
  const int lane = row_lane();
  const int warp_row0 = int(threadIdx.x / 32) * kWarpRows;  // first row of a Q tile this warp owns
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / params.heads_q, h = bh % params.heads_q;
  const int64_t hk = kv_head_of(h, params.heads_q, params.heads_kv);
  const bf16* q_ptr = static_cast<const bf16*>(params.q) + b * params.q_stride.batch + h * params.q_stride.head;
  const bf16* k_ptr = static_cast<const bf16*>(params.k) + b * params.k_stride.batch + hk * params.k_stride.head;
  const bf16* v_ptr = static_cast<const bf16*>(params.v) + b * params.v_stride.batch + hk * params.v_stride.head;
  bf16* o_ptr = static_cast<bf16*>(params.o) + b * params.o_stride.batch + h * params.o_stride.head;
  float* o_state = ws.o + bh * params.seqlen_q * HEAD_DIM;  // (N_q, HEAD_DIM) fp32
  float* m_state = ws.m + bh * params.seqlen_q;             // (N_q) fp32
  float* l_state = ws.l + bh * params.seqlen_q;             // (N_q) fp32

  // ---- init state: m = -inf, l = 0, O = 0 for every row of the head, in global memory. Each
  // quad initialises exactly the rows it will later update, so no barrier is needed before use.
  for (int64_t q_start = 0; q_start < params.seqlen_q; q_start += BLOCK_M) {
    const int64_t row = q_start + threadIdx.x / kRowLanes;
    if (row >= params.seqlen_q) continue;
    float o_i[SLICE];
#pragma unroll
    for (int d = 0; d < SLICE; ++d) o_i[d] = 0.0f;
    store_row_slice(o_state + row * HEAD_DIM, lane, o_i);
    if (lane == 0) {
      m_state[row] = -INFINITY;
      l_state[row] = 0.0f;
    }
  }

  // ---- KV loop (outer)
  for (int64_t kv_start = 0; kv_start < params.seqlen_kv; kv_start += BLOCK_N) {
    const int kv_rows = tile_rows(kv_start, BLOCK_N, params.seqlen_kv);  // < BLOCK_N in the last tile
    load_tile<BLOCK_N, HEAD_DIM, kThreads>(k_tile, k_ptr + kv_start * params.k_stride.seq, params.k_stride.seq,
                                           kv_rows);
    load_tile<BLOCK_N, HEAD_DIM, kThreads>(v_tile, v_ptr + kv_start * params.v_stride.seq, params.v_stride.seq,
                                           kv_rows);
    // The whole K/V tile is in shared memory before any quad reads it. (It also makes lane 0's
    // m/l writes of the previous visit visible to the other lanes of its quad.)
    __syncthreads();

    // Q loop (inner): every Q tile of the head against this one K/V tile
    for (int64_t q_start = 0; q_start < params.seqlen_q; q_start += BLOCK_M) {
      // A warp whose rows all lie past N_q has nothing to do in this Q tile. (No barrier inside
      // this loop, so a warp may skip ahead; it still meets both barriers of the KV loop.)
      if (q_start + warp_row0 >= params.seqlen_q) continue;
      const int64_t row = q_start + threadIdx.x / kRowLanes;  // this quad's query row
      const bool row_valid = row < params.seqlen_q;           // the last Q tile may stick out past N_q

      // ---- load Q: again for every K/V tile; rows past N_q get q = 0 (finite, never stored)
      float q_tile[SLICE];  // (HEAD_DIM / 4) fp32: this lane's slice of the row; scale folded in
#pragma unroll
      for (int d = 0; d < SLICE; ++d) q_tile[d] = 0.0f;
      if (row_valid) load_row_slice(q_ptr + row * params.q_stride.seq, lane, q_tile, scale);

      // ---- the running state of this row, read back from global memory
      float m_i = -INFINITY;
      float l_i = 0.0f;
      float o_i[SLICE];  // (HEAD_DIM / 4) fp32, normalised
#pragma unroll
      for (int d = 0; d < SLICE; ++d) o_i[d] = 0.0f;
      if (row_valid) {
        m_i = m_state[row];
        l_i = l_state[row];
        load_row_slice(o_state + row * HEAD_DIM, lane, o_i);
      }

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
      const float undo = alpha * l_i;  // the stored O was divided by l_i: undo that, onto the new max
#pragma unroll
      for (int d = 0; d < SLICE; ++d) o_i[d] *= undo;
      l_i = alpha * l_i + p_sum;
      // o_i += p · v_tile
#pragma unroll
      for (int n = 0; n < BLOCK_N; ++n) {
        float v_row[SLICE];
        load_row_slice(v_tile + n * HEAD_DIM, lane, v_row);
#pragma unroll
        for (int d = 0; d < SLICE; ++d) o_i[d] += p[n] * v_row[d];
      }
      const float inv_l = 1.0f / l_i;  // FA1 divides after every tile, so O in memory stays normalised
#pragma unroll
      for (int d = 0; d < SLICE; ++d) o_i[d] *= inv_l;
      m_i = m_new;

      // ---- the state goes back to global memory until this Q tile's next visit
      if (row_valid) {
        store_row_slice(o_state + row * HEAD_DIM, lane, o_i);
        if (lane == 0) {
          m_state[row] = m_i;
          l_state[row] = l_i;
        }
      }
    }
    __syncthreads();  // every quad has finished reading this K/V tile before the next load overwrites it
  }

  // ---- normalise: nothing left to do, O was divided by l_i after every tile

  // ---- store: a last pass converts this head's fp32 O to bf16, row by row
  for (int64_t q_start = 0; q_start < params.seqlen_q; q_start += BLOCK_M) {
    const int64_t row = q_start + threadIdx.x / kRowLanes;
    if (row >= params.seqlen_q) continue;
    float o_i[SLICE];
    load_row_slice(o_state + row * HEAD_DIM, lane, o_i);  // written by this same thread: no barrier
    store_row_slice(o_ptr + row * params.o_stride.seq, lane, o_i);
  }
}

const Capabilities kCaps = [] {
  Capabilities c;
  c.head_dims = {64, 128};
  c.causal = false;  // the causal mask arrives in step 05
  c.lse = false;     // the log-sum-exp output arrives in step 07
  c.gqa = true;
  c.max_batch_heads = kMaxGridX;  // the grid: one block per (batch, head)
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  const int64_t batch_heads = p.batch * p.heads_q;
  if (Status st = check_grid(batch_heads); !st.ok()) return st;
  const float scale = p.effective_scale();
  // The workspace: O (fp32) plus m and l for every query row. Stream-ordered, like step 00's S.
  const size_t rows = size_t(batch_heads * p.seqlen_q);
  float* buffer = nullptr;
  FA_CUDA_RETURN(
      cudaMallocAsync(reinterpret_cast<void**>(&buffer), rows * size_t(p.head_dim + 2) * sizeof(float), stream));
  const Workspace ws{buffer, buffer + rows * size_t(p.head_dim), buffer + rows * size_t(p.head_dim + 1)};
  if (p.head_dim == 64) {
    attention_kernel<64><<<unsigned(batch_heads), kThreads, 0, stream>>>(p, scale, ws);
  } else {
    attention_kernel<128><<<unsigned(batch_heads), kThreads, 0, stream>>>(p, scale, ws);
  }
  const cudaError_t launch = cudaGetLastError();
  FA_CUDA_RETURN(cudaFreeAsync(buffer, stream));  // stream-ordered: freed after the kernel is done
  FA_CUDA_RETURN(launch);
  return Status::Ok();
}

FA_REGISTER_STEP({2, "tiled_fa1", /*base=*/1,
                  "FlashAttention-1: K/V tiles in shared memory, KV loop outside and Q loop inside, "
                  "O/m/l in global memory",
                  kCaps, &forward, ""})

}  // namespace fa::step02
