/// @file c_api.h
/// @brief A small C interface to every course step, for callers in other languages.
///
/// The C++ API (`params.h`, `registry.h`) uses classes, `std::string` and exceptions-free
/// `Status` objects that only C++ can consume. This header exposes the same registry through plain
/// C types so that Python (ctypes, cffi), Rust, Julia or plain C can list the steps and run any of
/// them on device memory they own. The library is `libfa2_capi.so` (CMake target `fa2_capi`);
/// `tests/cpu/capi/` calls every function of it.
///
/// Rules every function follows:
/// - Nothing throws across this interface and nothing aborts; failures are return codes.
/// - Functions that can fail return 0 on success and a non-zero `fa_status_code` otherwise, and
///   (where they take `err`, `err_len`) write a NUL-terminated message into `err`, truncated to
///   `err_len - 1` characters. `err` may be NULL; on success `err` is set to the empty string.
/// - Strings returned through `const char**` are owned by the library and live until it is
///   unloaded; do not free them.
/// - Tensors are device pointers owned by the caller. Sizes and strides are in elements.
#ifndef FA_C_API_H_
#define FA_C_API_H_

#include <stddef.h>
#include <stdint.h>

/// @brief Marks a function of this interface as exported from the shared library.
#if defined(_WIN32)
#define FA_CAPI_EXPORT __declspec(dllexport)
#else
#define FA_CAPI_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/// @brief Version of this interface. It changes whenever `fa_attention_params` or a signature
/// changes, so a caller with its own copy of the struct layout can refuse a mismatched library.
/// Version 2 added `fa_attention_params::reserved`. Version 3 puts `struct_size` first, so that the
/// struct can grow at its end (a library refuses a struct with fields it does not know set), and
/// adds `FA_STEP_AUTO`, the library's own choice of kernel. A version-2 struct given to a version-3
/// library is refused: its first field, a pointer, is no struct size. Version 4 turns three of
/// `fa_attention_params::reserved` into the split-KV `workspace`, `workspace_bytes` and `num_splits`
/// (zero: today's behaviour, the struct's size unchanged) and adds `fa_forward_workspace_size`.
/// Version 5 turns the last four into the paged KV cache's `block_table`, `block_table_stride`,
/// `page_size` and `num_pages` (zero: K and V are (B, H_kv, N_kv, D) tensors, as before). Version 6
/// grows the struct at its end with the varlen `cu_seqlens_q`, `cu_seqlens_kv`, `total_q` and
/// `total_kv`; a version-5 struct (its `struct_size` smaller) is still taken, those fields zero.
/// Version 7 grows it again with the append's `k_new`, `v_new`, `new_strides` and `seqlen_new`
/// (flash_attn_with_kvcache's k and v); version-5 and version-6 structs are still taken. Version 8
/// grows it with the sliding window's `has_window`, `window_left` and `window_right` (flash-attn's
/// window_size); version-5, -6 and -7 structs are still taken, without a window. Version 9 grows it
/// with the score modifications' `softcap`, `alibi_slopes`, `alibi_slopes_stride_batch` and `sinks`
/// (older forward structs are taken without them), and turns the first of
/// `fa_backward_params::reserved` into `dsinks` (the backward struct, which holds the forward one,
/// grows with it: its size must be this version's). Version 10 adds `FA_DTYPE_FP16`, taken by the
/// production forwards where the library is built with it (FA_DTYPES) and refused by name elsewhere;
/// the structs are unchanged.
#define FA_C_API_VERSION 10

/// @brief The step argument that asks the library to choose: the fastest kernel this GPU runs that
/// accepts the call: the production kernels first (101 on Hopper, 100 on mma.sync), then the steps,
/// the highest-numbered that validates first. -1 rather than 0, which is step 00's number.
#define FA_STEP_AUTO (-1)

/// @brief Return codes of the functions that can fail.
typedef enum fa_status_code {
  FA_OK = 0,                 ///< success
  FA_ERROR_INVALID = 1,      ///< the call itself is malformed: NULL params, unknown step, bad enum
  FA_ERROR_UNSUPPORTED = 2,  ///< the step refused the input (shape, head dim, causal, alignment, ...)
  FA_ERROR_RUNTIME = 3,      ///< the step accepted the input but a CUDA call failed
} fa_status_code;

