/// @file params.h
/// @brief The public description of one attention call: tensors, shapes, strides and options.
///
/// Every step of the course takes the same `AttentionParams`, so the command-line tool, the test
/// suite and the benchmark drive all steps through one interface.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

namespace fa {

/// @brief Element type of Q, K, V and O. LSE is always fp32, and so is every sum inside the kernels.
///
/// Both are 16 bits wide, so sizes, strides and alignment rules are the same for either. bf16 keeps
/// fp32's range with 8 significant bits; fp16 has 11 bits but stops at 65504 (inputs past it are
/// inf before any kernel sees them). Every step takes bf16; the production forwards take fp16 too
/// where the build compiles them (FA_DTYPES): `Capabilities::dtypes` says which a step takes.
enum class DType : int {
  bf16 = 0,  ///< bfloat16 storage, fp32 compute
  fp16 = 1,  ///< IEEE half storage, fp32 compute (the production forwards, when built: FA_DTYPES)
};

/// @brief "bf16", "fp16", or "dtype N" for a value outside the enum (a cast integer).
inline std::string dtype_name(DType t) {
  switch (t) {
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
  }
  return "dtype " + std::to_string(int(t));
}

/// @brief Whether `t` is one of the enum's values (a DType cast from an integer may be neither).
inline bool dtype_known(DType t) {
  return t == DType::bf16 || t == DType::fp16;
}

/// @brief Which query sees which key when causal masking is on and N_q differs from N_kv.
///
/// Query row `i` may attend key column `j` when `j <= i + offset`, where
/// - `top_left`:     offset = 0 (PyTorch `is_causal`; the mask's diagonal starts at the top-left
///                   corner of the N_q × N_kv score matrix),
/// - `bottom_right`: offset = N_kv - N_q (flash-attention's convention; the last query sees every
///                   key, which is what decoding with a KV cache needs).
/// With N_q == N_kv both are the same mask. With bottom-right alignment and N_q > N_kv the first
/// N_q - N_kv rows see no key at all: their output is 0 and their LSE is -inf.
enum class CausalAlign : int {
  top_left = 0,      ///< offset 0
  bottom_right = 1,  ///< offset N_kv - N_q
};

/// @brief Strides, in elements (not bytes), of a rank-4 tensor indexed (batch, head, sequence, dim).
///
/// A contiguous (B, H, N, D) tensor has {H·N·D, N·D, D, 1}; a contiguous (B, N, H, D) tensor has
/// {N·H·D, D, H·D, 1}. All strides are 64-bit so tensors past 2³¹ elements index correctly.
struct Strides {
  int64_t batch = 0;  ///< elements between consecutive batch entries
  int64_t head = 0;   ///< elements between consecutive heads
  int64_t seq = 0;    ///< elements between consecutive sequence positions (rows)
  int64_t dim = 1;    ///< elements between consecutive head-dim entries (must be 1 today)
};

/// @brief Strides of a contiguous tensor in (B, H, N, D) order.
inline Strides bhnd_strides(int64_t heads, int64_t seqlen, int64_t head_dim) {
  return Strides{heads * seqlen * head_dim, seqlen * head_dim, head_dim, 1};
}

/// @brief Strides of a contiguous tensor stored in (B, N, H, D) order, described as (b, h, n, d).
inline Strides bnhd_strides(int64_t heads, int64_t seqlen, int64_t head_dim) {
  return Strides{seqlen * heads * head_dim, head_dim, heads * head_dim, 1};
}

/// @brief One forward attention call: O = softmax(scale · Q·Kᵀ [+ causal mask]) · V.
///
/// Shapes: Q and O are (B, H_q, N_q, D); K and V are (B, H_kv, N_kv, D); LSE, when requested, is
/// a contiguous fp32 (B, H_q, N_q) array. Query head `h` reads key/value head
/// `h / (H_q / H_kv)` (grouped-query attention; H_kv == H_q is ordinary multi-head attention).
struct AttentionParams {
  const void* q = nullptr;  ///< device pointer, (B, H_q, N_q, D) with `q_stride`
  const void* k = nullptr;  ///< device pointer, (B, H_kv, N_kv, D) with `k_stride`
  const void* v = nullptr;  ///< device pointer, (B, H_kv, N_kv, D) with `v_stride`
  void* o = nullptr;        ///< device pointer, (B, H_q, N_q, D) with `o_stride`
  float* lse = nullptr;     ///< optional device pointer, contiguous (B, H_q, N_q) fp32, natural log

