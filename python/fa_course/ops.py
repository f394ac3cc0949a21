"""`attention` as a PyTorch custom op: `torch.ops.fa_course.forward`, with a fake (meta)
implementation, so that torch.compile traces it without a graph break and CUDA graphs capture it.

Layout: q is (B, N_q, H_q, D), k and v (B, N_kv, H_kv, D), like flash_attn_func; any strides the
chosen step accepts (a (B, H, N, D) tensor passed as `x.transpose(1, 2)` is such a view). O comes
back contiguous (B, N_q, H_q, D), LSE contiguous fp32 (B, H_q, N_q).
"""
from typing import Optional, Tuple

import torch

from . import _capi

_ALIGNS = {"top_left": False, "bottom_right": True}
# The largest magnitude that rounds to 0 in fp32 (half the smallest subnormal, 2^-149; the tie goes
# to the even neighbour, 0). Plain float arithmetic, so that torch.compile traces the check.
_FP32_ROUNDS_TO_ZERO = 2.0 ** -150


def _strides(t: torch.Tensor) -> list:
    """(batch, head, sequence, dim) strides of a (B, N, H, D) tensor, in elements."""
    s = t.stride()
    return [s[0], s[2], s[1], s[3]]


def _params(q, k, v, o, lse, causal, bottom_right, softmax_scale) -> _capi.Params:
    b, n_q, h_q, d = q.shape
    return _capi.make_params(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), lse=lse.data_ptr() if lse is not None else 0,
        batch=b, heads_q=h_q, heads_kv=k.shape[2], seqlen_q=n_q, seqlen_kv=k.shape[1], head_dim=d,
        strides=[_strides(q), _strides(k), _strides(v), _strides(o)], softmax_scale=softmax_scale, causal=causal,
        bottom_right=bottom_right)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """What the C interface cannot see: tensor kinds. Shapes and strides are the library's to judge."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"fa_course.attention: {name} must be 4-D (B, N, H, D), got shape {tuple(t.shape)}")
        if not t.is_cuda:
            raise ValueError(f"fa_course.attention: {name} must be a CUDA tensor, got device {t.device}")
        if t.dtype != torch.bfloat16:
            raise ValueError(f"fa_course.attention: {name} must be bfloat16, got {t.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"fa_course.attention: q, k, v on different devices ({q.device}, {k.device}, {v.device})")
    if k.shape != v.shape:
        raise ValueError(f"fa_course.attention: k and v differ in shape: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"fa_course.attention: q {tuple(q.shape)} and k {tuple(k.shape)} differ in B or D")


def _stream(device: int) -> int:
    """The current CUDA stream of `device` as an integer (a cudaStream_t)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object: ~1 µs cheaper
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _outputs_and_params(q, k, v, causal, bottom_right, softmax_scale, return_lse):
    b, n_q, h_q, d = q.shape
    o = torch.empty((b, n_q, h_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h_q, n_q) if return_lse else (0,), dtype=torch.float32, device=q.device)
    return o, lse, _params(q, k, v, o, lse if return_lse else None, causal, bottom_right, softmax_scale)


def _run(q, k, v, causal, bottom_right, softmax_scale, return_lse, step):
    """The op's body, on q's device (the caller made it current). step < 0: the library's choice
    (FA_STEP_AUTO: the fastest kernel this GPU runs that accepts the call, chosen in C)."""
    o, lse, p = _outputs_and_params(q, k, v, causal, bottom_right, softmax_scale, return_lse)
    _capi.forward(step if step >= 0 else _capi.STEP_AUTO, p, _stream(q.device.index))
    return o, lse


def _forward(q, k, v, causal, bottom_right, softmax_scale, return_lse, step):
    """One attention forward; step < 0: the fastest kernel that accepts the call on this GPU (a production kernel)."""
    _check(q, k, v)
    if q.device.index == torch.cuda.current_device():  # the common case skips the device guard's cost
        return _run(q, k, v, causal, bottom_right, softmax_scale, return_lse, step)
    with torch.cuda.device(q.device):
        return _run(q, k, v, causal, bottom_right, softmax_scale, return_lse, step)