/// @brief Index of a tensor in `fa_attention_params::strides`.
enum {
  FA_TENSOR_Q = 0,  ///< query, (B, H_q, N_q, D)
  FA_TENSOR_K = 1,  ///< key, (B, H_kv, N_kv, D)
  FA_TENSOR_V = 2,  ///< value, (B, H_kv, N_kv, D)
  FA_TENSOR_O = 3,  ///< output, (B, H_q, N_q, D)
};

/// @brief Index of an axis in `fa_attention_params::strides[tensor]`.
enum {
  FA_AXIS_BATCH = 0,  ///< elements between consecutive batch entries
  FA_AXIS_HEAD = 1,   ///< elements between consecutive heads
  FA_AXIS_SEQ = 2,    ///< elements between consecutive sequence positions
  FA_AXIS_DIM = 3,    ///< elements between consecutive head-dim entries (must be 1)
};

/// @brief Values of `fa_attention_params::causal_align` (see `fa::CausalAlign`).
enum {
  FA_CAUSAL_TOP_LEFT = 0,      ///< key j visible to query i when j <= i (PyTorch `is_causal`)
  FA_CAUSAL_BOTTOM_RIGHT = 1,  ///< key j visible to query i when j <= i + N_kv - N_q
};

/// @brief Values of `fa_attention_params::dtype` (see `fa::DType`).
enum {
  FA_DTYPE_BF16 = 0,  ///< bfloat16 Q, K, V and O (every step)
  FA_DTYPE_FP16 = 1,  ///< IEEE half Q, K, V and O (the production forwards, where the library is built with it)
};

