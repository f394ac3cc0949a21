// Step 01 — online softmax: one fused kernel, and no score matrix anywhere.
//
// Changed since step 00: the three kernels and the (N_q, N_kv) fp32 buffer S/P are gone. Each
// query row streams over the keys once, keeping three running values in registers: the max m_i
// of the scores seen so far, the sum l_i = Σ exp(s_j - m_i), and the output o_i = Σ exp(s_j - m_i)
// · v_j (fp32). When a new key raises the max, the old l_i and o_i are multiplied by
// alpha = exp(m_old - m_new) so every term is measured against the same max again; at the end
// O = o_i / l_i. docs/online_softmax.md derives why that equals softmax(S)·V exactly.
// Mapping: a quad of 4 lanes per query row (device/row_slice.h), BLOCK_M = 64 rows per block.
//
// What it costs: memory is now O(N) (the inputs and outputs only), but every quad reads every K
// and V row of its head from global memory by itself, one key per iteration, and pays two exp()
// per key: a row sees N_kv serial steps. The caches catch the rereads only as far as rows of the
// same head run at the same time. Step 02 stages K/V in shared memory so a block reads each key
// once.
#include <cuda_bf16.h>

#include <cmath>

#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "device/mask.h"
#include "device/online_softmax.h"
#include "device/row_slice.h"
#include "fa/registry.h"

namespace fa::step01 {
namespace {

using bf16 = __nv_bfloat16;

constexpr int BLOCK_M = 64;                    // query rows per block
constexpr int kThreads = BLOCK_M * kRowLanes;  // one quad per row: 256 threads

template <int HEAD_DIM>
__global__ void __launch_bounds__(kThreads, 1) attention_kernel(const AttentionParams params, const float scale) {
  constexpr int SLICE = row_slice_size<HEAD_DIM>();  // values of a row held by each lane

  // ---- pointers: this quad's query row, counted over all rows of all (batch, head) pairs
  const int lane = row_lane();
  const int64_t rows = params.batch * params.heads_q * params.seqlen_q;
  const int64_t block_row = int64_t(blockIdx.x) * BLOCK_M + threadIdx.x / kRowLanes;
  const bool row_valid = block_row < rows;  // the last block may stick out past the last row
  // Past the end, recompute the last row and store nothing: every lane stays in the loop, so the
  // quad shuffles never run with part of the warp gone.
  const int64_t row = row_valid ? block_row : rows - 1;
  const int64_t i = row % params.seqlen_q;
  const int64_t bh = row / params.seqlen_q;
  const int64_t b = bh / params.heads_q, h = bh % params.heads_q;
  const int64_t hk = kv_head_of(h, params.heads_q, params.heads_kv);
  const bf16* q_ptr = static_cast<const bf16*>(params.q) + b * params.q_stride.batch + h * params.q_stride.head +
                      i * params.q_stride.seq;
  const bf16* k_ptr = static_cast<const bf16*>(params.k) + b * params.k_stride.batch + hk * params.k_stride.head;
  const bf16* v_ptr = static_cast<const bf16*>(params.v) + b * params.v_stride.batch + hk * params.v_stride.head;
  bf16* o_ptr =
      static_cast<bf16*>(params.o) + b * params.o_stride.batch + h * params.o_stride.head + i * params.o_stride.seq;

  // ---- load Q: the softmax scale is folded into q once, not applied to every score
  float q_tile[SLICE];  // (HEAD_DIM / 4) fp32: this lane's slice of the query row
  load_row_slice(q_ptr, lane, q_tile, scale);

  // ---- init state: fp32 whatever the input type; m_i = -inf so the first key sets the max
  float m_i = -INFINITY;
  float l_i = 0.0f;
  float o_i[SLICE];  // (HEAD_DIM / 4) fp32
#pragma unroll
  for (int d = 0; d < SLICE; ++d) o_i[d] = 0.0f;

  // ---- KV loop: one key per iteration
  for (int64_t j = 0; j < params.seqlen_kv; ++j) {
    float k_row[SLICE], v_row[SLICE];
    load_row_slice(k_ptr + j * params.k_stride.seq, lane, k_row);
    load_row_slice(v_ptr + j * params.v_stride.seq, lane, v_row);
    const float s = row_sum(dot_slice(q_tile, k_row));  // scale · q·k_j, the same in all 4 lanes

    // The recurrence, in this order: the new max first, then alpha from the OLD max, then l_i and
    // o_i, and only then may m_i be overwritten (doing it earlier makes alpha = 1: catalog #5).
    const float m_new = fmaxf(m_i, s);
    const float alpha = online_softmax_rescale(m_i, m_new);  // exp(m_i - m_new) <= 1
    const float p = expf(s - m_new);                         // <= 1: the exponent is never positive
#pragma unroll
    for (int d = 0; d < SLICE; ++d) o_i[d] *= alpha;  // old terms onto the new max
    l_i = alpha * l_i + p;
#pragma unroll
    for (int d = 0; d < SLICE; ++d) o_i[d] += p * v_row[d];
    m_i = m_new;
  }

  // ---- normalise: one division per row, after the last key (l_i >= 1: the max term is exp(0))
  const float inv_l = 1.0f / l_i;
#pragma unroll
  for (int d = 0; d < SLICE; ++d) o_i[d] *= inv_l;

  // ---- store
  if (row_valid) store_row_slice(o_ptr, lane, o_i);
}

const Capabilities kCaps = [] {
  Capabilities c;
  c.head_dims = {64, 128};
  c.causal = false;  // the causal mask arrives in step 05
  c.lse = false;     // the log-sum-exp output arrives in step 07
  c.gqa = true;
  c.max_work_tiles = kMaxGridX;  // the grid: one block per BLOCK_M rows of all (batch, head) pairs
  c.work_tile_rows = BLOCK_M;
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  const int64_t blocks = cdiv(p.batch * p.heads_q * p.seqlen_q, BLOCK_M);
  if (Status st = check_grid(blocks); !st.ok()) return st;
  const float scale = p.effective_scale();
  if (p.head_dim == 64) {
    attention_kernel<64><<<unsigned(blocks), kThreads, 0, stream>>>(p, scale);
  } else {
    attention_kernel<128><<<unsigned(blocks), kThreads, 0, stream>>>(p, scale);
  }
  FA_LAUNCH_RETURN();
  return Status::Ok();
}

FA_REGISTER_STEP({1, "online_softmax", /*base=*/0,
                  "one fused kernel: each query row streams over the keys with a running max, sum "
                  "and output; no N² buffer",
                  kCaps, &forward, ""})

}  // namespace fa::step01
