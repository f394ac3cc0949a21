#include "harness/problem.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "harness/random.h"

namespace fa {
namespace {

enum Tensor : uint64_t { kQ = 1, kK = 2, kV = 3 };

// Writes element (b, h, n, d) of a tensor through its strides, for every logical index, rounded to
// the problem's element type (round to nearest even, as the kernels round P and O).
__global__ void generate_kernel(__nv_bfloat16* out, int64_t heads, int64_t seqlen, int64_t dim, Strides st,
                                InputKind kind, uint64_t seed, uint64_t tensor, int64_t count, DType dtype) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < count;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = idx % dim, n = idx / dim % seqlen, h = idx / (dim * seqlen) % heads,
                  b = idx / (dim * seqlen * heads);
    // The logical index (b, h, n, d) seeds the value, so every layout holds the same tensor.
    float x = normal_at(seed * 4 + tensor, uint64_t(idx));
    switch (kind) {
      case InputKind::random:
        break;
      case InputKind::large_logits:
        if (tensor != kV) x *= 10.0f;
        break;
      case InputKind::identity_qk:
        if (tensor != kV) x = (d == n % dim) ? 4.0f : 0.0f;
        break;
      case InputKind::v_ramp:
        if (tensor == kV) x = float(d) / float(dim) + 0.01f * float(n) / float(seqlen);
        break;
      case InputKind::flat_large_v:
        if (tensor == kQ) x = 0.0f;
        if (tensor == kV) x += 16.0f;
        break;
    }
    __nv_bfloat16* at = out + b * st.batch + h * st.head + n * st.seq + d * st.dim;
    if (dtype == DType::fp16)
      *reinterpret_cast<__half*>(at) = __float2half_rn(x);
    else
      *at = __float2bfloat16_rn(x);
  }
}

void generate(GuardedBuffer<__nv_bfloat16>& buf, const ProblemShape& s, int64_t heads, int64_t seqlen,
              const Strides& st, uint64_t tensor) {
  const int64_t count = s.batch * heads * seqlen * s.head_dim;
  const int blocks = static_cast<int>(std::min<int64_t>(cdiv(count, 256), 65535));
  generate_kernel<<<blocks, 256>>>(buf.get(), heads, seqlen, s.head_dim, st, s.input, s.seed, tensor, count, s.dtype);
  FA_CUDA_CHECK(cudaGetLastError());
}

// The strides of a tensor of `rows` allocated rows per (batch, head) ((B, H, N, D)) or per batch
// ((B, N, H, D)), with `gap` extra elements after every row.
Strides layout_strides(Layout l, int64_t heads, int64_t rows, int64_t dim, int64_t gap) {
  if (l == Layout::bnhd) {
    const int64_t row = heads * dim + gap;
    return Strides{rows * row, dim, row, 1};
  }
  const int64_t row = dim + gap;
  return Strides{heads * rows * row, rows * row, row, 1};
}

// Elements a tensor with these strides spans: `batch` batch strides.
size_t span(int64_t batch, const Strides& st) {
  return size_t(batch * st.batch);
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
    case InputKind::flat_large_v:
      return "flat_large_v";
  }
  return "?";
}

std::string to_string(const ProblemShape& s) {
  std::ostringstream os;
  os << "B=" << s.batch << " Hq=" << s.heads_q << " Hkv=" << s.heads_kv << " Nq=" << s.seqlen_q
     << " Nkv=" << s.seqlen_kv << " D=" << s.head_dim << (s.causal ? " causal" : "")
     << (s.causal && s.align == CausalAlign::bottom_right ? "(bottom-right)" : "")
     << (s.layout == Layout::bnhd ? " bnhd" : "");
  if (s.dtype != DType::bf16) os << " " << dtype_name(s.dtype);
  os << " input=" << to_string(s.input) << " seed=" << s.seed;
  if (s.row_gap != 0) os << " row_gap=" << s.row_gap;
  if (s.window_left >= 0 || s.window_right >= 0)
    os << " window=(" << s.window_left << ", " << s.window_right << ")"
       << (s.align == CausalAlign::bottom_right ? " bottom-right" : " top-left");
  if (s.softcap != 0.0f) os << " softcap=" << s.softcap;
  if (s.alibi != ProblemShape::Alibi::none)
    os << (s.alibi == ProblemShape::Alibi::per_head ? " alibi(per head)" : " alibi(per batch, head)");
  if (s.sinks) os << " sinks";
  return os.str();
}