def _forward_fake(q, k, v, causal, bottom_right, softmax_scale, return_lse, step):
    """Shapes and dtypes only, for torch.compile's tracing and meta tensors."""
    b, n_q, h_q, d = q.shape
    o = q.new_empty((b, n_q, h_q, d))
    lse = q.new_empty((b, h_q, n_q) if return_lse else (0,), dtype=torch.float32)
    return o, lse


# Registered with the low-level torch.library API: a schema, a kernel for the CUDA (and CPU, which
# only refuses) dispatch keys, a fake. The @torch.library.custom_op decorator gives the same op with
# less code, but wraps every call in Python layers that cost about as much again as the op's body
# (scripts/package_overhead.py measures both).
_LIB = torch.library.Library("fa_course", "DEF")
_LIB.define("forward(Tensor q, Tensor k, Tensor v, bool causal, bool bottom_right, float softmax_scale, "
            "bool return_lse, int step) -> (Tensor, Tensor)")
_LIB.impl("forward", _forward, "CUDA")
_LIB.impl("forward", _forward, "CPU")  # so that CPU tensors get _check's message, not the dispatcher's
torch.library.register_fake("fa_course::forward", _forward_fake, lib=_LIB)
forward = torch.ops.fa_course.forward.default

# ---- autograd ---------------------------------------------------------------------------------
# Without an autograd kernel PyTorch only warns and q, k, v silently get no gradient from the op.
# The backward pass is its own op, so that torch.compile traces a graph through it (its fake gives
# the shapes) and the refusal comes when a gradient is asked for, not when a model is compiled or
# run for inference with inputs that require grad. The course's backward kernels will implement
# it; until then it raises.
BACKWARD_MISSING = ("fa_course.attention has no backward pass yet: the course's backward kernels are not built, so "
                    "q, k and v cannot get a gradient from it. Run attention under torch.no_grad() (inference), or "
                    "use an attention that trains (torch.nn.functional.scaled_dot_product_attention; in transformers, "
                    "attn_implementation='sdpa').")

_LIB.define("backward(Tensor grad_o, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal, "
            "bool bottom_right, float softmax_scale) -> (Tensor, Tensor, Tensor)")


def _backward_kernel(grad_o, q, k, v, o, lse, causal, bottom_right, softmax_scale):
    raise NotImplementedError(BACKWARD_MISSING)


def _backward_fake(grad_o, q, k, v, o, lse, causal, bottom_right, softmax_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_LIB.impl("backward", _backward_kernel, "CUDA")
_LIB.impl("backward", _backward_kernel, "CPU")
torch.library.register_fake("fa_course::backward", _backward_fake, lib=_LIB)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, bottom_right, softmax_scale, _, _ = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.options = (causal, bottom_right, softmax_scale)


def _backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    dq, dk, dv = torch.ops.fa_course.backward.default(grad_o, q, k, v, o, lse, *ctx.options)
    return dq, dk, dv, None, None, None, None, None


torch.library.register_autograd("fa_course::forward", _backward, setup_context=_setup_context, lib=_LIB)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              causal_align: str = "top_left", softmax_scale: Optional[float] = None, return_lse: bool = False,
              step: Optional[int] = None):
    """softmax(scale · q·kᵀ [+ causal mask]) · v for (B, N, H, D) bf16 CUDA tensors.

    causal_align: "top_left" (key j visible to query i when j <= i, PyTorch's is_causal) or
    "bottom_right" (j <= i + N_kv − N_q, flash-attn's). softmax_scale: default 1/sqrt(D).
    GQA: H_q a multiple of H_kv. return_lse: also LSE = scale·max + log(sum), fp32 (B, H_q, N_q).
    step: a course step number (fa_course.steps()), or None for the fastest this GPU runs.
    Returns O (B, N_q, H_q, D), or (O, LSE).

    Forward only: with inputs that require grad the op runs, and asking for a gradient through it
    raises NotImplementedError (fa_course.ops.BACKWARD_MISSING) rather than giving none.
    """
    if causal_align not in _ALIGNS:
        raise ValueError(f"fa_course.attention: causal_align must be 'top_left' or 'bottom_right', got {causal_align!r}")
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    # In the C struct the scale is an fp32 and 0 means "1/sqrt(D)": a scale that rounds to 0 would
    # silently become the default. That is the one case only this layer can see.
    if softmax_scale is not None and abs(scale) <= _FP32_ROUNDS_TO_ZERO:
        raise ValueError(f"fa_course.attention: softmax_scale {softmax_scale} rounds to 0 in fp32 (0 asks for the "
                         "default 1/sqrt(D)); the library refuses other non-positive or non-finite scales itself")
    o, lse = forward(q, k, v, bool(causal), _ALIGNS[causal_align], scale, bool(return_lse),
                     -1 if step is None else int(step))
    return (o, lse) if return_lse else o