  int64_t batch = 0;      ///< B
  int64_t heads_q = 0;    ///< H_q, query (and output) heads
  int64_t heads_kv = 0;   ///< H_kv, key/value heads; must divide H_q
  int64_t seqlen_q = 0;   ///< N_q
  int64_t seqlen_kv = 0;  ///< N_kv
  int64_t head_dim = 0;   ///< D

  Strides q_stride;  ///< strides of Q in elements
  Strides k_stride;  ///< strides of K in elements
  Strides v_stride;  ///< strides of V in elements
  Strides o_stride;  ///< strides of O in elements

  /// Softmax temperature. Zero (the default) means 1/sqrt(D); see `effective_scale()`.
  float softmax_scale = 0.0f;
  bool causal = false;                               ///< apply the causal mask
  CausalAlign causal_align = CausalAlign::top_left;  ///< mask alignment when N_q != N_kv
  /// Sliding window (flash-attn's window_size = (left, right)): query i sees key j only when
  /// i + offset − window_left <= j <= i + offset + window_right, the offset the causal mask's
  /// (causal_offset(): causal_align decides it with or without `causal`); −1 leaves that side
  /// unbounded. With `causal` too, both masks apply (flash-attn's causal window is (left, 0)). Both
  /// −1 (the default): no window. Only steps whose Capabilities::sliding_window is set accept one.
  int64_t window_left = -1;
  int64_t window_right = -1;  ///< the window's keys after the diagonal (see window_left), or −1
  /// Score modifications (Part VI), applied in this order to each scaled score s = scale·q·k of a
  /// visible (query i, key j):
  ///   softcap   (Gemma 2, flash-attn's `softcap`): s ← softcap·tanh(s / softcap); 0 (the
  ///             default) leaves s as it is; at most kMaxSoftcap.
  ///   ALiBi     (flash-attn's `alibi_slopes`): s ← s − slope·|i + N_kv − N_q − j|, with fp32 slopes
  ///             in device memory, slope = alibi_slopes[b·alibi_slopes_stride_batch + h] (stride 0:
  ///             one per query head, flash-attn's (H,); H_q: one per (batch, head), its (B, H)).
  ///             The offset is N_kv − N_q whatever causal_align says, as flash-attn's.
  /// and then the softmax of row i runs over its visible keys and, with `sinks`, one more logit:
  ///   sinks     (gpt-oss): sinks[h] fp32 in device memory, a term e^(sinks[h]) in the row's
  ///             denominator (and in its LSE) that adds nothing to O; a row that sees no key then
  ///             has O = 0 and LSE = sinks[h]. Finite: +inf makes every row NaN (device memory is
  ///             not checked: that would cost a synchronisation).
  /// Only steps whose Capabilities say so (its softcap, alibi and sinks flags) accept them.
  float softcap = 0.0f;
  const float* alibi_slopes = nullptr;    ///< see softcap; nullptr: no ALiBi
  int64_t alibi_slopes_stride_batch = 0;  ///< floats between batch entries' slopes: 0 or H_q (see softcap)
  const float* sinks = nullptr;           ///< see softcap; H_q floats; nullptr: no sinks
  DType dtype = DType::bf16;              ///< element type of Q, K, V, O

