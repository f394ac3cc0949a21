"""The course's C interface (include/fa/c_api.h) through ctypes. No PyTorch here.

Everything the package does goes through five functions of libfa2_capi.so: fa_step_info (the
steps and their lessons), fa_validate (would this step accept this call? launches nothing),
fa_choose_step (which step the library picks, STEP_AUTO), fa_step_describe (its kernel
configuration) and fa_forward (run it on a CUDA stream). Tensors
are device pointers with strides in elements, as the C header says.
"""
from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass
from typing import Optional, Sequence

# fa_status_code
OK, ERROR_INVALID, ERROR_UNSUPPORTED, ERROR_RUNTIME = 0, 1, 2, 3
# fa_attention_params::causal_align, ::dtype
CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 0, 1
DTYPE_BF16, DTYPE_FP16 = 0, 1
STEP_AUTO = -1  # FA_STEP_AUTO: the library chooses the kernel
API_VERSION = 10  # FA_C_API_VERSION this module was written against
# The most query rows per KV head (N_q·H_q/H_kv) the library's decode kernel takes
# (library/split_kv.h's kDecodeMaxPackedRows): a call with more never gets a split workspace.
DECODE_MAX_PACKED_ROWS = 64

LIBRARY_NAME = "libfa2_capi.so"
ENV_LIBRARY = "FA_COURSE_LIB"  # a path to libfa2_capi.so that overrides the packaged one


class AttentionError(RuntimeError):
    """An error the library reported; `code` is its fa_status_code, the message is the library's."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class InvalidCallError(AttentionError, ValueError):
    """FA_ERROR_INVALID: the call itself is malformed (unknown step, bad enum, NULL tensor)."""


class UnsupportedInputError(AttentionError, ValueError):
    """FA_ERROR_UNSUPPORTED: the step refused the input (shape, head dim, strides, GPU)."""


def error_for(code: int, message: str) -> AttentionError:
    if code == ERROR_INVALID:
        return InvalidCallError(code, message)
    if code == ERROR_UNSUPPORTED:
        return UnsupportedInputError(code, message)
    return AttentionError(code, message)


class Params(ctypes.Structure):
    """fa_attention_params, field for field (its size is checked against the library's)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("batch", ctypes.c_int64), ("heads_q", ctypes.c_int64), ("heads_kv", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64), ("seqlen_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64),
        ("strides", (ctypes.c_int64 * 4) * 4),
        ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int32), ("causal_align", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
        ("num_splits", ctypes.c_int32), ("reserved_flags", ctypes.c_int32),
        ("seqlens_kv", ctypes.c_void_p),
        ("block_table", ctypes.c_void_p), ("block_table_stride", ctypes.c_int64), ("page_size", ctypes.c_int64),
        ("num_pages", ctypes.c_int64),
        ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_kv", ctypes.c_void_p), ("total_q", ctypes.c_int64),
        ("total_kv", ctypes.c_int64),
        ("k_new", ctypes.c_void_p), ("v_new", ctypes.c_void_p), ("new_strides", (ctypes.c_int64 * 4) * 2),
        ("seqlen_new", ctypes.c_int64),
        ("has_window", ctypes.c_int64), ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
        ("softcap", ctypes.c_double), ("alibi_slopes", ctypes.c_void_p), ("alibi_slopes_stride_batch", ctypes.c_int64),
        ("sinks", ctypes.c_void_p),
    ]


