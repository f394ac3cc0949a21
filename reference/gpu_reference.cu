#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>

#include "device/mask.h"
#include "reference/gpu_reference.h"

namespace fa {
namespace {

constexpr int kMaxHeadDim = 256;

// An input element as fp32 (exact for both types).
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

// T: the inputs' element type, bf16 or fp16 (p.dtype).
template <typename T>
__global__ void reference_kernel(AttentionParams p, float scale, int64_t offset, float* o_out, float* lse_out) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // (b, h, i) flattened
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  if (row >= rows) return;
  const int64_t i = row % p.seqlen_q;
  const int64_t h = (row / p.seqlen_q) % p.heads_q;
  const int64_t b = row / (p.seqlen_q * p.heads_q);
  const int64_t hk = kv_head_of(h, p.heads_q, p.heads_kv);
  const int64_t D = p.head_dim;
  const T* q = static_cast<const T*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head + i * p.q_stride.seq;
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride.batch + hk * p.k_stride.head;
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride.batch + hk * p.v_stride.head;
  // Keys [j0, j0 + n_keys): the causal prefix, and the window's two edges where it has them.
  const KeyRange keys = visible_key_range(i, p.seqlen_kv, offset, p.causal, p.window_left, p.window_right);
  const int64_t j0 = keys.begin, n_keys = keys.end - keys.begin;

  // The score modifications (include/fa/params.h), in their order: the cap on the scaled score,
  // then ALiBi's bias, aligned bottom-right whatever causal_align says.
  const float slope = p.alibi_slopes ? p.alibi_slopes[b * p.alibi_slopes_stride_batch + h] : 0.f;
  const int64_t alibi_offset = p.seqlen_kv - p.seqlen_q;
  auto score = [&](int64_t j) {
    float dot = 0.f;
    for (int64_t d = 0; d < D; ++d) dot += to_float(q[d]) * to_float(k[j * p.k_stride.seq + d]);
    float x = scale * dot;
    if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
    if (p.alibi_slopes) x -= slope * fabsf(float(i + alibi_offset - j));
    return x;
  };

  // Pass 1: the row max (the sink's logit among the scores).
  const float sink = p.sinks ? p.sinks[h] : -INFINITY;
  float m = sink;
  for (int64_t j = j0; j < j0 + n_keys; ++j) m = fmaxf(m, score(j));
  // Pass 2: exp-sum and the weighted sum of V rows.
  float acc[kMaxHeadDim];
  for (int64_t d = 0; d < D; ++d) acc[d] = 0.f;
  const bool has_sink = sink > -INFINITY;     // a sink of −inf is none
  float l = has_sink ? expf(sink - m) : 0.f;  // the sink: in the denominator, nothing in O
  for (int64_t j = j0; j < j0 + n_keys; ++j) {
    const float pj = expf(score(j) - m);
    l += pj;
    for (int64_t d = 0; d < D; ++d) acc[d] += pj * to_float(v[j * p.v_stride.seq + d]);
  }
  float* o = o_out + row * D;
  const bool any = n_keys > 0 || has_sink;  // a row with no key but a sink: O = 0, LSE = the sink
  for (int64_t d = 0; d < D; ++d) o[d] = any ? acc[d] / l : 0.f;
  if (lse_out) lse_out[row] = any ? m + logf(l) : -INFINITY;
}

}  // namespace

Status gpu_reference(const AttentionParams& p, float* o_out, float* lse_out, cudaStream_t stream) {
  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim) return Status::Error("gpu_reference: head dim must be in [1, 256]");
  if (!p.q || !p.k || !p.v || !o_out) return Status::Error("gpu_reference: null pointer");
  if (!(p.softcap >= 0.0f)) return Status::Error("gpu_reference: softcap must be 0 or positive");
  if (!dtype_known(p.dtype)) return Status::Error("gpu_reference: " + dtype_name(p.dtype) + " is not an element type");
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  const int threads = 128;
  const auto kernel = p.dtype == DType::fp16 ? reference_kernel<__half> : reference_kernel<__nv_bfloat16>;
  kernel<<<unsigned(cdiv(rows, threads)), threads, 0, stream>>>(p, p.effective_scale(), p.causal_offset(), o_out,
                                                                lse_out);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess)
    return Status::Error(std::string("gpu_reference: launch failed: ") + cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace fa