  /// Split-KV (Part V): each query row's keys are split into this many ranges, each computed by
  /// its own block into the workspace, then merged by their LSEs. 0: the step chooses (from how
  /// full its grid leaves the GPU) when a workspace is given, and does not split without one;
  /// 1: no split; up to kMaxKvSplits. Only steps whose Capabilities::split_kv is set accept > 1.
  int num_splits = 0;
  /// Scratch memory for the split partial results: at least split_kv_workspace_bytes(*this, S)
  /// bytes for the S used, 16-byte aligned. The forward allocates nothing.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;  ///< the workspace's size in bytes
  /// Ragged KV caches (Part V): B int32 lengths in device memory; sequence b attends to its first
  /// seqlens_kv[b] keys (clamped to [0, seqlen_kv]), and bottom-right alignment is to that length.
  /// seqlen_kv is then the caches' capacity. nullptr: every sequence has seqlen_kv keys. Only steps
  /// whose Capabilities::seqlens_kv is set accept it.
  const int32_t* seqlens_kv = nullptr;
  /// Paged KV cache (Part V): K and V are pools of pages, (num_pages, page_size, H_kv, D) in
  /// flash-attn's layout, and sequence b's key j lives in row j % page_size of page
  /// block_table[b·block_table_stride + j / page_size]. k_stride and v_stride then describe a page:
  /// `batch` is the stride between pages, `seq` between a page's rows, `head` between heads.
  /// seqlen_kv stays the sequences' capacity (at most block_table_stride·page_size keys). nullptr: K
  /// and V are (B, H_kv, N_kv, D). Only steps whose Capabilities::paged_kv is set accept it; page
  /// numbers outside [0, num_pages) are the kernel's to clamp (the host cannot see them).
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;  ///< int32 entries between consecutive sequences' rows of the table
  int64_t page_size = 0;           ///< keys per page: a power of two (the kernel shifts and masks)
  int64_t num_pages = 0;           ///< pages in K and in V
  /// Variable-length sequences (Part V, flash-attn's varlen): B + 1 int32 offsets each, in device
  /// memory. Q and O are then packed (total_q, H_q, D) tensors and K and V (total_kv, H_kv, D), the
  /// `batch` strides unused: sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] − 1,
  /// its keys rows cu_seqlens_kv[b] .. cu_seqlens_kv[b+1] − 1. seqlen_q and seqlen_kv are the longest
  /// lengths (flash-attn's max_seqlen_q, max_seqlen_k): each length is clamped to them and to the
  /// tensor. The LSE is (H_q, total_q) fp32. Both or neither; not with seqlens_kv or a block table.
  /// Only steps whose Capabilities::varlen is set accept them.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_kv = nullptr;  ///< B + 1 offsets of the sequences' keys (rows of K and V)
  int64_t total_q = 0;                     ///< rows of the packed Q and O (with cu_seqlens_q)
  int64_t total_kv = 0;                    ///< rows of the packed K and V (with cu_seqlens_kv)
  /// Appending to the cache (Part V, flash-attn's `k` and `v` of flash_attn_with_kvcache):
  /// seqlen_new new keys and values per sequence, (B, seqlen_new, H_kv, D) through k_new_stride and
  /// v_new_stride, written by the call into K and V as sequence b's keys seqlens_kv[b] ..
  /// seqlens_kv[b] + seqlen_new − 1 (through the block table when paged) before they are read; the
  /// attention then covers seqlens_kv[b] + seqlen_new keys. K and V are written: with k_new they are
  /// the caches, not read-only inputs. Needs seqlens_kv (the lengths before the append; the call does
  /// not change them). A sequence whose new rows would not fit, seqlens_kv[b] < 0 or seqlens_kv[b] +
  /// seqlen_new > seqlen_kv, gets nothing written (its length is then clamped as always). Only steps
  /// whose Capabilities::kv_append is set accept it; nullptr: nothing is appended.
  const void* k_new = nullptr;
  const void* v_new = nullptr;  ///< the new values, (B, seqlen_new, H_kv, D) with `v_new_stride`
  Strides k_new_stride;         ///< strides of k_new in elements
  Strides v_new_stride;         ///< strides of v_new in elements
  int64_t seqlen_new = 0;       ///< new keys per sequence (with k_new)

  /// @brief The scale actually used: `softmax_scale`, or 1/sqrt(D) when it is zero.
  float effective_scale() const {
    return softmax_scale != 0.0f ? softmax_scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  }

  /// @brief Whether a sliding window bounds either side of a row's keys.
  bool has_window() const { return window_left >= 0 || window_right >= 0; }

  /// @brief Whether any score modification (softcap, ALiBi, sinks) is asked for.
  bool has_score_mods() const { return softcap != 0.0f || alibi_slopes != nullptr || sinks != nullptr; }