class BackwardParams(ctypes.Structure):
    """fa_backward_params, field for field (its size is checked against the library's)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("fwd", Params),
        ("d_o", ctypes.c_void_p), ("dq", ctypes.c_void_p), ("dk", ctypes.c_void_p), ("dv", ctypes.c_void_p),
        ("strides", (ctypes.c_int64 * 4) * 4),
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
        ("deterministic", ctypes.c_int32), ("reserved_flags", ctypes.c_int32),
        ("dsinks", ctypes.c_void_p),
        ("reserved", ctypes.c_int64 * 6),
    ]


@dataclass(frozen=True)
class Step:
    """One registered step: steps/NN_name and its one-line lesson."""

    number: int
    name: str
    lesson: str
    causal: bool
    lse: bool

    @property
    def folder(self) -> str:
        return f"{self.number:02d}_{self.name}"


_lib = None


def library_path() -> str:
    """Where the library is loaded from: $FA_COURSE_LIB, else the copy installed in the package."""
    path = os.environ.get(ENV_LIBRARY)
    if path:
        return path
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def lib() -> ctypes.CDLL:
    """The loaded library (once), its interface version and struct size checked."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not os.path.exists(path):
        raise OSError(f"fa_course: {path} not found: install the package (pip install .) or set "
                      f"{ENV_LIBRARY} to a built libfa2_capi.so")
    handle = ctypes.CDLL(path)
    handle.fa_api_version.restype = ctypes.c_int
    handle.fa_attention_params_size.restype = ctypes.c_size_t
    handle.fa_num_steps.restype = ctypes.c_int
    handle.fa_step_info.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_char_p),
                                    ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int),
                                    ctypes.POINTER(ctypes.c_int)]
    handle.fa_validate.argtypes = [ctypes.c_int, ctypes.POINTER(Params), ctypes.c_char_p, ctypes.c_size_t]
    handle.fa_step_describe.argtypes = [ctypes.c_int, ctypes.POINTER(Params), ctypes.c_char_p, ctypes.c_size_t]
    handle.fa_forward.argtypes = [ctypes.c_int, ctypes.POINTER(Params), ctypes.c_void_p, ctypes.c_char_p,
                                  ctypes.c_size_t]
    handle.fa_choose_step.argtypes = [ctypes.POINTER(Params), ctypes.POINTER(ctypes.c_int), ctypes.c_char_p,
                                      ctypes.c_size_t]
    handle.fa_backward_workspace_size.argtypes = [ctypes.POINTER(Params), ctypes.POINTER(ctypes.c_size_t),
                                                  ctypes.c_char_p, ctypes.c_size_t]
    handle.fa_forward_workspace_size.argtypes = [ctypes.POINTER(Params), ctypes.POINTER(ctypes.c_size_t),
                                                 ctypes.c_char_p, ctypes.c_size_t]
    handle.fa_step_has_backward.argtypes = [ctypes.c_int]
    handle.fa_backward_params_size.restype = ctypes.c_size_t
    handle.fa_backward.argtypes = [ctypes.c_int, ctypes.POINTER(BackwardParams), ctypes.c_void_p, ctypes.c_char_p,
                                   ctypes.c_size_t]
    if handle.fa_api_version() != API_VERSION:
        raise OSError(f"fa_course: {path} has C interface version {handle.fa_api_version()}, "
                      f"this module expects {API_VERSION}")
    if handle.fa_attention_params_size() != ctypes.sizeof(Params):
        raise OSError(f"fa_course: {path} has a {handle.fa_attention_params_size()}-byte fa_attention_params, "
                      f"this module a {ctypes.sizeof(Params)}-byte one")
    if handle.fa_backward_params_size() != ctypes.sizeof(BackwardParams):
        raise OSError(f"fa_course: {path} has a {handle.fa_backward_params_size()}-byte fa_backward_params, "
                      f"this module a {ctypes.sizeof(BackwardParams)}-byte one")
    _lib = handle
    return _lib


def steps() -> list:
    """Every registered step, in order."""
    out = []
    handle = lib()
    for i in range(handle.fa_num_steps()):
        number, causal, lse = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        name, lesson = ctypes.c_char_p(), ctypes.c_char_p()
        if handle.fa_step_info(i, ctypes.byref(number), ctypes.byref(name), ctypes.byref(lesson),
                               ctypes.byref(causal), ctypes.byref(lse)) != OK:
            raise AttentionError(ERROR_RUNTIME, f"fa_step_info({i}) failed")
        out.append(Step(number.value, name.value.decode(), lesson.value.decode(), bool(causal.value),
                        bool(lse.value)))
    return out


# The struct's first 232 bytes (pointers, sizes, strides, scale, flags) in one pack: building it
# through ctypes' field setters costs several microseconds a call. Checked against the fields below.
_PACK = struct.Struct("=6Q6q16qf3i")
assert all(getattr(Params, f).offset == o for f, o in (("q", 8), ("batch", 48), ("strides", 96),
                                                        ("softmax_scale", 224), ("dtype", 236), ("workspace", 240),
                                                        ("num_splits", 256), ("seqlens_kv", 264), ("block_table", 272),
                                                        ("num_pages", 296), ("cu_seqlens_q", 304),
                                                        ("total_kv", 328), ("k_new", 336), ("seqlen_new", 416)))


def make_params(*, q: int, k: int, v: int, o: int, lse: int, batch: int, heads_q: int, heads_kv: int,
                seqlen_q: int, seqlen_kv: int, head_dim: int, strides: Sequence[Sequence[int]],
                softmax_scale: float = 0.0, causal: bool = False, bottom_right: bool = False,
                window: Sequence[int] = (-1, -1), softcap: float = 0.0, alibi_slopes: int = 0,
                alibi_slopes_stride_batch: int = 0, sinks: int = 0, dtype: int = DTYPE_BF16) -> Params:
    """A filled fa_attention_params: pointers as integers (0 = NULL), strides[tensor][axis] in elements
    for Q, K, V, O and the axes (batch, head, sequence, dim); the score modifications' cap, and their
    fp32 arrays' device pointers (ALiBi slopes with their batch stride, sinks); the element type
    (DTYPE_BF16 or DTYPE_FP16: the library refuses a type the step is not built for)."""
    p = Params()  # zeroed: no split, no lengths, no pages
    # The scale as C converts it to fp32: a double past fp32's range becomes ±inf (which the library
    # refuses), where struct's "f" would raise OverflowError.
    scale = ctypes.c_float(float(softmax_scale)).value
    _PACK.pack_into(p, 0, ctypes.sizeof(Params), q or 0, k or 0, v or 0, o or 0, lse or 0, batch, heads_q, heads_kv, seqlen_q, seqlen_kv,
                    head_dim, *(int(x) for row in strides for x in row), scale, 1 if causal else 0,
                    CAUSAL_BOTTOM_RIGHT if bottom_right else CAUSAL_TOP_LEFT, int(dtype))
    if window[0] != -1 or window[1] != -1:  # a sliding window (flash-attn's window_size): the library judges it
        p.has_window, p.window_left, p.window_right = 1, int(window[0]), int(window[1])
    if softcap or alibi_slopes or sinks:  # the score modifications: the library judges them
        p.softcap, p.alibi_slopes, p.sinks = float(softcap), alibi_slopes or None, sinks or None
        p.alibi_slopes_stride_batch = int(alibi_slopes_stride_batch)
    return p


