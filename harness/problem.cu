#include "harness/problem.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "harness/random.h"

namespace fa {
namespace {

enum Tensor : uint64_t { kQ = 1, kK = 2, kV = 3 };

// Decodes the storage index of element (b, h, n, d) for a contiguous tensor in either layout.
struct LayoutDecode {
  int64_t heads, seqlen, dim;
  bool bnhd;
  __device__ void operator()(int64_t idx, int64_t& b, int64_t& h, int64_t& n, int64_t& d) const {
    d = idx % dim;
    int64_t r = idx / dim;
    if (bnhd) {
      h = r % heads;
      r /= heads;
      n = r % seqlen;
      b = r / seqlen;
    } else {
      n = r % seqlen;
      r /= seqlen;
      h = r % heads;
      b = r / heads;
    }
  }
};

__global__ void generate_kernel(__nv_bfloat16* out, int64_t count, LayoutDecode dec, InputKind kind, uint64_t seed,
                                uint64_t tensor) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < count;
       idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t b, h, n, d;
    dec(idx, b, h, n, d);
    // The logical index (b, h, n, d) seeds the value, so both layouts hold the same tensor.
    uint64_t logical = ((uint64_t(b) * dec.heads + h) * dec.seqlen + n) * dec.dim + d;
    float x = normal_at(seed * 4 + tensor, logical);
    switch (kind) {
      case InputKind::random:
        break;
      case InputKind::large_logits:
        if (tensor != kV) x *= 10.0f;
        break;
      case InputKind::identity_qk:
        if (tensor != kV) x = (d == n % dec.dim) ? 4.0f : 0.0f;
        break;
      case InputKind::v_ramp:
        if (tensor == kV) x = float(d) / float(dec.dim) + 0.01f * float(n) / float(dec.seqlen);
        break;
    }
    out[idx] = __float2bfloat16_rn(x);
  }
}

void generate(DeviceBuffer<__nv_bfloat16>& buf, const ProblemShape& s, int64_t heads, int64_t seqlen, uint64_t tensor) {
  LayoutDecode dec{heads, seqlen, s.head_dim, s.layout == Layout::bnhd};
  int64_t count = static_cast<int64_t>(buf.size());
  int blocks = static_cast<int>(std::min<int64_t>(cdiv(count, 256), 65535));
  generate_kernel<<<blocks, 256>>>(buf.get(), count, dec, s.input, s.seed, tensor);
  FA_CUDA_CHECK(cudaGetLastError());
}

Strides layout_strides(Layout l, int64_t heads, int64_t seqlen, int64_t dim) {
  return l == Layout::bnhd ? bnhd_strides(heads, seqlen, dim) : bhnd_strides(heads, seqlen, dim);
}

}  // namespace

std::string to_string(InputKind k) {
  switch (k) {
    case InputKind::random:
      return "random";
    case InputKind::large_logits:
      return "large_logits";
    case InputKind::identity_qk:
      return "identity_qk";
    case InputKind::v_ramp:
      return "v_ramp";
  }
  return "?";
}

std::string to_string(const ProblemShape& s) {
  std::ostringstream os;
  os << "B=" << s.batch << " Hq=" << s.heads_q << " Hkv=" << s.heads_kv << " Nq=" << s.seqlen_q
     << " Nkv=" << s.seqlen_kv << " D=" << s.head_dim << (s.causal ? " causal" : "")
     << (s.causal && s.align == CausalAlign::bottom_right ? "(bottom-right)" : "")
     << (s.layout == Layout::bnhd ? " bnhd" : "") << " input=" << to_string(s.input) << " seed=" << s.seed;
  return os.str();
}