/// @brief One forward attention call; the C mirror of `fa::AttentionParams`.
///
/// O = softmax(scale · Q·Kᵀ [+ causal mask]) · V. Q and O are (B, H_q, N_q, D); K and V are
/// (B, H_kv, N_kv, D); LSE, when non-NULL, is a contiguous fp32 (B, H_q, N_q) array. Zero-fill the
/// struct (`= {0}` in C, `ctypes` does it for you), set `struct_size = sizeof(fa_attention_params)`,
/// and set what you need: a zero `softmax_scale` means 1/sqrt(D).
typedef struct fa_attention_params {
  /// `sizeof(fa_attention_params)` as the caller compiled it; set it first (zero is refused). A
  /// library built with a smaller struct accepts a larger one only if the fields it does not know
  /// are all zero.
  size_t struct_size;
  const void* q;  ///< device pointer to Q
  const void* k;  ///< device pointer to K
  const void* v;  ///< device pointer to V
  void* o;        ///< device pointer to O (written)
  float* lse;     ///< optional device pointer to LSE (written when the step supports it), or NULL

  int64_t batch;      ///< B
  int64_t heads_q;    ///< H_q
  int64_t heads_kv;   ///< H_kv; must divide H_q
  int64_t seqlen_q;   ///< N_q
  int64_t seqlen_kv;  ///< N_kv
  int64_t head_dim;   ///< D

  /// Strides in elements: `strides[FA_TENSOR_*][FA_AXIS_*]`. A contiguous (B, H, N, D) tensor has
  /// {H·N·D, N·D, D, 1}; PyTorch's `tensor.stride()` gives exactly these numbers.
  int64_t strides[4][4];

  float softmax_scale;   ///< softmax temperature; 0 means 1/sqrt(D)
  int32_t causal;        ///< non-zero: apply the causal mask
  int32_t causal_align;  ///< FA_CAUSAL_TOP_LEFT or FA_CAUSAL_BOTTOM_RIGHT
  int32_t dtype;         ///< FA_DTYPE_BF16 or FA_DTYPE_FP16 (a step compiled without it refuses the call)

  /// Split-KV (decode): device scratch memory for the partial results of calls whose keys the
  /// library splits across blocks, at least `fa_forward_workspace_size(p)` bytes, 16-byte aligned;
  /// NULL: no split (the call still runs, unsplit). Read and written by the call, nothing kept.
  void* workspace;
  size_t workspace_bytes;  ///< its size in bytes
  /// 0: the library chooses how many ways to split (with a workspace); 1: no split; 2..64: that
  /// many (a call the split kernel does not take is then refused).
  int32_t num_splits;
  int32_t reserved_flags;  ///< must be zero
  /// Ragged KV caches: B int32 lengths in device memory (flash-attn's cache_seqlens); sequence b
  /// attends to its first seqlens_kv[b] keys (clamped to [0, seqlen_kv], the capacity), causal
  /// bottom-right alignment to that length. NULL: every sequence has seqlen_kv keys. Decode calls
  /// only (at most 64 query rows per KV head); other calls with it are refused.
  const int32_t* seqlens_kv;

  /// Paged KV cache (flash-attn's block_table): K and V are pools of pages, (num_pages, page_size,
  /// H_kv, D) described by their strides (`FA_AXIS_BATCH` between pages, `FA_AXIS_SEQ` between a
  /// page's rows), and key j of sequence b is row j % page_size of page
  /// block_table[b·block_table_stride + j / page_size] (int32, device memory; numbers outside
  /// [0, num_pages) are clamped). seqlen_kv is the capacity, at most block_table_stride·page_size.
  /// NULL (and the three below zero): no paging. Decode calls only, as seqlens_kv.
  const int32_t* block_table;
  int64_t block_table_stride;  ///< int32 entries between two sequences' rows of the table
  int64_t page_size;           ///< keys per page, a power of two
  int64_t num_pages;           ///< pages in K and in V

  /// Variable-length sequences (flash-attn's varlen, version 6): B + 1 int32 offsets each, in device
  /// memory. Q and O are then packed (total_q, H_q, D) tensors and K and V (total_kv, H_kv, D), the
  /// `FA_AXIS_BATCH` strides unused; sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] − 1 of
  /// Q and O and rows cu_seqlens_kv[b] .. cu_seqlens_kv[b+1] − 1 of K and V (clamped to the tensors).
  /// seqlen_q and seqlen_kv are the longest lengths (max_seqlen_q, max_seqlen_k); the LSE is
  /// (H_q, total_q). Both or neither; not with seqlens_kv or block_table.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_kv;  ///< B + 1 offsets of the sequences' keys (rows of K and V)
  int64_t total_q;               ///< rows of Q and O (with cu_seqlens_q)
  int64_t total_kv;              ///< rows of K and V (with cu_seqlens_kv)

  /// Appending to the cache (flash_attn_with_kvcache's k and v, version 7): seqlen_new new rows per
  /// sequence, (B, H_kv, seqlen_new, D) tensors with strides new_strides[0] (keys) and
  /// new_strides[1] (values), indexed by `FA_AXIS_*`, written into K and V as sequence b's keys
  /// seqlens_kv[b] .. seqlens_kv[b] + seqlen_new − 1 (through the block table when paged) before the
  /// attention reads them, which then covers seqlens_kv[b] + seqlen_new keys. Needs seqlens_kv (not
  /// changed by the call). A sequence whose rows would not fit (seqlens_kv[b] < 0 or seqlens_kv[b] +
  /// seqlen_new > seqlen_kv) gets nothing written. NULL (and seqlen_new zero): nothing appended.
  const void* k_new;
  const void* v_new;          ///< the new values
  int64_t new_strides[2][4];  ///< strides of k_new [0] and v_new [1], in elements
  int64_t seqlen_new;         ///< new rows per sequence
  /// A sliding window (flash-attn's window_size = (window_left, window_right), version 8): with
  /// has_window 1, query i sees key j only when i + offset − window_left <= j <= i + offset +
  /// window_right, the offset causal_align's (0 top-left, N_kv − N_q bottom-right; flash-attn's is
  /// bottom-right), with or without `causal` (both apply: flash-attn's causal window is (left, 0));
  /// −1 leaves a side unbounded. has_window 0 (a zero-filled struct, or an older version's): no
  /// window, and both sizes must be zero. The backward takes it too (the production kernels'; a step
  /// without a window refuses it, forward and backward).
  int64_t has_window;
  int64_t window_left;   ///< keys before the diagonal a row sees, or −1 (unbounded)
  int64_t window_right;  ///< keys after the diagonal a row sees, or −1 (unbounded)
  /// Score modifications (version 9; fa::AttentionParams says where each applies): a logit
  /// softcap on the scaled score (0: none; at most 1000; flash-attn's `softcap`), ALiBi slopes (fp32 device memory,
  /// slope alibi_slopes[b·alibi_slopes_stride_batch + h]: stride 0 for one per head, H_q for one per
  /// (batch, head); flash-attn's `alibi_slopes`), and a sink logit per query head (fp32 device memory,
  /// H_q floats; flash-attn's `learnable_sink`). Zero / NULL: none. Steps without them refuse them.
  double softcap;
  const float* alibi_slopes;          ///< ALiBi slopes (see softcap), or NULL
  int64_t alibi_slopes_stride_batch;  ///< floats between batch entries' slopes: 0 or ≥ H_q
  const float* sinks;                 ///< sink logits (see softcap), or NULL
} fa_attention_params;

