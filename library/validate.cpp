// The input validation every step shares: one function, called by every step's forward and by the
// C interface, so the two can never disagree about what is accepted.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

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

}  // namespace

Status validate(const AttentionParams& p, const Capabilities& caps) {
  auto fail = [](const std::string& m) { return Status::Error("invalid attention input: " + m); };
  if (!p.q || !p.k || !p.v || !p.o) return fail("q, k, v and o must be non-null device pointers");
  if (p.batch < 1 || p.heads_q < 1 || p.heads_kv < 1 || p.seqlen_q < 1 || p.seqlen_kv < 1)
    return fail("B, H_q, H_kv, N_q and N_kv must all be >= 1 (got B=" + std::to_string(p.batch) +
                " H_q=" + std::to_string(p.heads_q) + " H_kv=" + std::to_string(p.heads_kv) +
                " N_q=" + std::to_string(p.seqlen_q) + " N_kv=" + std::to_string(p.seqlen_kv) + ")");
  if (std::find(caps.head_dims.begin(), caps.head_dims.end(), int(p.head_dim)) == caps.head_dims.end())
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
    if (s.dim != 1) return fail(std::string(names[t]) + " must have unit stride along the head dim");
    if (s.batch < 0 || s.head < 0 || s.seq < 0) return fail(std::string(names[t]) + " strides must be >= 0");
    // 16-byte rows: every step loads a row of D bf16 values with 16-byte vector loads.
    if (s.batch % 8 || s.head % 8 || s.seq % 8)
      return fail(std::string(names[t]) + " strides must be multiples of 8 elements (16-byte aligned rows)");
  }
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o))
    return fail("q, k, v and o must be 16-byte aligned");
  if (caps.max_tensor_elements > 0) {
    int64_t largest = std::max(p.batch * p.heads_q * p.seqlen_q, p.batch * p.heads_kv * p.seqlen_kv) * p.head_dim;
    if (largest > caps.max_tensor_elements)
      return fail("tensors of " + std::to_string(largest) + " elements exceed this step's limit of " +
                  std::to_string(caps.max_tensor_elements));
  }
  return Status::Ok();
}

}  // namespace fa
