// Step 00 — naive attention: the O(N²) baseline every later step is measured against.
//
// Three kernels, each doing one line of the math:
//   1. S = scale · Q·Kᵀ          written to an fp32 (B, H, N_q, N_kv) buffer in global memory
//   2. P = softmax(S) per row    in place, with the row max subtracted first
//   3. O = P·V                   read P back from global memory
// Cost: the S/P buffer is N_q·N_kv·4 bytes per head (2 GiB at B=2, H=16, N=4096) and is written
// once, read and written by the softmax, and read again by P·V, so the step is bound by memory
// traffic, not arithmetic. Everything later exists to make that buffer disappear.
#include <cuda_bf16.h>

#include <cmath>

#include "library/cuda_status.h"
#include "library/launch_limits.h"
#include "device/mask.h"
#include "fa/registry.h"

namespace fa::step00 {
namespace {

using bf16 = __nv_bfloat16;

// Kernel 1: one thread per score s[b, h, i, j] = scale · q_i · k_j. Masked pairs get -inf (never
// 0: exp(0 - m) would be a real weight), so the softmax ignores them.
__global__ void scores_kernel(AttentionParams p, float scale, int64_t offset, float* s) {
  const int64_t total = p.batch * p.heads_q * p.seqlen_q * p.seqlen_kv;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = idx % p.seqlen_kv;
    const int64_t i = (idx / p.seqlen_kv) % p.seqlen_q;
    const int64_t h = (idx / (p.seqlen_kv * p.seqlen_q)) % p.heads_q;
    const int64_t b = idx / (p.seqlen_kv * p.seqlen_q * p.heads_q);
    if (p.causal && !causal_visible(i, j, offset)) {
      s[idx] = -INFINITY;
      continue;
    }
    const int64_t hk = kv_head_of(h, p.heads_q, p.heads_kv);
    const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head + i * p.q_stride.seq;
    const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_stride.batch + hk * p.k_stride.head + j * p.k_stride.seq;
    float dot = 0.f;  // fp32 accumulation of bf16 products
    for (int64_t d = 0; d < p.head_dim; ++d) dot += __bfloat162float(q[d]) * __bfloat162float(k[d]);
    s[idx] = scale * dot;
  }
}

// Kernel 2: one block per row. Subtracting the row max m keeps every exponent <= 0, so exp never
// overflows however large the logits are; the result is unchanged because the factor e^-m cancels
// between numerator and denominator. Writes P in place and, if asked, LSE = m + log(l).
constexpr int kSoftmaxThreads = 256;

__device__ float block_reduce(float x, bool is_max) {
  __shared__ float partial[kSoftmaxThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // a previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = x;
  __syncthreads();  // every warp's partial is written
  x = partial[0];
  for (int w = 1; w < kSoftmaxThreads / 32; ++w) x = is_max ? fmaxf(x, partial[w]) : x + partial[w];
  return x;
}

__global__ void softmax_kernel(float* s, int64_t n_kv, float* lse) {
  float* row = s + blockIdx.x * n_kv;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_reduce(m, true);
  if (m == -INFINITY) {  // the mask hid every key: O = 0 and LSE = -inf, never 0/0 = NaN
    for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) row[j] = 0.f;
    if (lse && threadIdx.x == 0) lse[blockIdx.x] = -INFINITY;
    return;
  }
  float l = 0.f;
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) {
    const float e = expf(row[j] - m);
    row[j] = e;
    l += e;
  }
  l = block_reduce(l, false);
  const float inv_l = 1.f / l;
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) row[j] *= inv_l;
  if (lse && threadIdx.x == 0) lse[blockIdx.x] = m + logf(l);
}

// Kernel 3: one thread per output element o[b, h, i, d] = Σ_j P[i, j] · v[j, d], fp32 sum.
__global__ void pv_kernel(AttentionParams p, const float* probs) {
  const int64_t total = p.batch * p.heads_q * p.seqlen_q * p.head_dim;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = idx % p.head_dim;
    const int64_t row = idx / p.head_dim;  // (b, h, i) flattened, the row of P
    const int64_t i = row % p.seqlen_q;
    const int64_t h = (row / p.seqlen_q) % p.heads_q;
    const int64_t b = row / (p.seqlen_q * p.heads_q);
    const int64_t hk = kv_head_of(h, p.heads_q, p.heads_kv);
    const bf16* v = static_cast<const bf16*>(p.v) + b * p.v_stride.batch + hk * p.v_stride.head + d;
    const float* pr = probs + row * p.seqlen_kv;
    float acc = 0.f;
    for (int64_t j = 0; j < p.seqlen_kv; ++j) acc += pr[j] * __bfloat162float(v[j * p.v_stride.seq]);
    bf16* o = static_cast<bf16*>(p.o) + b * p.o_stride.batch + h * p.o_stride.head + i * p.o_stride.seq + d;
    *o = __float2bfloat16_rn(acc);
  }
}

unsigned grid_for(int64_t n, int threads) {
  return unsigned(std::min<int64_t>(cdiv(n, threads), 1 << 20));
}

const Capabilities kCaps = [] {
  Capabilities c;
  c.head_dims = {64, 128};
  c.causal = true;
  c.lse = true;
  c.gqa = true;
  c.max_seqlen = kTileMaxSeqlen;  // N_q·N_kv scores per head stay far inside 64 bits
  c.max_work_tiles = kMaxGridX;   // the softmax kernel's grid: one block per query row
  return c;
}();

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  const int64_t n_scores = rows * p.seqlen_kv;
  float* s = nullptr;  // (B, H_q, N_q, N_kv) fp32: the O(N²) buffer this step is about
  FA_CUDA_RETURN(cudaMallocAsync(reinterpret_cast<void**>(&s), size_t(n_scores) * sizeof(float), stream));

  scores_kernel<<<grid_for(n_scores, 256), 256, 0, stream>>>(p, p.effective_scale(), p.causal_offset(), s);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    softmax_kernel<<<unsigned(rows), kSoftmaxThreads, 0, stream>>>(s, p.seqlen_kv, p.lse);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    pv_kernel<<<grid_for(rows * p.head_dim, 256), 256, 0, stream>>>(p, s);
    err = cudaGetLastError();
  }
  FA_CUDA_RETURN(cudaFreeAsync(s, stream));  // stream-ordered: freed after pv_kernel has read it
  FA_CUDA_RETURN(err);
  return Status::Ok();
}

FA_REGISTER_STEP({0, "naive", /*base=*/-1, "S = QKᵀ in global memory, row softmax, O = PV: the O(N²) baseline", kCaps,
                  &forward, ""})

}  // namespace fa::step00