/// @brief `FA_C_API_VERSION` of the loaded library.
FA_CAPI_EXPORT int fa_api_version(void);

/// @brief `sizeof(fa_attention_params)` in the loaded library, to check a foreign struct layout.
FA_CAPI_EXPORT size_t fa_attention_params_size(void);

/// @brief Number of registered steps.
FA_CAPI_EXPORT int fa_num_steps(void);

/// @brief Describes the step at position `index` (0 ≤ index < `fa_num_steps()`, in step order).
/// @param index position in the step list (not the step number)
/// @param[out] number the step number NN of steps/NN_name (may be NULL)
/// @param[out] name the folder name without the number, e.g. "naive" (may be NULL)
/// @param[out] lesson one line: what the step teaches (may be NULL)
/// @param[out] supports_causal 1 when the step supports the causal mask, else 0 (may be NULL)
/// @param[out] supports_lse 1 when the step writes LSE, else 0 (may be NULL)
/// @return 0, or FA_ERROR_INVALID when `index` is out of range (outputs untouched).
FA_CAPI_EXPORT int fa_step_info(int index, int* number, const char** name, const char** lesson, int* supports_causal,
                                int* supports_lse);

/// @brief Checks whether step `step` (its number, or FA_STEP_AUTO: some kernel) accepts `p`,
/// launching nothing.
///
/// Runs the same validation the step runs first, `fa::validate`: pointers, sizes (their products
/// in 128 bits), head dim, causal, LSE, strides, alignment, an O whose elements never share an
/// address and that shares no byte with Q, K or V (nor LSE), the step's launch limits (its grid,
/// its tensor maps' coordinates and strides), and last whether the current GPU can run it (a
/// Hopper step elsewhere is refused here, not at its first launch). What it accepts, `fa_forward`
/// runs. Use it to tell "this step does not support the input" apart from a real failure.
/// @return 0 when the step would accept `p`; FA_ERROR_INVALID or FA_ERROR_UNSUPPORTED (with the
/// reason in `err`) otherwise.
FA_CAPI_EXPORT int fa_validate(int step, const fa_attention_params* p, char* err, size_t err_len);

/// @brief Writes into `buf` the kernel configuration step `step` uses for `p` (e.g. its tile sizes),
/// or the empty string when the step does not describe itself. With FA_STEP_AUTO: "step N: " and
/// the configuration of the step the library would run. On failure `buf` holds the empty
/// string, never an error message (fa_validate gives the reason).
/// @return 0, or FA_ERROR_INVALID for an unknown step or malformed `p`.
FA_CAPI_EXPORT int fa_step_describe(int step, const fa_attention_params* p, char* buf, size_t buf_len);

/// @brief Runs step `step` (its number, as in steps/NN_name; FA_STEP_AUTO: the library's choice,
/// `fa_choose_step`) on `p`, asynchronously on `stream`.
///
/// Like every CUDA launch, it returns once the work is queued: synchronise `stream` before reading
/// O. Errors that happen while the kernel runs surface at that synchronisation, not here.
/// @param step step number
/// @param p the call; pointers must be device memory of the current device
/// @param stream a `cudaStream_t` (NULL: the legacy default stream)
/// @param[out] err message buffer for failures (may be NULL)
/// @param err_len size of `err` in bytes
/// @return 0 on success; FA_ERROR_INVALID, FA_ERROR_UNSUPPORTED or FA_ERROR_RUNTIME with a message.
FA_CAPI_EXPORT int fa_forward(int step, const fa_attention_params* p, void* stream, char* err, size_t err_len);

/// @brief The split-KV workspace the library's choice (FA_STEP_AUTO) may use on `p`: enough for any
/// number of splits it chooses, 0 when it never splits `p` (more than 64 query rows per KV head,
/// N_q·H_q/H_kv). Launches nothing, allocates nothing.
/// @param p the call, as for `fa_forward` (its workspace fields are ignored)
/// @param[out] bytes the size (0 on failure)
/// @param[out] err message buffer for failures (may be NULL)
/// @param err_len size of `err` in bytes
/// @return 0, or FA_ERROR_INVALID for a malformed `p`.
FA_CAPI_EXPORT int fa_forward_workspace_size(const fa_attention_params* p, size_t* bytes, char* err, size_t err_len);

