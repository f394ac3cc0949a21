// The input validation every step shares: one function, called by every step's forward and by the
// C interface, so the two can never disagree about what is accepted.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "fa/registry.h"

namespace fa {
namespace {

// No iostreams on the library's paths (see library/autotune.cpp): plain string building only.
std::string list_dims(const std::vector<int>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s;
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

using u128 = unsigned __int128;

// Bytes from a tensor's first element to one past its last: (Σ (size − 1)·stride + 1) elements of
// `elem_bytes`, in 128 bits so that no input can overflow it. A dimension of size 1 never steps,
// so its stride does not count (PyTorch gives such dimensions arbitrary strides).
u128 extent_bytes(int64_t b, int64_t h, int64_t n, int64_t d, const Strides& s, int elem_bytes) {
  auto step = [](int64_t size, int64_t stride) { return size > 1 ? u128(size - 1) * u128(uint64_t(stride)) : u128(0); };
  return (step(b, s.batch) + step(h, s.head) + step(n, s.seq) + step(d, s.dim) + 1) * u128(elem_bytes);
}

bool overlaps(const void* a, u128 a_bytes, const void* b, u128 b_bytes) {
  const u128 a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

}  // namespace

Status validate(const AttentionParams& p, const Capabilities& caps) {
  auto fail = [](const std::string& m) { return Status::Unsupported("invalid attention input: " + m); };
  if (!p.q || !p.k || !p.v || !p.o) return fail("q, k, v and o must be non-null device pointers");
  if (p.batch < 1 || p.heads_q < 1 || p.heads_kv < 1 || p.seqlen_q < 1 || p.seqlen_kv < 1)
    return fail("B, H_q, H_kv, N_q and N_kv must all be >= 1 (got B=" + std::to_string(p.batch) +
                " H_q=" + std::to_string(p.heads_q) + " H_kv=" + std::to_string(p.heads_kv) +
                " N_q=" + std::to_string(p.seqlen_q) + " N_kv=" + std::to_string(p.seqlen_kv) + ")");
  // Compared in 64 bits: a head dim that equals a supported one only after truncation to int is
  // not supported.
  if (std::none_of(caps.head_dims.begin(), caps.head_dims.end(), [&](int d) { return int64_t(d) == p.head_dim; }))
    return fail("head dim " + std::to_string(p.head_dim) +
                " is not supported; supported: " + list_dims(caps.head_dims));
  if (p.heads_q % p.heads_kv != 0)
    return fail("H_q (" + std::to_string(p.heads_q) + ") must be a multiple of H_kv (" + std::to_string(p.heads_kv) +
                ")");
  if (p.heads_kv != p.heads_q && !caps.gqa) return fail("this step does not support H_kv < H_q");
  if (p.dtype != DType::bf16) return fail("only bf16 is supported");
  if (p.causal && !caps.causal) return fail("this step does not support the causal mask");
  if (p.lse && !caps.lse) return fail("this step does not write LSE; pass lse = nullptr");
  if (!(p.effective_scale() > 0.0f) || !std::isfinite(p.effective_scale()))
    return fail("softmax scale must be positive and finite");
  const Strides* all[4] = {&p.q_stride, &p.k_stride, &p.v_stride, &p.o_stride};
  const char* names[4] = {"q", "k", "v", "o"};
  for (int t = 0; t < 4; ++t) {
    const Strides& s = *all[t];
    const bool q_side = t == 0 || t == 3;  // Q and O are (B, H_q, N_q, D); K and V (B, H_kv, N_kv, D)
    const int64_t sizes[3] = {p.batch, q_side ? p.heads_q : p.heads_kv, q_side ? p.seqlen_q : p.seqlen_kv};
    const int64_t strides[3] = {s.batch, s.head, s.seq};
    const char* axes[3] = {"batch", "head", "sequence"};
    if (s.dim != 1) return fail(std::string(names[t]) + " must have unit stride along the head dim");
    for (int a = 0; a < 3; ++a) {
      if (sizes[a] == 1) continue;  // never stepped along: any stride will do
      if (strides[a] < 0) return fail(std::string(names[t]) + " strides must be >= 0");
      if (strides[a] == 0 && t != 3 && !caps.broadcast)
        return fail(std::string(names[t]) + " has a zero " + axes[a] +
                    " stride (a broadcast); this step reads its inputs through TMA tensor maps, which need "
                    "one row per " +
                    axes[a] + " entry");
      // 16-byte rows: every step loads a row of D bf16 values with 16-byte vector loads.
      if (strides[a] % 8)
        return fail(std::string(names[t]) + " strides must be multiples of 8 elements (16-byte aligned rows)");
      // An input may broadcast (stride 0: one K/V shared by every batch entry); an output may not,
      // or two rows of O would be written to the same place.
      if (t == 3 && strides[a] == 0)
        return fail(std::string("o must not have a zero ") + axes[a] + " stride (its " + axes[a] +
                    " entries would overwrite each other)");
    }
  }
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o))
    return fail("q, k, v and o must be 16-byte aligned");
  if (p.lse && (reinterpret_cast<uintptr_t>(p.lse) & 3u) != 0)
    return fail("lse must be 4-byte aligned (a contiguous (B, H_q, N_q) fp32 array)");
  // The kernels read Q, K, V while other blocks already write O: O must share no byte with them.
  const u128 o_bytes = extent_bytes(p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.o_stride, 2);
  const u128 q_bytes = extent_bytes(p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.q_stride, 2);
  const u128 k_bytes = extent_bytes(p.batch, p.heads_kv, p.seqlen_kv, p.head_dim, p.k_stride, 2);
  const u128 v_bytes = extent_bytes(p.batch, p.heads_kv, p.seqlen_kv, p.head_dim, p.v_stride, 2);
  if (overlaps(p.o, o_bytes, p.q, q_bytes) || overlaps(p.o, o_bytes, p.k, k_bytes) ||
      overlaps(p.o, o_bytes, p.v, v_bytes))
    return fail("o overlaps q, k or v: the output must be a separate buffer (no in-place attention)");
  if (p.lse) {
    const u128 lse_bytes = u128(uint64_t(p.batch * p.heads_q * p.seqlen_q)) * 4;
    if (overlaps(p.lse, lse_bytes, p.o, o_bytes) || overlaps(p.lse, lse_bytes, p.q, q_bytes) ||
        overlaps(p.lse, lse_bytes, p.k, k_bytes) || overlaps(p.lse, lse_bytes, p.v, v_bytes))
      return fail("lse overlaps q, k, v or o: it must be a separate buffer");
  }
  // Launch limits of the step's kernels, here rather than in its launcher, so that fa_validate
  // accepts exactly what forward accepts.
  if (caps.max_seqlen > 0 && (p.seqlen_q > caps.max_seqlen || p.seqlen_kv > caps.max_seqlen))
    return fail("N_q and N_kv must be at most " + std::to_string(caps.max_seqlen) + " for this step (got N_q=" +
                std::to_string(p.seqlen_q) + ", N_kv=" + std::to_string(p.seqlen_kv) + ")");
  if (caps.max_batch_heads > 0 && p.batch * p.heads_q > caps.max_batch_heads)
    return fail("B·H_q must be at most " + std::to_string(caps.max_batch_heads) + " for this step (got " +
                std::to_string(p.batch * p.heads_q) + ")");
  if (caps.max_tensor_elements > 0) {
    int64_t largest = std::max(p.batch * p.heads_q * p.seqlen_q, p.batch * p.heads_kv * p.seqlen_kv) * p.head_dim;
    if (largest > caps.max_tensor_elements)
      return fail("tensors of " + std::to_string(largest) + " elements exceed this step's limit of " +
                  std::to_string(caps.max_tensor_elements));
  }
  return Status::Ok();
}

Status check_device(const Capabilities& caps) {
  if (caps.only_sm == 0) return Status::Ok();
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();  // leave no sticky error behind
    return Status::Unsupported("this step needs a GPU of compute capability " + std::to_string(caps.only_sm / 10) +
                               "." + std::to_string(caps.only_sm % 10) + " and no CUDA device is usable");
  }
  if (major * 10 + minor != caps.only_sm)
    return Status::Unsupported("this step's kernels are built for compute capability " +
                               std::to_string(caps.only_sm / 10) + "." + std::to_string(caps.only_sm % 10) +
                               " only (sm_" + std::to_string(caps.only_sm) + "a: H100, H200); this GPU is " +
                               std::to_string(major) + "." + std::to_string(minor));
  return Status::Ok();
}

}  // namespace fa