AttentionProblem::AttentionProblem(const ProblemShape& s)
    : q(size_t(s.batch * s.heads_q * s.seqlen_q * s.head_dim)),
      k(size_t(s.batch * s.heads_kv * s.seqlen_kv * s.head_dim)),
      v(size_t(s.batch * s.heads_kv * s.seqlen_kv * s.head_dim)),
      o(size_t(s.batch * s.heads_q * s.seqlen_q * s.head_dim)),
      lse_buf(s.with_lse ? size_t(s.batch * s.heads_q * s.seqlen_q) : 0),
      shape_(s) {
  generate(q, s, s.heads_q, s.seqlen_q, kQ);
  generate(k, s, s.heads_kv, s.seqlen_kv, kK);
  generate(v, s, s.heads_kv, s.seqlen_kv, kV);
  poison_outputs();
  FA_CUDA_CHECK(cudaDeviceSynchronize());
}

AttentionParams shape_params(const ProblemShape& s) {
  AttentionParams p;
  p.batch = s.batch;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.seqlen_q = s.seqlen_q;
  p.seqlen_kv = s.seqlen_kv;
  p.head_dim = s.head_dim;
  p.q_stride = layout_strides(s.layout, s.heads_q, s.seqlen_q, s.head_dim);
  p.k_stride = layout_strides(s.layout, s.heads_kv, s.seqlen_kv, s.head_dim);
  p.v_stride = layout_strides(s.layout, s.heads_kv, s.seqlen_kv, s.head_dim);
  p.o_stride = layout_strides(s.layout, s.heads_q, s.seqlen_q, s.head_dim);
  p.softmax_scale = s.softmax_scale;
  p.causal = s.causal;
  p.causal_align = s.align;
  return p;
}

AttentionParams validation_params(const ProblemShape& s) {
  // Stand-in addresses 2^44 bytes (16 TiB) apart: aligned, far enough apart that no tensor the
  // CLI can describe makes them overlap (validation refuses an O that overlaps an input), and
  // never dereferenced.
  auto stand_in = [](uintptr_t slot) { return reinterpret_cast<void*>(slot << 44); };
  AttentionParams p = shape_params(s);
  p.q = stand_in(1);
  p.k = stand_in(2);
  p.v = stand_in(3);
  p.o = stand_in(4);
  return p;
}

AttentionParams AttentionProblem::params() const {
  AttentionParams p = shape_params(shape_);
  p.q = q.get();
  p.k = k.get();
  p.v = v.get();
  p.o = o.get();
  p.lse = shape_.with_lse ? lse_buf.get() : nullptr;
  return p;
}

void AttentionProblem::poison_outputs() {
  o.poison();
  lse_buf.poison();
}

std::vector<float> to_float(const DeviceBuffer<__nv_bfloat16>& buf) {
  std::vector<__nv_bfloat16> raw = buf.download();
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = __bfloat162float(raw[i]);
  return out;
}

std::vector<float> to_float(const DeviceBuffer<__nv_bfloat16>& buf, size_t offset, size_t count) {
  if (offset + count > buf.size()) throw std::out_of_range("to_float: slice outside the buffer");
  std::vector<__nv_bfloat16> raw(count);
  FA_CUDA_CHECK(cudaMemcpy(raw.data(), buf.get() + offset, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = __bfloat162float(raw[i]);
  return out;
}

std::vector<float> AttentionProblem::host_q() const {
  return to_float(q);
}
std::vector<float> AttentionProblem::host_k() const {
  return to_float(k);
}
std::vector<float> AttentionProblem::host_v() const {
  return to_float(v);
}

std::vector<float> AttentionProblem::output_bhnd() const {
  std::vector<float> raw = to_float(o);
  if (shape_.layout == Layout::bhnd) return raw;
  const ProblemShape& s = shape_;
  Strides st = params().o_stride;
  std::vector<float> out(raw.size());
  size_t idx = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t n = 0; n < s.seqlen_q; ++n)
        for (int64_t d = 0; d < s.head_dim; ++d)
          out[idx++] = raw[size_t(b * st.batch + h * st.head + n * st.seq + d * st.dim)];
  return out;
}

std::vector<float> AttentionProblem::lse() const {
  return lse_buf.download();
}

}  // namespace fa
