"""`attention` as a PyTorch custom op: `torch.ops.fa_course.forward`, with a fake (meta)
implementation, so that torch.compile traces it without a graph break and CUDA graphs capture it.

Layout: q is (B, N_q, H_q, D), k and v (B, N_kv, H_kv, D), like flash_attn_func; any strides the
chosen step accepts (a (B, H, N, D) tensor passed as `x.transpose(1, 2)` is such a view). O comes
back contiguous (B, N_q, H_q, D), LSE contiguous fp32 (B, H_q, N_q).
"""
import functools
from typing import Optional, Tuple

import torch

from . import _capi

_ALIGNS = {"top_left": False, "bottom_right": True}
# The largest magnitude that rounds to 0 in fp32 (half the smallest subnormal, 2^-149; the tie goes
# to the even neighbour, 0). Plain float arithmetic, so that torch.compile traces the check.
_FP32_ROUNDS_TO_ZERO = 2.0 ** -150
_refused_by_device: dict = {}  # (device index, step) -> message: steps this GPU cannot run at all


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


@functools.lru_cache(maxsize=None)
def _candidates() -> tuple:
    """Step numbers, fastest first: the course's later steps are its faster ones."""
    return tuple(sorted((s.number for s in _capi.steps()), reverse=True))


def _stream(device: int) -> int:
    """The current CUDA stream of `device` as an integer (a cudaStream_t)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object: ~1 µs cheaper
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _first_step(p: _capi.Params, device: int) -> Tuple[int, Optional[_capi.AttentionError]]:
    """The fastest step that accepts `p` and that this GPU has not refused; (-1, why not) if none."""
    last: Optional[_capi.AttentionError] = None
    for s in _candidates():
        if (device, s) in _refused_by_device:
            continue
        err = _capi.validate(s, p)
        if err is None:
            return s, None
        last = err
    return -1, last


def _outputs_and_params(q, k, v, causal, bottom_right, softmax_scale, return_lse):
    b, n_q, h_q, d = q.shape
    o = torch.empty((b, n_q, h_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h_q, n_q) if return_lse else (0,), dtype=torch.float32, device=q.device)
    return o, lse, _params(q, k, v, o, lse if return_lse else None, causal, bottom_right, softmax_scale)


def _run(q, k, v, causal, bottom_right, softmax_scale, return_lse, step):
    """The op's body, on q's device (the caller made it current)."""
    o, lse, p = _outputs_and_params(q, k, v, causal, bottom_right, softmax_scale, return_lse)
    device = q.device.index
    stream = _stream(device)
    if step >= 0:
        _capi.forward(step, p, stream)
        return o, lse
    # fa_forward validates before any GPU work and writes nothing when it refuses, so the
    # candidates are tried by launching them: no separate fa_validate on this path.
    last: Optional[_capi.AttentionError] = None
    for s in _candidates():
        if (device, s) in _refused_by_device:
            continue
        try:
            _capi.forward(s, p, stream)
            return o, lse
        except _capi.UnsupportedInputError as e:
            # The GPU check (library/validate.cpp, check_device) is the one refusal that holds for
            # every later call on this device: remembered, so that later calls skip the step.
            if "built for compute capability" in str(e):
                _refused_by_device[(device, s)] = str(e)
            last = e
    raise last if last is not None else _capi.UnsupportedInputError(_capi.ERROR_UNSUPPORTED, "no step accepts this call")


def _forward(q, k, v, causal, bottom_right, softmax_scale, return_lse, step):
    """One attention forward; step < 0: the fastest step that accepts the call on this GPU."""
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
    s, why = _first_step(p, q.device.index)
    if s < 0:
        raise why if why is not None else _capi.UnsupportedInputError(_capi.ERROR_UNSUPPORTED, "no step accepts this call")
    return s, p


def pick_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              causal_align: str = "top_left", return_lse: bool = False) -> int:
    """The step `attention(q, k, v, ..., step=None)` runs for these tensors and options: the
    highest-numbered one that accepts them, leaving out the steps this GPU refused at an earlier
    launch (a Hopper-only step on another GPU is refused at its first launch, then skipped).
    Launches nothing."""
    return _picked(q, k, v, causal, causal_align, return_lse, "pick_step")[0]


def describe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
             causal_align: str = "top_left", return_lse: bool = False) -> str:
    """"step N: <kernel configuration>" for what `attention(..., step=None)` runs on these tensors,
    e.g. "step 15: BLOCK_M=128 BLOCK_N=128 warps=12 stages=3 (tuned)": the tuner's remembered
    choice for this shape, or the heuristic's before the first call has tuned it. Launches nothing."""
    s, p = _picked(q, k, v, causal, causal_align, return_lse, "describe")
    return f"step {s}: {_capi.describe(s, p)}"