AttentionProblem::AttentionProblem(const ProblemShape& s) : shape_(s) {
  const AttentionParams p = shape_params(s);
  q = GuardedBuffer<__nv_bfloat16>(span(s.batch, p.q_stride));
  k = GuardedBuffer<__nv_bfloat16>(span(s.batch, p.k_stride));
  v = GuardedBuffer<__nv_bfloat16>(span(s.batch, p.v_stride));
  o = GuardedBuffer<__nv_bfloat16>(span(s.batch, p.o_stride));
  lse_buf = GuardedBuffer<float>(s.with_lse ? size_t(s.batch * s.heads_q * s.seqlen_q) : 0);
  generate(q, s, s.heads_q, s.seqlen_q, p.q_stride, kQ);
  generate(k, s, s.heads_kv, s.seqlen_kv, p.k_stride, kK);
  generate(v, s, s.heads_kv, s.seqlen_kv, p.v_stride, kV);
  if (s.alibi != ProblemShape::Alibi::none) {
    const int64_t batches = s.alibi == ProblemShape::Alibi::per_batch_head ? s.batch : 1;
    for (int64_t b = 0; b < batches; ++b)
      for (int64_t h = 0; h < s.heads_q; ++h)
        alibi_slopes_host.push_back(std::exp2(-8.0f * float(h + 1) / float(s.heads_q)) * (1.0f + 0.25f * float(b)));
    alibi_slopes = DeviceBuffer<float>(alibi_slopes_host.size());
    alibi_slopes.upload(alibi_slopes_host);
  }
  if (s.sinks) {
    for (int64_t h = 0; h < s.heads_q; ++h)
      sinks_host.push_back(std::log(float(s.seqlen_kv)) + 2.0f * normal_at(mix64(s.seed ^ 0x5111C5ull), uint64_t(h)));
    sinks = DeviceBuffer<float>(sinks_host.size());
    sinks.upload(sinks_host);
  }
  FA_CUDA_CHECK(cudaDeviceSynchronize());
}

ProblemShape make_shape(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nkv, int64_t d, bool causal,
                        CausalAlign align) {
  ProblemShape s;
  s.batch = b;
  s.heads_q = h;
  s.heads_kv = hkv;
  s.seqlen_q = nq;
  s.seqlen_kv = nkv;
  s.head_dim = d;
  s.causal = causal;
  s.align = align;
  return s;
}

AttentionParams shape_params(const ProblemShape& s) {
  AttentionParams p;
  p.batch = s.batch;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.seqlen_q = s.seqlen_q;
  p.seqlen_kv = s.seqlen_kv;
  p.head_dim = s.head_dim;
  p.q_stride = layout_strides(s.layout, s.heads_q, s.seqlen_q, s.head_dim, s.row_gap);
  p.k_stride = layout_strides(s.layout, s.heads_kv, s.seqlen_kv + s.kv_pad_rows, s.head_dim, s.row_gap);
  p.v_stride = p.k_stride;
  p.o_stride = layout_strides(s.layout, s.heads_q, s.seqlen_q, s.head_dim, s.row_gap);
  p.softmax_scale = s.softmax_scale;
  p.causal = s.causal;
  p.causal_align = s.align;
  p.window_left = s.window_left;
  p.window_right = s.window_right;
  p.softcap = s.softcap;
  p.alibi_slopes_stride_batch = s.alibi == ProblemShape::Alibi::per_batch_head ? s.heads_q : 0;
  p.dtype = s.dtype;
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
  if (s.alibi != ProblemShape::Alibi::none) p.alibi_slopes = static_cast<const float*>(stand_in(5));
  if (s.sinks) p.sinks = static_cast<const float*>(stand_in(6));
  return p;
}

AttentionParams AttentionProblem::params() const {
  AttentionParams p = shape_params(shape_);
  p.q = q.get();
  p.k = k.get();
  p.v = v.get();
  p.o = o.get();
  p.lse = shape_.with_lse ? lse_buf.get() : nullptr;
  p.alibi_slopes = alibi_slopes.get();  // nullptr unless the shape asks
  p.sinks = sinks.get();
  return p;
}

void AttentionProblem::poison_outputs() {
  o.poison();
  lse_buf.poison();
}

namespace {
// Counts the elements of `o` outside the logical (B, H, N, D) tensor (the row gaps) that are not
// the poison (0xFFFF); the first one's storage index goes to *first. Every row starts at a
// multiple of the sequence stride in both layouts, and its first `row` elements are data.
int64_t written_gaps(const std::vector<uint16_t>& raw, const ProblemShape& s, const Strides& st, int64_t* first) {
  const int64_t row = s.layout == Layout::bnhd ? s.heads_q * s.head_dim : s.head_dim;
  int64_t n = 0;
  for (size_t start = 0; start < raw.size(); start += size_t(st.seq))
    for (size_t i = start + size_t(row); i < std::min(raw.size(), start + size_t(st.seq)); ++i)
      if (raw[i] != 0xFFFF && n++ == 0) *first = int64_t(i);
  return n;
}
}  // namespace

