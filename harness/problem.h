// An attention problem for the harness: its shape and layout, generated inputs on the device,
// poisoned outputs, and host copies for the references. Its tensors hold bf16 or fp16 (the shape's
// dtype): the inputs are generated in that type, and the host copies are its values exactly, so the
// references see what the kernel reads.
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
  flat_large_v,  // Q = 0 (every score equal, every key weighs 1), V = 16 + N(0, 1): the unnormalised
                 // O grows to ~16·N_kv, past fp16's largest value (65504) once N_kv > 4096
};

enum class Layout { bhnd, bnhd };

struct ProblemShape {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_kv = 1, head_dim = 64;
  bool causal = false;
  CausalAlign align = CausalAlign::top_left;
  int64_t window_left = -1, window_right = -1;  // a sliding window (AttentionParams'); -1: unbounded
  // Score modifications (AttentionParams'): a softcap (0: none), ALiBi slopes per head or per
  // (batch, head), a sink logit per head. The problem generates the arrays (AttentionProblem).
  float softcap = 0.0f;
  enum class Alibi { none, per_head, per_batch_head } alibi = Alibi::none;
  bool sinks = false;
  Layout layout = Layout::bhnd;
  InputKind input = InputKind::random;
  uint64_t seed = 0;
  float softmax_scale = 0.0f;  // 0: 1/sqrt(D)
  bool with_lse = true;
  // The element type of Q, K, V and O (AttentionParams::dtype). The inputs are drawn in fp32 and
  // rounded to it on the device; every kind fits fp16's range (large_logits' ×10 inputs reach ~60,
  // flat_large_v's V ~16: their products and sums are fp32 inside the kernels).
  DType dtype = DType::bf16;
  // Poisoned memory around the inputs. K and V keep kv_pad_rows NaN rows after the N_kv rows of
  // every (batch, head) in (B, H, N, D), of every batch in (B, N, H, D), so their head (batch)
  // stride is larger than N_kv rows: a kernel that loads rows past N_kv without zero-filling
  // them reads NaN, and a NaN times a zero weight is still NaN.
  int64_t kv_pad_rows = 128;
  // Extra (poisoned) elements after every row of Q, K, V and O: a row stride of D + row_gap in
  // (B, H, N, D), H·D + row_gap in (B, N, H, D). A large gap makes row × stride pass 2^31.
  int64_t row_gap = 0;
};

std::string to_string(const ProblemShape& s);

// A shape of these sizes and mask; everything else (layout, inputs, seed, LSE, guards) at its default.
ProblemShape make_shape(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nkv, int64_t d, bool causal = false,
                        CausalAlign align = CausalAlign::top_left);

// A backward call on the forward call `fwd` (its O and LSE), with dO, dQ, dK and dV contiguous
// (B, H, N, D) at the given device pointers and the given workspace: what the backward tests and
// fa2 bench each hand the steps.
BackwardParams contiguous_backward_params(const AttentionParams& fwd, const void* d_o, void* dq, void* dk, void* dv,
                                          void* workspace, size_t workspace_bytes);

// The sizes, strides, scale and mask of `s`, with no tensors attached (null pointers).
AttentionParams shape_params(const ProblemShape& s);
// The same with stand-in pointers (16-byte aligned, never dereferenced), so fa::validate can judge
// a shape before anything is allocated, with or without a GPU.
AttentionParams validation_params(const ProblemShape& s);
std::string to_string(InputKind k);

class AttentionProblem {
 public:
  // Allocates device tensors inside guard regions (harness/device_buffer.h), poisons everything,
  // then generates the inputs' N rows on the device: padding, gaps and guards stay NaN.
  explicit AttentionProblem(const ProblemShape& shape);

  const ProblemShape& shape() const { return shape_; }
  // Device pointers, sizes and strides of this problem (lse is null unless shape.with_lse).
  AttentionParams params() const;
  // Fill O (and LSE) and their guards with NaN so an element a kernel fails to write is caught.
  void poison_outputs();
  // True when no guard region of any tensor (nor the gaps and padding of O) was written since
  // the outputs were last poisoned; otherwise `why` names the first one that was.
  bool memory_intact(std::string* why = nullptr) const;

  // Host copies of the inputs (bf16 or fp16, the shape's dtype) as floats, in storage order (use
  // params() strides to index; padding and gaps are NaN).
  std::vector<float> host_q() const;
  std::vector<float> host_k() const;
  std::vector<float> host_v() const;
  // The output gathered into contiguous (B, H_q, N_q, D) order, as floats.
  std::vector<float> output_bhnd() const;
  // The LSE buffer, contiguous (B, H_q, N_q); empty when the problem has none.
  std::vector<float> lse() const;
  // Rows 0..rows-1 of head h of batch b of `t` (strides `st`), as contiguous (rows, D) floats;
  // downloads only that head's span.
  std::vector<float> head_rows(const GuardedBuffer<__nv_bfloat16>& t, const Strides& st, int64_t b, int64_t h,
                               int64_t rows) const;

  // 16-bit storage: bf16 values, or fp16 bits when shape().dtype is fp16 (both 2 bytes, both NaN
  // when poisoned with 0xFFFF); read them through host_q() ... output_bhnd(), which know the type.
  GuardedBuffer<__nv_bfloat16> q, k, v, o;
  GuardedBuffer<float> lse_buf;
  // The score modifications' arrays, on the host (for the CPU reference) and the device (empty
  // unless the shape asks): ALiBi slopes, flash-attn's 2^(−8(h+1)/H_q) per head, times (1 + b/4) per
  // (batch, head) when the shape asks for those; sink logits ln(N_kv) + 2·N(0, 1), so that a sink
  // weighs about as much as the row's keys.
  std::vector<float> alibi_slopes_host, sinks_host;
  DeviceBuffer<float> alibi_slopes, sinks;

 private:
  ProblemShape shape_;
};

// bf16 → float copies of a device buffer (the body of a guarded one).
std::vector<float> to_float(const DeviceBuffer<__nv_bfloat16>& buf);
std::vector<float> to_float(const GuardedBuffer<__nv_bfloat16>& buf);
// The same for a buffer of 16-bit elements of type `t` (bf16 or fp16 bits).
std::vector<float> to_float(const GuardedBuffer<__nv_bfloat16>& buf, DType t);
// One stored 16-bit element of type `t` as a float (exact: both types are subsets of fp32).
float element_to_float(uint16_t bits, DType t);
// A float rounded to type `t` (nearest even), in the 16-bit storage above (bf16 values, or fp16 bits).
__nv_bfloat16 float_to_element(float x, DType t);

}  // namespace fa
