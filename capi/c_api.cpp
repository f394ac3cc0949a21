// The C interface of include/fa/c_api.h: a thin translation layer over the step registry.
// It converts the C struct to fa::AttentionParams, checks the enums C cannot check for us, and
// turns every failure (a Status, an exception, a CUDA error) into a return code and a message.
#include "fa/c_api.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <cstring>
#include <exception>
#include <string>

#include "fa/params.h"
#include "fa/registry.h"
#include "library/split_kv.h"

namespace {

// Copies `msg` into the caller's buffer, truncated and always NUL-terminated.
void write_message(char* buf, size_t len, const std::string& msg) {
  if (!buf || len == 0) return;
  const size_t n = msg.size() < len - 1 ? msg.size() : len - 1;
  std::memcpy(buf, msg.data(), n);
  buf[n] = '\0';
}

int fail(char* err, size_t err_len, int code, const std::string& msg) {
  write_message(err, err_len, msg);
  return code;
}

// Row `tensor` of a C struct's strides[tensor][axis] table.
fa::Strides strides_of(const int64_t (&strides)[4][4], int tensor) {
  return fa::Strides{strides[tensor][FA_AXIS_BATCH], strides[tensor][FA_AXIS_HEAD], strides[tensor][FA_AXIS_SEQ],
                     strides[tensor][FA_AXIS_DIM]};
}

// Why a struct's reserved words are not all zero ("" when they are): a later interface's field
// that this library cannot honour, or an uninitialised struct.
template <size_t N>
std::string nonzero_reserved(const int64_t (&reserved)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (reserved[i] != 0)
      return "reserved[" + std::to_string(i) + "] is " + std::to_string(reserved[i]) +
             "; reserved fields must be zero (zero-fill the struct)";
  return "";
}

// The size of a version-5 struct: everything before the varlen fields. A caller built against
// version 5 passes this struct_size; the fields it does not have are read as zero (a version-7 struct
// has no window: has_window zero, no window).
constexpr size_t kVersion5Size = offsetof(fa_attention_params, cu_seqlens_q);

// C struct → C++ params. Returns an empty string on success, else why the struct is malformed.
// (Shape and capability checks are the step's job: fa::validate.)

std::string convert(const fa_attention_params* given, fa::AttentionParams& p) {
  if (!given) return "params is NULL";
  // struct_size first (version 3): a smaller one than version 5's is a caller built against another
  // layout; version 5's lacks the varlen fields and version 6's the append's, zero here; a larger
  // one is a later version's struct, taken only if the fields this library does not know are zero.
  if (given->struct_size < kVersion5Size)
    return "struct_size is " + std::to_string(given->struct_size) + "; set it to sizeof(fa_attention_params), " +
           std::to_string(sizeof(fa_attention_params)) + " in this library (C interface version " +
           std::to_string(FA_C_API_VERSION) + ")";
  if (given->struct_size > sizeof(fa_attention_params)) {
    if (given->struct_size > (size_t(1) << 20))
      return "struct_size " + std::to_string(given->struct_size) + " is not a struct's";
    const unsigned char* extra = reinterpret_cast<const unsigned char*>(given) + sizeof(fa_attention_params);
    for (size_t i = 0; i < given->struct_size - sizeof(fa_attention_params); ++i)
      if (extra[i] != 0)
        return "the struct sets fields past this library's (struct_size " + std::to_string(given->struct_size) +
               ", this library knows " + std::to_string(sizeof(fa_attention_params)) +
               " bytes): a newer C interface's options cannot be honoured here";
  }
  fa_attention_params copy;  // the caller's fields, the ones its version lacks zero
  std::memset(&copy, 0, sizeof copy);
  std::memcpy(&copy, given, std::min(given->struct_size, sizeof copy));
  const fa_attention_params* c = &copy;
  // An element type the C interface knows; whether the step is compiled for it is fa::validate's
  // question (its Capabilities::dtypes), answered as a refusal that names what it takes.
  if (c->dtype != FA_DTYPE_BF16 && c->dtype != FA_DTYPE_FP16)
    return "unknown dtype " + std::to_string(c->dtype) + "; known: 0 (bf16), 1 (fp16)";
  if (c->causal_align != FA_CAUSAL_TOP_LEFT && c->causal_align != FA_CAUSAL_BOTTOM_RIGHT)
    return "unknown causal_align " + std::to_string(c->causal_align) + "; supported: 0 (top-left), 1 (bottom-right)";
  p.q = c->q;
  p.k = c->k;
  p.v = c->v;
  p.o = c->o;
  p.lse = c->lse;
  p.batch = c->batch;
  p.heads_q = c->heads_q;
  p.heads_kv = c->heads_kv;
  p.seqlen_q = c->seqlen_q;
  p.seqlen_kv = c->seqlen_kv;
  p.head_dim = c->head_dim;
  p.q_stride = strides_of(c->strides, FA_TENSOR_Q);
  p.k_stride = strides_of(c->strides, FA_TENSOR_K);
  p.v_stride = strides_of(c->strides, FA_TENSOR_V);
  p.o_stride = strides_of(c->strides, FA_TENSOR_O);
  p.softmax_scale = c->softmax_scale;
  p.causal = c->causal != 0;
  p.causal_align =
      c->causal_align == FA_CAUSAL_BOTTOM_RIGHT ? fa::CausalAlign::bottom_right : fa::CausalAlign::top_left;
  p.dtype = c->dtype == FA_DTYPE_FP16 ? fa::DType::fp16 : fa::DType::bf16;
  if (c->reserved_flags != 0)
    return "reserved_flags is " + std::to_string(c->reserved_flags) + "; it must be zero (zero-fill the struct)";
  p.workspace = c->workspace;
  p.workspace_bytes = c->workspace_bytes;
  p.num_splits = c->num_splits;  // fa::validate judges it (negative, past 64, a short workspace)
  p.seqlens_kv = c->seqlens_kv;
  p.block_table = c->block_table;  // fa::validate judges the four together
  p.block_table_stride = c->block_table_stride;
  p.page_size = c->page_size;
  p.num_pages = c->num_pages;
  p.cu_seqlens_q = c->cu_seqlens_q;  // fa::validate judges the four together
  p.cu_seqlens_kv = c->cu_seqlens_kv;
  p.total_q = c->total_q;
  p.total_kv = c->total_kv;
  p.k_new = c->k_new;  // fa::validate judges the append's fields together
  p.v_new = c->v_new;
  p.k_new_stride = fa::Strides{c->new_strides[0][FA_AXIS_BATCH], c->new_strides[0][FA_AXIS_HEAD],
                               c->new_strides[0][FA_AXIS_SEQ], c->new_strides[0][FA_AXIS_DIM]};
  p.v_new_stride = fa::Strides{c->new_strides[1][FA_AXIS_BATCH], c->new_strides[1][FA_AXIS_HEAD],
                               c->new_strides[1][FA_AXIS_SEQ], c->new_strides[1][FA_AXIS_DIM]};
  p.seqlen_new = c->seqlen_new;
  if (c->has_window != 0 && c->has_window != 1) return "has_window is " + std::to_string(c->has_window) + "; 0 or 1";
  if (c->has_window) {  // fa::validate judges the sizes (-1 or >= 0) and whether the step takes one
    p.window_left = c->window_left;
    p.window_right = c->window_right;
  } else if (c->window_left != 0 || c->window_right != 0) {
    return "window_left and window_right are for a sliding window: set has_window to 1, or zero them";
  }
  p.softcap = float(c->softcap);  // fa::validate judges the modifications (a negative or NaN cap, the step's)
  if (c->softcap != 0.0 && std::isfinite(c->softcap) && p.softcap == 0.0f)
    return "softcap " + std::to_string(c->softcap) + " rounds to 0 in fp32; give 0 for none";
  p.alibi_slopes = c->alibi_slopes;
  p.alibi_slopes_stride_batch = c->alibi_slopes_stride_batch;
  if (!c->alibi_slopes && c->alibi_slopes_stride_batch != 0)
    return "alibi_slopes_stride_batch is for alibi_slopes: zero it, or give the slopes";
  p.sinks = c->sinks;
  return "";
}

// The step, or an FA_ERROR_INVALID message listing the registered ones.
const fa::StepInfo* lookup(int step, std::string& why) {
  if (const fa::StepInfo* s = fa::find_step(step)) return s;
  why = fa::unknown_step_message(step);
  return nullptr;
}

// Shared front half of fa_validate / fa_forward: lookup, conversion, validation. With FA_STEP_AUTO
// the step is the library's choice (fa::choose_step).
int prepare(int step, const fa_attention_params* c, fa::AttentionParams& p, const fa::StepInfo*& info, char* err,
            size_t err_len) {
  std::string why;
  if (step != FA_STEP_AUTO) {
    info = lookup(step, why);
    if (!info) return fail(err, err_len, FA_ERROR_INVALID, why);
  }
  why = convert(c, p);
  if (!why.empty()) return fail(err, err_len, FA_ERROR_INVALID, why);
  if (step == FA_STEP_AUTO) {
    int chosen = -1;
    if (fa::Status st = fa::choose_step(p, &chosen); !st.ok())
      return fail(err, err_len, FA_ERROR_UNSUPPORTED, st.message());
    info = fa::find_step(chosen);
    write_message(err, err_len, "");
    return FA_OK;
  }
  fa::Status st = fa::validate(p, info->caps);
  if (!st.ok()) return fail(err, err_len, FA_ERROR_UNSUPPORTED, st.message());
  write_message(err, err_len, "");
  return FA_OK;
}

// The backward's C struct → C++ params; empty on success, else why it is malformed.
std::string convert_backward(const fa_backward_params* c, fa::BackwardParams& p) {
  if (!c) return "params is NULL";
  if (c->struct_size != sizeof(fa_backward_params))
    return "struct_size is " + std::to_string(c->struct_size) + "; set it to sizeof(fa_backward_params), " +
           std::to_string(sizeof(fa_backward_params)) + " in this library (C interface version " +
           std::to_string(FA_C_API_VERSION) + ")";
  if (std::string why = nonzero_reserved(c->reserved); !why.empty()) return why;
  if (c->reserved_flags != 0)
    return "reserved_flags is " + std::to_string(c->reserved_flags) + "; it must be zero (zero-fill the struct)";
  if (c->deterministic != 0 && c->deterministic != 1)
    return "deterministic is " + std::to_string(c->deterministic) + "; it must be 0 or 1";
  if (std::string why = convert(&c->fwd, p.fwd); !why.empty()) return "fwd: " + why;
  p.deterministic = c->deterministic == 1;
  p.d_o = c->d_o;
  p.dq = c->dq;
  p.dk = c->dk;
  p.dv = c->dv;
  p.do_stride = strides_of(c->strides, FA_TENSOR_DO);
  p.dq_stride = strides_of(c->strides, FA_TENSOR_DQ);
  p.dk_stride = strides_of(c->strides, FA_TENSOR_DK);
  p.dv_stride = strides_of(c->strides, FA_TENSOR_DV);
  p.workspace = c->workspace;
  p.workspace_bytes = c->workspace_bytes;
  p.dsinks = c->dsinks;  // fa::validate_backward: required with sinks, refused without
  return "";
}

}  // namespace