/// @brief The step `fa_forward(FA_STEP_AUTO, p, ...)` runs on the current GPU: the fastest one that
/// accepts `p` (validation includes the GPU check). Launches nothing.
/// @param p the call, as for `fa_forward`
/// @param[out] step its number (untouched on failure)
/// @param[out] err message buffer for failures (may be NULL)
/// @param err_len size of `err` in bytes
/// @return 0; or FA_ERROR_INVALID / FA_ERROR_UNSUPPORTED with the reason (no step accepts `p`: the
/// refusal of the most general one, step 00).
FA_CAPI_EXPORT int fa_choose_step(const fa_attention_params* p, int* step, char* err, size_t err_len);

/// @brief Index of a tensor in `fa_backward_params::strides`.
enum {
  FA_TENSOR_DO = 0,  ///< dL/dO, (B, H_q, N_q, D)
  FA_TENSOR_DQ = 1,  ///< dL/dQ, (B, H_q, N_q, D)
  FA_TENSOR_DK = 2,  ///< dL/dK, (B, H_kv, N_kv, D)
  FA_TENSOR_DV = 3,  ///< dL/dV, (B, H_kv, N_kv, D)
};

/// @brief One backward attention call; the C mirror of `fa::BackwardParams`.
///
/// `fwd` is the forward call as it was made, with its output `o` and its `lse` (required: the
/// backward recomputes P from it); they are read, not written. dQ, dK and dV are written; with
/// H_kv < H_q, dK and dV are sums over the query heads that share a KV head. The backward allocates
/// nothing: `workspace` is device memory of at least `fa_backward_workspace_size(&fwd)` bytes,
/// 16-byte aligned. Zero-fill the struct and set both `struct_size` fields.
typedef struct fa_backward_params {
  size_t struct_size;       ///< `sizeof(fa_backward_params)` as the caller compiled it
  fa_attention_params fwd;  ///< the forward call (its own struct_size set too)
  const void* d_o;          ///< device pointer to dL/dO
  void* dq;                 ///< device pointer to dL/dQ (written)
  void* dk;                 ///< device pointer to dL/dK (written)
  void* dv;                 ///< device pointer to dL/dV (written)
  int64_t strides[4][4];    ///< `strides[FA_TENSOR_DO .. FA_TENSOR_DV][FA_AXIS_*]`, in elements
  void* workspace;          ///< device scratch memory, see fa_backward_workspace_size
  size_t workspace_bytes;   ///< its size in bytes
  int32_t deterministic;    ///< 1: bitwise-identical gradients run to run (steps that support it); 0: fastest
  int32_t reserved_flags;   ///< must be zero
  /// With the forward's `sinks` (version 9): device pointer to H_q floats, written with dL/dsinks;
  /// required then, NULL otherwise.
  float* dsinks;
  int64_t reserved[6];  ///< must be zero
} fa_backward_params;

/// @brief `sizeof(fa_backward_params)` in the loaded library, to check a foreign struct layout.
FA_CAPI_EXPORT size_t fa_backward_params_size(void);

/// @brief The scratch memory (bytes) a backward call on `p`'s sizes needs: dQ's fp32 accumulator
/// and D = rowsum(dO∘O), O(B·H_q·N_q·D). Writes 0 and returns FA_ERROR_INVALID for a malformed `p`.
FA_CAPI_EXPORT int fa_backward_workspace_size(const fa_attention_params* p, size_t* bytes, char* err, size_t err_len);

/// @brief 1 when step `step` (its number) has a backward, 0 when it has not; FA_ERROR_INVALID
/// (negative: -FA_ERROR_INVALID) for an unknown step.
FA_CAPI_EXPORT int fa_step_has_backward(int step);

/// @brief Runs the backward of step `step` (a step with a backward; FA_STEP_AUTO: the library's
/// choice, the highest-numbered step with a backward that accepts the call) asynchronously on
/// `stream`. Validation (`fa::validate_backward`) comes first; a refused call writes nothing.
/// @return 0; or FA_ERROR_INVALID, FA_ERROR_UNSUPPORTED or FA_ERROR_RUNTIME with a message.
FA_CAPI_EXPORT int fa_backward(int step, const fa_backward_params* p, void* stream, char* err, size_t err_len);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FA_C_API_H_