bool AttentionProblem::memory_intact(std::string* why) const {
  const std::pair<const char*, const GuardedBuffer<__nv_bfloat16>*> tensors[] = {
      {"Q", &q}, {"K", &k}, {"V", &v}, {"O", &o}};
  std::string where;
  for (const auto& [name, t] : tensors)
    if (!t->guards_intact(&where)) {
      if (why) *why = std::string(name) + ": " + where;
      return false;
    }
  if (!lse_buf.guards_intact(&where)) {
    if (why) *why = "LSE: " + where;
    return false;
  }
  if (shape_.row_gap > 0) {
    int64_t first = -1;
    std::vector<uint16_t> raw(o.size());
    FA_CUDA_CHECK(cudaMemcpy(raw.data(), o.get(), o.bytes(), cudaMemcpyDeviceToHost));
    const int64_t n = written_gaps(raw, shape_, params().o_stride, &first);
    if (n > 0) {
      if (why)
        *why = "O: " + std::to_string(n) + " elements of the row gaps were written, the first at storage index " +
               std::to_string(first);
      return false;
    }
  }
  return true;
}

std::vector<float> to_float(const DeviceBuffer<__nv_bfloat16>& buf) {
  std::vector<__nv_bfloat16> raw = buf.download();
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = __bfloat162float(raw[i]);
  return out;
}

std::vector<float> to_float(const GuardedBuffer<__nv_bfloat16>& buf) {
  std::vector<__nv_bfloat16> raw = buf.download();
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = __bfloat162float(raw[i]);
  return out;
}

__nv_bfloat16 float_to_element(float x, DType t) {
  if (t != DType::fp16) return __float2bfloat16_rn(x);
  const __half h = __float2half_rn(x);
  __nv_bfloat16 out;
  std::memcpy(&out, &h, sizeof out);
  return out;
}

float element_to_float(uint16_t bits, DType t) {
  if (t == DType::fp16) {
    __half_raw h;
    h.x = bits;
    return __half2float(__half(h));
  }
  __nv_bfloat16_raw b;
  b.x = bits;
  return __bfloat162float(__nv_bfloat16(b));
}

std::vector<float> to_float(const GuardedBuffer<__nv_bfloat16>& buf, DType t) {
  if (t == DType::bf16) return to_float(buf);
  std::vector<__nv_bfloat16> raw = buf.download();
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, &raw[i], sizeof bits);
    out[i] = element_to_float(bits, t);
  }
  return out;
}

std::vector<float> AttentionProblem::head_rows(const GuardedBuffer<__nv_bfloat16>& t, const Strides& st, int64_t b,
                                               int64_t h, int64_t rows) const {
  const int64_t D = shape_.head_dim;
  const int64_t start = b * st.batch + h * st.head, count = (rows - 1) * st.seq + D;
  if (rows <= 0 || start + count > int64_t(t.size())) throw std::out_of_range("head_rows: outside the tensor");
  std::vector<__nv_bfloat16> raw(static_cast<size_t>(count));
  FA_CUDA_CHECK(cudaMemcpy(raw.data(), t.get() + start, raw.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  std::vector<float> out(size_t(rows * D));
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t d = 0; d < D; ++d) {
      uint16_t bits;
      std::memcpy(&bits, &raw[size_t(n * st.seq + d)], sizeof bits);
      out[size_t(n * D + d)] = element_to_float(bits, shape_.dtype);
    }
  return out;
}

std::vector<float> AttentionProblem::host_q() const {
  return to_float(q, shape_.dtype);
}
std::vector<float> AttentionProblem::host_k() const {
  return to_float(k, shape_.dtype);
}
std::vector<float> AttentionProblem::host_v() const {
  return to_float(v, shape_.dtype);
}

std::vector<float> AttentionProblem::output_bhnd() const {
  const ProblemShape& s = shape_;
  if (s.layout == Layout::bhnd && s.row_gap == 0) return to_float(o, s.dtype);
  const std::vector<__nv_bfloat16> raw = o.download();
  const Strides st = params().o_stride;
  std::vector<float> out(size_t(s.batch * s.heads_q * s.seqlen_q * s.head_dim));
  size_t idx = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t n = 0; n < s.seqlen_q; ++n)
        for (int64_t d = 0; d < s.head_dim; ++d) {
          uint16_t bits;
          std::memcpy(&bits, &raw[size_t(b * st.batch + h * st.head + n * st.seq + d * st.dim)], sizeof bits);
          out[idx++] = element_to_float(bits, s.dtype);
        }
  return out;
}

std::vector<float> AttentionProblem::lse() const {
  return lse_buf.download();
}

BackwardParams contiguous_backward_params(const AttentionParams& fwd, const void* d_o, void* dq, void* dk, void* dv,
                                          void* workspace, size_t workspace_bytes) {
  BackwardParams bp;
  bp.fwd = fwd;
  bp.d_o = d_o;
  bp.dq = dq;
  bp.dk = dk;
  bp.dv = dv;
  bp.do_stride = bp.dq_stride = bhnd_strides(fwd.heads_q, fwd.seqlen_q, fwd.head_dim);
  bp.dk_stride = bp.dv_stride = bhnd_strides(fwd.heads_kv, fwd.seqlen_kv, fwd.head_dim);
  bp.workspace = workspace;
  bp.workspace_bytes = workspace_bytes;
  return bp;
}

}  // namespace fa