extern "C" {

size_t fa_backward_params_size(void) {
  return sizeof(fa_backward_params);
}

int fa_backward_workspace_size(const fa_attention_params* p, size_t* bytes, char* err, size_t err_len) {
  try {
    if (bytes) *bytes = 0;
    fa::AttentionParams params;
    if (std::string why = convert(p, params); !why.empty()) return fail(err, err_len, FA_ERROR_INVALID, why);
    if (params.batch < 1 || params.heads_q < 1 || params.seqlen_q < 1 || params.head_dim < 1 ||
        params.batch > (int64_t(1) << 31) || params.heads_q > (int64_t(1) << 31) ||
        params.seqlen_q > (int64_t(1) << 40) || params.head_dim > 1024)
      return fail(err, err_len, FA_ERROR_INVALID, "B, H_q, N_q and D must be positive and of a real call's size");
    if (bytes) *bytes = fa::backward_workspace_bytes(params);
    write_message(err, err_len, "");
    return FA_OK;
  } catch (const std::exception& e) {
    return fail(err, err_len, FA_ERROR_RUNTIME, e.what());
  }
}

int fa_forward_workspace_size(const fa_attention_params* p, size_t* bytes, char* err, size_t err_len) {
  try {
    if (bytes) *bytes = 0;
    fa::AttentionParams params;
    if (std::string why = convert(p, params); !why.empty()) return fail(err, err_len, FA_ERROR_INVALID, why);
    if (params.batch < 1 || params.heads_q < 1 || params.heads_kv < 1 || params.seqlen_q < 1 || params.seqlen_kv < 1 ||
        params.head_dim < 1 || params.batch > (int64_t(1) << 31) || params.heads_q > (int64_t(1) << 31) ||
        params.seqlen_q > (int64_t(1) << 40) || params.head_dim > 1024)
      return fail(err, err_len, FA_ERROR_INVALID,
                  "B, H_q, H_kv, N_q, N_kv and D must be positive and of a real call's size");
    if (bytes) *bytes = fa::forward_workspace_bytes(params);
    write_message(err, err_len, "");
    return FA_OK;
  } catch (const std::exception& e) {
    return fail(err, err_len, FA_ERROR_RUNTIME, e.what());
  }
}

int fa_step_has_backward(int step) {
  const fa::StepInfo* s = fa::find_step(step);
  if (!s) return -FA_ERROR_INVALID;
  return s->backward ? 1 : 0;
}

int fa_backward(int step, const fa_backward_params* p, void* stream, char* err, size_t err_len) {
  try {
    fa::BackwardParams params;
    if (std::string why = convert_backward(p, params); !why.empty()) return fail(err, err_len, FA_ERROR_INVALID, why);
    if (step == FA_STEP_AUTO) {
      int ran = -1;
      fa::Status st = fa::backward_auto(params, static_cast<cudaStream_t>(stream), &ran);
      if (!st.ok()) return fail(err, err_len, st.unsupported() ? FA_ERROR_UNSUPPORTED : FA_ERROR_RUNTIME, st.message());
      write_message(err, err_len, "");
      return FA_OK;
    }
    std::string why;
    const fa::StepInfo* info = lookup(step, why);
    if (!info) return fail(err, err_len, FA_ERROR_INVALID, why);
    if (!info->backward)
      return fail(err, err_len, FA_ERROR_UNSUPPORTED,
                  "step " + std::to_string(step) + " has no backward (fa_step_has_backward says which do)");
    fa::Status st = info->backward(params, static_cast<cudaStream_t>(stream));
    if (!st.ok()) return fail(err, err_len, st.unsupported() ? FA_ERROR_UNSUPPORTED : FA_ERROR_RUNTIME, st.message());
    write_message(err, err_len, "");
    return FA_OK;
  } catch (const std::exception& e) {
    return fail(err, err_len, FA_ERROR_RUNTIME, e.what());
  } catch (...) {
    return fail(err, err_len, FA_ERROR_RUNTIME, "unknown exception");
  }
}

int fa_api_version(void) {
  return FA_C_API_VERSION;
}

size_t fa_attention_params_size(void) {
  return sizeof(fa_attention_params);
}

int fa_num_steps(void) {
  return static_cast<int>(fa::steps().size());
}

int fa_step_info(int index, int* number, const char** name, const char** lesson, int* supports_causal,
                 int* supports_lse) {
  const auto& all = fa::steps();
  if (index < 0 || static_cast<size_t>(index) >= all.size()) return FA_ERROR_INVALID;
  const fa::StepInfo& s = all[static_cast<size_t>(index)];
  // The registry is filled once at load time and never changes, so these pointers stay valid.
  if (number) *number = s.number;
  if (name) *name = s.name.c_str();
  if (lesson) *lesson = s.lesson.c_str();
  if (supports_causal) *supports_causal = s.caps.causal ? 1 : 0;
  if (supports_lse) *supports_lse = s.caps.lse ? 1 : 0;
  return FA_OK;
}

int fa_validate(int step, const fa_attention_params* p, char* err, size_t err_len) {
  try {
    fa::AttentionParams params;
    const fa::StepInfo* info = nullptr;
    return prepare(step, p, params, info, err, err_len);
  } catch (const std::exception& e) {
    return fail(err, err_len, FA_ERROR_RUNTIME, e.what());
  } catch (...) {
    return fail(err, err_len, FA_ERROR_RUNTIME, "unknown exception");
  }
}

// `buf` receives a description or nothing: an error is never written where a caller expects a
// configuration name (the code says what went wrong; fa_validate says why).
int fa_step_describe(int step, const fa_attention_params* p, char* buf, size_t buf_len) {
  write_message(buf, buf_len, "");
  try {
    std::string why;
    fa::AttentionParams params;
    if (step == FA_STEP_AUTO) {
      if (!convert(p, params).empty()) return FA_ERROR_INVALID;
      int chosen = -1;
      if (!fa::choose_step(params, &chosen).ok()) return FA_ERROR_UNSUPPORTED;
      write_message(buf, buf_len,
                    "step " + std::to_string(chosen) + ": " + fa::describe_config(*fa::find_step(chosen), params));
      return FA_OK;
    }
    const fa::StepInfo* info = lookup(step, why);
    if (!info) return FA_ERROR_INVALID;
    why = convert(p, params);
    if (!why.empty()) return FA_ERROR_INVALID;
    write_message(buf, buf_len, fa::describe_config(*info, params));
    return FA_OK;
  } catch (...) {
    write_message(buf, buf_len, "");
    return FA_ERROR_RUNTIME;
  }
}

int fa_forward(int step, const fa_attention_params* p, void* stream, char* err, size_t err_len) {
  try {
    fa::AttentionParams params;
    const fa::StepInfo* info = nullptr;
    if (step == FA_STEP_AUTO) {
      std::string why = convert(p, params);
      if (!why.empty()) return fail(err, err_len, FA_ERROR_INVALID, why);
      int ran = -1;
      fa::Status st = fa::forward_auto(params, static_cast<cudaStream_t>(stream), &ran);
      if (!st.ok()) return fail(err, err_len, st.unsupported() ? FA_ERROR_UNSUPPORTED : FA_ERROR_RUNTIME, st.message());
      write_message(err, err_len, "");
      return FA_OK;
    }
    if (int rc = prepare(step, p, params, info, err, err_len); rc != FA_OK) return rc;
    fa::Status st = info->forward(params, static_cast<cudaStream_t>(stream));
    // A refusal is UNSUPPORTED whichever check made it; RUNTIME is kept for CUDA failures.
    if (!st.ok()) return fail(err, err_len, st.unsupported() ? FA_ERROR_UNSUPPORTED : FA_ERROR_RUNTIME, st.message());
    return FA_OK;
  } catch (const std::exception& e) {
    return fail(err, err_len, FA_ERROR_RUNTIME, e.what());
  } catch (...) {
    return fail(err, err_len, FA_ERROR_RUNTIME, "unknown exception");
  }
}

int fa_choose_step(const fa_attention_params* p, int* step, char* err, size_t err_len) {
  try {
    fa::AttentionParams params;
    const fa::StepInfo* info = nullptr;
    if (int rc = prepare(FA_STEP_AUTO, p, params, info, err, err_len); rc != FA_OK) return rc;
    if (step) *step = info->number;
    return FA_OK;
  } catch (const std::exception& e) {
    return fail(err, err_len, FA_ERROR_RUNTIME, e.what());
  } catch (...) {
    return fail(err, err_len, FA_ERROR_RUNTIME, "unknown exception");
  }
}

}  // extern "C"