def _picked(q, k, v, causal, causal_align, return_lse, what):
    _check(q, k, v)
    if causal_align not in _ALIGNS:
        raise ValueError(f"fa_course.{what}: causal_align must be 'top_left' or 'bottom_right', got {causal_align!r}")
    _, _, p = _outputs_and_params(q, k, v, bool(causal), _ALIGNS[causal_align], 0.0, bool(return_lse))
    with torch.cuda.device(q.device):  # the GPU check is the device's
        return _capi.choose(p), p


def pick_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              causal_align: str = "top_left", return_lse: bool = False) -> int:
    """The step `attention(q, k, v, ..., step=None)` runs for these tensors and options on their
    GPU: the library's choice (fa_choose_step), the fastest that accepts them. Launches nothing."""
    return _picked(q, k, v, causal, causal_align, return_lse, "pick_step")[0]


def describe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
             causal_align: str = "top_left", return_lse: bool = False) -> str:
    """"step N: <kernel configuration>" for what `attention(..., step=None)` runs on these tensors,
    e.g. "step 15: BLOCK_M=128 BLOCK_N=128 warps=12 stages=3 (tuned)": the tuner's remembered
    choice for this shape, or the heuristic's before the first call has tuned it. Launches nothing."""
    s, p = _picked(q, k, v, causal, causal_align, return_lse, "describe")
    with torch.cuda.device(q.device):
        return f"step {s}: {_capi.describe(s, p)}"


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"fa_course.flash_attn_func: {what} is not supported yet (the course's later parts "
                               "add it); the call was refused rather than computed without it")


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                    softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, return_lse: bool = False):
    """flash-attn's `flash_attn_func`, same names, order and layout: q (B, N_q, H_q, D), k and v
    (B, N_kv, H_kv, D), bf16 on a CUDA GPU; GQA by head counts; `causal` aligned bottom-right (the
    last query sees every key), as flash-attn does. The library chooses the kernel.

    Options the course does not have yet refuse with NotImplementedError instead of being ignored:
    dropout_p > 0, a window other than (-1, -1), softcap, alibi_slopes, return_attn_probs.
    `deterministic` is accepted (the forward is deterministic). Returns out, or (out, lse) with
    return_lse=True; lse is fp32 (B, H_q, N_q), natural log."""
    if dropout_p:
        raise _unsupported(f"dropout (dropout_p={dropout_p})")
    if tuple(window_size) != (-1, -1):
        raise _unsupported(f"a sliding window (window_size={tuple(window_size)})")
    if softcap:
        raise _unsupported(f"logit softcapping (softcap={softcap})")
    if alibi_slopes is not None:
        raise _unsupported("ALiBi (alibi_slopes)")
    if return_attn_probs:
        raise _unsupported("return_attn_probs (the probabilities are never stored; return_lse=True gives the LSE)")
    return attention(q, k, v, causal=causal, causal_align="bottom_right", softmax_scale=softmax_scale,
                     return_lse=return_lse)