  /// @brief Offset of the causal diagonal: key j is visible to query i when j <= i + offset.
  int64_t causal_offset() const { return causal_align == CausalAlign::bottom_right ? seqlen_kv - seqlen_q : 0; }
};

/// @brief Fill in contiguous (B, H, N, D) strides for all four tensors of `p` from its sizes.
inline void set_bhnd_strides(AttentionParams& p) {
  p.q_stride = bhnd_strides(p.heads_q, p.seqlen_q, p.head_dim);
  p.k_stride = bhnd_strides(p.heads_kv, p.seqlen_kv, p.head_dim);
  p.v_stride = bhnd_strides(p.heads_kv, p.seqlen_kv, p.head_dim);
  p.o_stride = bhnd_strides(p.heads_q, p.seqlen_q, p.head_dim);
}

/// @brief The backward pass: the forward's call (`fwd`: q, k, v, its output o and its LSE, which
/// the backward needs, sizes, scale and mask) with dL/dO, and where dQ, dK and dV go. dO, dQ have
/// O's and Q's shape (B, H_q, N_q, D); dK, dV have K's (B, H_kv, N_kv, D): with H_kv < H_q each
/// is the sum over the query heads that share the KV head. In `fwd.dtype` (bf16: the backwards take
/// no other type), each through its own strides.
struct BackwardParams {
  AttentionParams fwd;        ///< the forward call; `o` and `lse` are read, not written
  const void* d_o = nullptr;  ///< device pointer: dL/dO, (B, H_q, N_q, D)
  void* dq = nullptr;         ///< device pointer: dL/dQ, (B, H_q, N_q, D)
  void* dk = nullptr;         ///< device pointer: dL/dK, (B, H_kv, N_kv, D)
  void* dv = nullptr;         ///< device pointer: dL/dV, (B, H_kv, N_kv, D)
  Strides do_stride;          ///< strides of dO in elements
  Strides dq_stride;          ///< strides of dQ in elements
  Strides dk_stride;          ///< strides of dK in elements
  Strides dv_stride;          ///< strides of dV in elements
  /// Scratch memory the caller provides (the backward allocates nothing), at least
  /// backward_workspace_bytes(fwd) bytes, 16-byte aligned; its parts: BackwardWorkspace.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;  ///< the workspace's size in bytes
  /// Bitwise-identical gradients on every run of the same call: the KV tiles' contributions to dQ
  /// are added in a fixed order (each Q tile's turnstile in the workspace) instead of racing atomics.
  /// Only steps whose Capabilities::deterministic_backward is set accept it.
  bool deterministic = false;
  /// With the forward's `sinks`: dL/dsinks, H_q fp32 in device memory, written (not added to): each
  /// head's sum over its batch entries and rows of −P_sink·D_i (P_sink = e^(sink − LSE_i)). Required
  /// with sinks (a missing gradient is refused), refused without.
  float* dsinks = nullptr;
};

/// @brief Query rows per turnstile of the deterministic backward: one int per (b, h_q, 16 rows), the
/// smallest Q tile any backward config uses, so the size does not depend on the config chosen.
constexpr int64_t kBackwardTurnstileRows = 16;

/// @brief The backward's workspace, part by part: where each starts (bytes from the start of the
/// workspace, each part rounded up to 256 bytes) and how many elements it holds. In this order: an
/// fp32 (B, H_q, N_q, D) dQ accumulator; an fp32 (B, H_q, N_q) D; the deterministic mode's
/// turnstiles, one int32 per (B, H_q, ⌈N_q / 16⌉); an fp32 (B, H_q, N_q) copy of the LSE in exp2
/// units that the preprocess writes for the kernels that copy it (step 19 on). O(N), never O(N²);
/// the same with or without `deterministic`, so one allocation serves both.
struct BackwardWorkspace {
  size_t dq_accum = 0;         ///< byte offset of dQ's fp32 accumulator
  size_t delta = 0;            ///< byte offset of D
  size_t turnstiles = 0;       ///< byte offset of the turnstiles
  size_t lse2 = 0;             ///< byte offset of the LSE in exp2 units
  size_t dq_accum_count = 0;   ///< floats of the dQ accumulator, B·H_q·N_q·D
  size_t rows = 0;             ///< floats of D and of the LSE copy, B·H_q·N_q
  size_t turnstile_count = 0;  ///< int32 turnstiles, B·H_q·⌈N_q / 16⌉
  size_t bytes = 0;            ///< the whole workspace
};

/// @brief The workspace layout of a backward call on `p`'s sizes (see BackwardWorkspace).
inline BackwardWorkspace backward_workspace(const AttentionParams& p) {
  auto round = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  BackwardWorkspace w;
  w.rows = size_t(p.batch) * size_t(p.heads_q) * size_t(p.seqlen_q);
  w.dq_accum_count = w.rows * size_t(p.head_dim);
  w.turnstile_count = size_t(p.batch) * size_t(p.heads_q) *
                      ((size_t(p.seqlen_q) + kBackwardTurnstileRows - 1) / kBackwardTurnstileRows);
  w.delta = w.dq_accum + round(w.dq_accum_count * sizeof(float));
  w.turnstiles = w.delta + round(w.rows * sizeof(float));
  w.lse2 = w.turnstiles + round(w.turnstile_count * sizeof(int32_t));
  w.bytes = w.lse2 + round(w.rows * sizeof(float));
  return w;
}

/// @brief The scratch memory a backward call on `p`'s sizes needs (backward_workspace(p).bytes).
inline size_t backward_workspace_bytes(const AttentionParams& p) {
  return backward_workspace(p).bytes;
}

/// @brief The most KV splits a forward call takes (AttentionParams::num_splits).
constexpr int kMaxKvSplits = 64;

/// @brief The largest softcap a call may ask for (AttentionParams::softcap): the kernels' tanh is exact to
/// about 1.3e-5 absolute, so a capped score to about 1.3e-5·softcap, 1.3e-2 here (a bf16 logit of 4
/// rounds by as much).
constexpr float kMaxSoftcap = 1000.0f;

/// @brief The split-KV forward's workspace: S partial outputs, fp32 (S, B, H_q, N_q, D), each
/// normalised over its own range of keys, then their LSEs, fp32 (S, B, H_q, N_q) (−inf for a range
/// that saw no key); each part rounded up to 256 bytes. O(S·N), never O(N²).
struct SplitKvWorkspace {
  size_t o_partial = 0;    ///< byte offset of the partial outputs
  size_t lse_partial = 0;  ///< byte offset of the partial LSEs
  size_t rows = 0;         ///< B·H_q·N_q: the rows of one split
  size_t bytes = 0;        ///< the whole workspace
};

/// @brief The workspace layout of a forward call on `p`'s sizes split `splits` ways.
inline SplitKvWorkspace split_kv_workspace(const AttentionParams& p, int splits) {
  auto round = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  SplitKvWorkspace w;
  w.rows = size_t(p.batch) * size_t(p.heads_q) * size_t(p.seqlen_q);
  const size_t s = splits < 1 ? 0 : size_t(splits);
  w.lse_partial = w.o_partial + round(s * w.rows * size_t(p.head_dim) * sizeof(float));
  w.bytes = w.lse_partial + round(s * w.rows * sizeof(float));
  return w;
}

/// @brief The scratch memory a forward call on `p`'s sizes split `splits` ways needs (0 for one).
inline size_t split_kv_workspace_bytes(const AttentionParams& p, int splits) {
  return splits <= 1 ? 0 : split_kv_workspace(p, splits).bytes;
}

/// @brief Result of an API call: success, or failure with a message saying what was wrong.
class Status {
 public:
  /// @brief A successful status.
  static Status Ok() { return Status(); }
  /// @brief A failed status carrying `message`: something went wrong while running (a CUDA call).
  static Status Error(std::string message) { return Status(std::move(message), false); }
  /// @brief A refusal: the input is outside what the step supports, and nothing was run or written.
  static Status Unsupported(std::string message) { return Status(std::move(message), true); }

  /// @brief True when the call succeeded.
  bool ok() const { return ok_; }
  /// @brief True for a refusal of the input (Unsupported), false for success or a runtime error.
  bool unsupported() const { return unsupported_; }
  /// @brief Why the call failed; empty on success.
  const std::string& message() const { return message_; }

 private:
  Status() = default;
  Status(std::string message, bool unsupported) : ok_(false), unsupported_(unsupported), message_(std::move(message)) {}
  bool ok_ = true;
  bool unsupported_ = false;
  std::string message_;
};

}  // namespace fa
