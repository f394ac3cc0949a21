// An attention problem for the harness: its shape and layout, generated inputs on the device,
// poisoned outputs, and host copies for the references.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/device_buffer.h"
#include "fa/params.h"

namespace fa {

// How the inputs are generated. Random normals everywhere except where a bug needs structure.
enum class InputKind {
  random,        // Q, K, V ~ N(0, 1), fresh per (seed, tensor, element)
  large_logits,  // Q and K ×10: logits have std ~100, so exp() without max subtraction overflows
  identity_qk,   // Q = K = scaled one-hot rows (row i hot at i % D): sharp, structured attention
  v_ramp,        // random Q, K; V[.., j, d] = d / D + 0.01·j / N_kv: exposes dim/row index mix-ups
};

enum class Layout { bhnd, bnhd };

struct ProblemShape {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_kv = 1, head_dim = 64;
  bool causal = false;
  CausalAlign align = CausalAlign::top_left;
  Layout layout = Layout::bhnd;
  InputKind input = InputKind::random;
  uint64_t seed = 0;
  float softmax_scale = 0.0f;  // 0: 1/sqrt(D)
  bool with_lse = true;
};

std::string to_string(const ProblemShape& s);

// The sizes, strides, scale and mask of `s`, with no tensors attached (null pointers).
AttentionParams shape_params(const ProblemShape& s);
// The same with stand-in pointers (16-byte aligned, never dereferenced), so fa::validate can judge
// a shape before anything is allocated, with or without a GPU.
AttentionParams validation_params(const ProblemShape& s);
std::string to_string(InputKind k);

class AttentionProblem {
 public:
  // Allocates device tensors, generates the inputs on the device and poisons the outputs.
  explicit AttentionProblem(const ProblemShape& shape);

  const ProblemShape& shape() const { return shape_; }
  // Device pointers, sizes and strides of this problem (lse is null unless shape.with_lse).
  AttentionParams params() const;
  // Fill O (and LSE) with NaN so an element a kernel fails to write is caught.
  void poison_outputs();

  // Host copies of the bf16 inputs as floats, in storage order (use params() strides to index).
  std::vector<float> host_q() const;
  std::vector<float> host_k() const;
  std::vector<float> host_v() const;
  // The output gathered into contiguous (B, H_q, N_q, D) order, as floats.
  std::vector<float> output_bhnd() const;
  // The LSE buffer, contiguous (B, H_q, N_q); empty when the problem has none.
  std::vector<float> lse() const;

  DeviceBuffer<__nv_bfloat16> q, k, v, o;
  DeviceBuffer<float> lse_buf;

 private:
  ProblemShape shape_;
};

// bf16 → float copies of a device buffer (or of `count` elements starting at `offset`).
std::vector<float> to_float(const DeviceBuffer<__nv_bfloat16>& buf);
std::vector<float> to_float(const DeviceBuffer<__nv_bfloat16>& buf, size_t offset, size_t count);

}  // namespace fa