_ERR_LEN = 1024


def validate(step: int, p: Params) -> Optional[AttentionError]:
    """None when step `step` accepts `p`, else the error it would raise. No GPU work."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    code = lib().fa_validate(step, ctypes.byref(p), err, _ERR_LEN)
    return None if code == OK else error_for(code, err.value.decode(errors="replace"))


def choose(p: Params) -> int:
    """The step fa_forward(STEP_AUTO) runs for `p` on the current GPU; raises if none accepts it."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    step = ctypes.c_int(-1)
    code = lib().fa_choose_step(ctypes.byref(p), ctypes.byref(step), err, _ERR_LEN)
    if code != OK:
        raise error_for(code, err.value.decode(errors="replace"))
    return step.value


def describe(step: int, p: Params) -> str:
    """The kernel configuration step `step` would use for `p` (empty if it does not say)."""
    buf = ctypes.create_string_buffer(256)
    lib().fa_step_describe(step, ctypes.byref(p), buf, 256)
    return buf.value.decode(errors="replace")


def forward(step: int, p: Params, stream: int) -> None:
    """Queues step `step` on the CUDA stream `stream` (a cudaStream_t as an integer; 0: the legacy
    default stream). Raises the library's error; asynchronous like any launch."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    code = lib().fa_forward(step, ctypes.byref(p), ctypes.c_void_p(stream or None), err, _ERR_LEN)
    if code != OK:
        raise error_for(code, err.value.decode(errors="replace"))


def _workspace_size(query, p: Params) -> int:
    """One of the library's workspace-size queries on `p`, its error raised as the library's."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    size = ctypes.c_size_t(0)
    code = query(ctypes.byref(p), ctypes.byref(size), err, _ERR_LEN)
    if code != OK:
        raise error_for(code, err.value.decode(errors="replace"))
    return size.value


def backward_workspace_size(p: Params) -> int:
    """Bytes of device scratch memory a backward call on `p`'s sizes needs (dQ's fp32 accumulator, D, the
    deterministic mode's turnstiles and the LSE in exp2 units; O(N))."""
    return _workspace_size(lib().fa_backward_workspace_size, p)


def forward_workspace_size(p: Params) -> int:
    """Bytes of device scratch memory the library's choice may use on `p` to split its keys (decode:
    at most DECODE_MAX_PACKED_ROWS query rows per KV head, N_q·H_q/H_kv); 0 when it never splits `p`."""
    return _workspace_size(lib().fa_forward_workspace_size, p)


def has_backward(step: int) -> bool:
    """Whether step `step` has a backward (raises InvalidCallError for an unknown step)."""
    r = lib().fa_step_has_backward(step)
    if r < 0:
        raise InvalidCallError(ERROR_INVALID, f"unknown step {step}")
    return r == 1


def make_backward_params(fwd: Params, *, d_o: int, dq: int, dk: int, dv: int, strides: Sequence[Sequence[int]],
                         workspace: int, workspace_bytes: int, deterministic: bool = False,
                         dsinks: int = 0) -> BackwardParams:
    """A filled fa_backward_params: the forward call `fwd` (with its o and lse), the gradients' device
    pointers as integers, strides[tensor][axis] for dO, dQ, dK, dV, the workspace, and whether the
    gradients must be bitwise identical run to run (`deterministic`)."""
    b = BackwardParams()  # zeroed, `reserved` included
    b.struct_size = ctypes.sizeof(BackwardParams)
    b.fwd = fwd
    b.d_o, b.dq, b.dk, b.dv = d_o or None, dq or None, dk or None, dv or None
    for t in range(4):
        for a in range(4):
            b.strides[t][a] = int(strides[t][a])
    b.workspace, b.workspace_bytes = workspace or None, int(workspace_bytes)
    b.deterministic = 1 if deterministic else 0
    b.dsinks = dsinks or None  # with the forward's sinks: where their gradient goes (H_q floats)
    return b


def backward(step: int, b: BackwardParams, stream: int) -> None:
    """Queues step `step`'s backward (STEP_AUTO: the library's choice) on the CUDA stream `stream`.
    Raises the library's error; asynchronous like any launch."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    code = lib().fa_backward(step, ctypes.byref(b), ctypes.c_void_p(stream or None), err, _ERR_LEN)
    if code != OK:
        raise error_for(code, err.value.decode(errors="replace"))
