"""`attention` as PyTorch custom ops: `torch.ops.fa_course.forward` and its gradient,
`torch.ops.fa_course.backward`, each with a fake (meta) implementation, so that torch.compile traces
a training step without a graph break and CUDA graphs capture it.

Layout: q is (B, N_q, H_q, D), k and v (B, N_kv, H_kv, D), like flash_attn_func; any strides the
chosen step accepts (a (B, H, N, D) tensor passed as `x.transpose(1, 2)` is such a view). O comes
back contiguous (B, N_q, H_q, D), LSE contiguous fp32 (B, H_q, N_q).
"""
from typing import Optional

import torch

from . import _capi

_ALIGNS = {"top_left": False, "bottom_right": True}
# The largest magnitude that rounds to 0 in fp32 (half the smallest subnormal, 2^-149; the tie goes
# to the even neighbour, 0). Plain float arithmetic, so that torch.compile traces the check.
_FP32_ROUNDS_TO_ZERO = 2.0 ** -150
# The head dims the library's backwards have: every one the forwards have (kernels/bwd_mma.cu: 32 to
# 256 where built, 256 on sm_90 alone; kernels/bwd_hopper.cu: 32 to 128, and kernel 101 hands 192 and
# 256 to the mma.sync one). The backward at 256 before sm_90 is refused here, before the forward runs; a
# head dim no kernel has at all (80, say) is the library's to refuse, as unsupported input.
# The element types: bf16 everywhere; fp16 in the production kernels where the library is built with
# it (FA_DTYPES=bf16;fp16), forward, backward, KV cache and varlen alike; elsewhere (a bf16-only
# build, a lesson pinned by step=) the library refuses it by name before anything runs.
_DTYPES = {torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_FP16}


def _strides(t: torch.Tensor) -> list:
    """(batch, head, sequence, dim) strides of a (B, N, H, D) tensor, in elements."""
    s = t.stride()
    return [s[0], s[2], s[1], s[3]]


def _params(q, k, v, o, lse, causal, bottom_right, softmax_scale, window=(-1, -1), mods=None) -> _capi.Params:
    """mods: None, or (softcap, alibi_slopes, sinks) as _check_mods accepts them."""
    b, n_q, h_q, d = q.shape
    extra = {}
    if mods is not None:
        softcap, alibi, sinks = mods
        extra = dict(softcap=softcap, alibi_slopes=alibi.data_ptr() if alibi is not None else 0,
                     alibi_slopes_stride_batch=_alibi_stride(alibi),
                     sinks=sinks.data_ptr() if sinks is not None else 0)
    return _capi.make_params(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), lse=lse.data_ptr() if lse is not None else 0,
        batch=b, heads_q=h_q, heads_kv=k.shape[2], seqlen_q=n_q, seqlen_kv=k.shape[1], head_dim=d,
        strides=[_strides(q), _strides(k), _strides(v), _strides(o)], softmax_scale=softmax_scale, causal=causal,
        bottom_right=bottom_right, window=window, dtype=_DTYPES[q.dtype], **extra)


def _check_mods(q, softcap, alibi_slopes, sinks, batch_heads=None):
    """The score modifications' arrays as the library reads them: fp32 on q's GPU, contiguous, ALiBi slopes
    (H_q,) or (B, H_q) and sinks (H_q,). None when there are none; else (softcap, alibi_slopes, sinks).
    batch_heads: (B, H_q) where q is not (B, N, H_q, D) (varlen's packed q)."""
    if not softcap and alibi_slopes is None and sinks is None:
        return None
    b, h_q = batch_heads if batch_heads is not None else (q.shape[0], q.shape[2])
    for name, t, shapes in (("alibi_slopes", alibi_slopes, ((h_q,), (b, h_q))), ("sinks", sinks, ((h_q,),))):
        if t is not None and (t.dtype != torch.float32 or t.device != q.device or tuple(t.shape) not in shapes or
                              not t.is_contiguous()):
            raise ValueError(f"fa_course: {name} must be a contiguous float32 tensor of shape "
                             f"{' or '.join(str(x) for x in shapes)} on {q.device}, got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")
    return float(softcap), alibi_slopes, sinks


def _alibi_stride(alibi) -> int:
    """The C interface's alibi_slopes_stride_batch of _check_mods' contiguous slopes: H_q for (B, H_q)
    with B > 1, else 0 (one per head; a (1, H_q) tensor's first stride may be anything)."""
    return alibi.shape[1] if alibi is not None and alibi.dim() == 2 and alibi.shape[0] > 1 else 0


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, paged: bool = False, fn: str = "attention") -> None:
    """What the C interface cannot see: tensor kinds. Shapes and strides are the library's to judge.
    paged: k and v are pools of pages, (num_pages, page_size, H_kv, D), whose first size is not B.
    fn: the function the caller called, for the messages."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"fa_course.{fn}: {name} must be 4-D (B, N, H, D), got shape {tuple(t.shape)}")
        if not t.is_cuda:
            raise ValueError(f"fa_course.{fn}: {name} must be a CUDA tensor, got device {t.device}")
        if t.dtype not in _DTYPES:
            raise ValueError(f"fa_course.{fn}: {name} must be bfloat16 (every kernel) or float16 (the production "
                             f"kernels, where the library is built with it): cast with .to(torch.bfloat16), got "
                             f"{t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"fa_course.{fn}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"fa_course.{fn}: q, k, v on different devices ({q.device}, {k.device}, {v.device})")
    if k.shape != v.shape:
        raise ValueError(f"fa_course.{fn}: k and v differ in shape: {tuple(k.shape)} vs {tuple(v.shape)}")
    if (not paged and q.shape[0] != k.shape[0]) or q.shape[3] != k.shape[3]:
        raise ValueError(f"fa_course.{fn}: q {tuple(q.shape)} and k {tuple(k.shape)} differ in B or D")


def _stream(device: int) -> int:
    """The current CUDA stream of `device` as an integer (a cudaStream_t)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object: ~1 µs cheaper
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _outputs_and_params(q, k, v, causal, bottom_right, softmax_scale, return_lse, window=(-1, -1), mods=None):
    b, n_q, h_q, d = q.shape
    o = torch.empty((b, n_q, h_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h_q, n_q) if return_lse else (0,), dtype=torch.float32, device=q.device)
    return o, lse, _params(q, k, v, o, lse if return_lse else None, causal, bottom_right, softmax_scale, window, mods)


def _run(q, k, v, causal, bottom_right, softmax_scale, return_lse, step, window=(-1, -1), mods=None):
    """The op's body, on q's device (the caller made it current). step < 0: the library's choice
    (FA_STEP_AUTO: the fastest kernel this GPU runs that accepts the call, chosen in C)."""
    o, lse, p = _outputs_and_params(q, k, v, causal, bottom_right, softmax_scale, return_lse, window, mods)
    workspace = None
    # The library's choice splits a decode call's keys, its workspace from PyTorch's allocator. Only a
    # call with few query rows per KV head can be one: the others skip the size query (a C call).
    if step < 0 and q.shape[1] * (q.shape[2] // k.shape[2]) <= _capi.DECODE_MAX_PACKED_ROWS:
        bytes_ = _capi.forward_workspace_size(p)
        if bytes_:
            workspace = torch.empty(bytes_, dtype=torch.uint8, device=q.device)
            p.workspace, p.workspace_bytes = workspace.data_ptr(), bytes_
    _capi.forward(step if step >= 0 else _capi.STEP_AUTO, p, _stream(q.device.index))
    return o, lse


def _forward(q, k, v, causal, bottom_right, softmax_scale, return_lse, step, deterministic=False, window_left=-1,
             window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None):
    """One attention forward; step < 0: the fastest kernel that accepts the call on this GPU (a
    production kernel). `deterministic` is the backward's (every forward is deterministic).
    window_left, window_right: a sliding window (flash-attn's window_size; -1 unbounded). softcap,
    alibi_slopes, sinks: the score modifications (fp32 arrays; see `attention`)."""
    _check(q, k, v)
    window = (window_left, window_right)
    mods = _check_mods(q, softcap, alibi_slopes, sinks)
    try:
        if q.device.index == torch.cuda.current_device():  # the common case skips the device guard's cost
            return _run(q, k, v, causal, bottom_right, softmax_scale, return_lse, step, window, mods)
        with torch.cuda.device(q.device):
            return _run(q, k, v, causal, bottom_right, softmax_scale, return_lse, step, window, mods)
    except _capi.UnsupportedInputError as e:
        if return_lse and "does not write LSE" in str(e):  # attention asks for it when a gradient may follow
            raise _capi.UnsupportedInputError(e.code, f"{e} (step {step}). fa_course.attention asks for the LSE with "
                                              "return_lse=True and whenever q, k or v requires grad, since the "
                                              "backward needs it: run this step under torch.no_grad(), or take one "
                                              "that writes the LSE") from None
        raise


def _forward_fake(q, k, v, causal, bottom_right, softmax_scale, return_lse, step, deterministic=False, window_left=-1,
                  window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None):
    """Shapes and dtypes only, for torch.compile's tracing and meta tensors."""
    b, n_q, h_q, d = q.shape
    o = q.new_empty((b, n_q, h_q, d))
    lse = q.new_empty((b, h_q, n_q) if return_lse else (0,), dtype=torch.float32)
    return o, lse


# Registered with the low-level torch.library API: a schema, a kernel for the CUDA (and CPU, which
# only refuses) dispatch keys, a fake. The @torch.library.custom_op decorator gives the same op with
# less code, but wraps every call in Python layers that cost about as much again as the op's body
# (scripts/package_overhead.py measures both). `deterministic` only travels to the backward; it has
# a default, so that the eight-argument call of the forward alone keeps its meaning.
_LIB = torch.library.Library("fa_course", "DEF")
_LIB.define("forward(Tensor q, Tensor k, Tensor v, bool causal, bool bottom_right, float softmax_scale, "
            "bool return_lse, int step, bool deterministic=False, int window_left=-1, int window_right=-1, "
            "float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None) -> (Tensor, Tensor)")
_LIB.impl("forward", _forward, "CUDA")
_LIB.impl("forward", _forward, "CPU")  # so that CPU tensors get _check's message, not the dispatcher's
torch.library.register_fake("fa_course::forward", _forward_fake, lib=_LIB)
forward = torch.ops.fa_course.forward.default

# ---- autograd ---------------------------------------------------------------------------------
# The backward pass is an op of its own, `torch.ops.fa_course.backward`, so that torch.compile
# traces a training graph through it (its fake gives the shapes) and a CUDA graph captures it: dQ,
# dK, dV and the library's workspace are allocated with torch.empty, from PyTorch's caching
# allocator (the graph's private pool during a capture), never by the library.
#
# What the forward keeps for it: q, k, v, O and the LSE. `attention` asks the op for the LSE
# whenever an input requires grad, returned to the caller or not. The op's LSE output carries no
# gradient (marked non-differentiable): the library's backward takes dO alone. An LSE that
# `attention` returns to its caller goes through `returned_lse`, whose backward refuses, so that a
# loss that uses it fails instead of silently losing that part of its gradient (the sinks' too).
LSE_GRADIENT_REFUSED = (
    "fa_course.attention: gradients through the returned LSE are not supported (the library's backward takes "
    "dL/dO only), so this loss would get a wrong gradient for q and k. Use lse.detach() where the LSE needs no "
    "gradient, or compute the LSE-dependent part with an attention that differentiates it.")


def _takes_as_is(t: torch.Tensor) -> bool:
    """Whether every step's backward reads `t` (B, N, H, D) as it is: unit stride along D, along B,
    N and H (where the size is above 1) a positive stride that is a multiple of 8 elements (16-byte
    rows), a 16-byte aligned start. validate_backward's rules, short of the per-step ones."""
    s = t.stride()
    return (s[3] == 1 and t.data_ptr() % 16 == 0 and
            all(n == 1 or (st > 0 and st % 8 == 0) for n, st in zip(t.shape[:3], s[:3])))


def _as_taken(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a dense copy where the backward would refuse its layout: autograd hands dO over in
    whatever layout the loss made it (a zero-stride broadcast from .sum(), a slice), and a K or V
    broadcast over the batch, which the production forwards read, has zero strides."""
    return t if _takes_as_is(t) else t.clone(memory_format=torch.contiguous_format)


_HAS_BACKWARD = {}  # step number -> fa_step_has_backward, asked once


def _backward_step(step: int) -> int:
    """The step whose backward runs: a pinned forward step's own when it has one, else the library's
    choice (FA_STEP_AUTO: the highest-numbered step with a backward that accepts the call)."""
    if step < 0:
        return _capi.STEP_AUTO
    if step not in _HAS_BACKWARD:
        _HAS_BACKWARD[step] = _capi.has_backward(step)
    return step if _HAS_BACKWARD[step] else _capi.STEP_AUTO


def _check_backward(grad_o, q, k, v, o, lse) -> None:
    """What the library cannot see in a direct call of the backward op: O, dO and the LSE must be the
    forward's shapes and dtypes (the library reads them through q's sizes)."""
    _check(q, k, v)
    b, n_q, h_q, _ = q.shape
    for name, t in (("grad_o", grad_o), ("o", o)):
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"fa_course.attention backward: {name} must be {q.dtype} {tuple(q.shape)} on {q.device} "
                             f"(q's), got {t.dtype} {tuple(t.shape)} on {t.device}")
    if lse.shape != (b, h_q, n_q) or lse.dtype != torch.float32 or lse.device != q.device:
        raise ValueError(f"fa_course.attention backward: lse must be float32 {(b, h_q, n_q)} on {q.device} (the "
                         f"forward's, return_lse=True), got {lse.dtype} {tuple(lse.shape)} on {lse.device}")


def _dsinks_like(q, sinks):
    """The sinks' gradient's buffer: (H_q,) fp32, or an empty one without sinks."""
    return torch.empty((q.shape[2],) if sinks is not None else (0,), dtype=torch.float32, device=q.device)


def _run_backward(grad_o, q, k, v, o, lse, causal, bottom_right, softmax_scale, step, deterministic, window=(-1, -1),
                  mods=None):
    """The backward op's body, on q's device: dQ, dK, dV in q's, k's and v's layouts (empty_like,
    as the fake makes them), and the sinks' gradient (empty without sinks), one fa_backward call on
    the current stream."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = _dsinks_like(q, mods[2] if mods is not None else None)
    d_o, q, k, v, o = (_as_taken(t) for t in (grad_o, q, k, v, o))
    lse = lse.contiguous()
    p = _params(q, k, v, o, lse, causal, bottom_right, softmax_scale, window, mods)
    workspace = torch.empty(_capi.backward_workspace_size(p), dtype=torch.uint8, device=q.device)
    b = _capi.make_backward_params(
        p, d_o=d_o.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(), dv=dv.data_ptr(),
        strides=[_strides(d_o), _strides(dq), _strides(dk), _strides(dv)], workspace=workspace.data_ptr(),
        workspace_bytes=workspace.numel(), deterministic=deterministic,
        dsinks=dsinks.data_ptr() if dsinks.numel() else 0)
    _capi.backward(_backward_step(step), b, _stream(q.device.index))
    return dq, dk, dv, dsinks


def _backward_kernel(grad_o, q, k, v, o, lse, causal, bottom_right, softmax_scale, step, deterministic,
                     window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None):
    """dL/dq, dL/dk, dL/dv (and dL/dsinks, empty without sinks) from dL/dO and the forward's O and
    LSE. With H_kv < H_q the library sums dK and dV over the query heads of each group. step: the
    forward's (see _backward_step). window_left, window_right, softcap, alibi_slopes, sinks: the
    forward's."""
    _check_backward(grad_o, q, k, v, o, lse)
    window = (window_left, window_right)
    mods = _check_mods(q, softcap, alibi_slopes, sinks)
    if q.device.index == torch.cuda.current_device():
        return _run_backward(grad_o, q, k, v, o, lse, causal, bottom_right, softmax_scale, step, deterministic, window,
                             mods)
    with torch.cuda.device(q.device):
        return _run_backward(grad_o, q, k, v, o, lse, causal, bottom_right, softmax_scale, step, deterministic, window,
                             mods)


def _backward_fake(grad_o, q, k, v, o, lse, causal, bottom_right, softmax_scale, step, deterministic,
                   window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), _dsinks_like(q, sinks)


_LIB.define("backward(Tensor grad_o, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal, "
            "bool bottom_right, float softmax_scale, int step, bool deterministic, int window_left=-1, "
            "int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None) "
            "-> (Tensor, Tensor, Tensor, Tensor)")
_LIB.impl("backward", _backward_kernel, "CUDA")
_LIB.impl("backward", _backward_kernel, "CPU")
torch.library.register_fake("fa_course::backward", _backward_fake, lib=_LIB)
backward = torch.ops.fa_course.backward.default


def _setup_context(ctx, inputs, output):
    q, k, v, causal, bottom_right, softmax_scale, return_lse, step = inputs[:8]
    deterministic = inputs[8] if len(inputs) > 8 else False
    window = (inputs[9] if len(inputs) > 9 else -1, inputs[10] if len(inputs) > 10 else -1)
    softcap = inputs[11] if len(inputs) > 11 else 0.0
    alibi, sinks = (inputs[12] if len(inputs) > 12 else None), (inputs[13] if len(inputs) > 13 else None)
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse, alibi, sinks)
    ctx.options = (causal, bottom_right, softmax_scale, return_lse, step, deterministic, window, softcap)


def _backward(ctx, grad_o, grad_lse):
    # grad_lse: none can arrive (the LSE output is non-differentiable); see LSE_GRADIENT_REFUSED.
    q, k, v, o, lse, alibi, sinks = ctx.saved_tensors
    causal, bottom_right, softmax_scale, has_lse, step, deterministic, window, softcap = ctx.options
    if not has_lse:
        # The op was called directly with return_lse=False (attention asks for the LSE when a
        # gradient may follow): one more forward, with it.
        o, lse = forward(q, k, v, causal, bottom_right, softmax_scale, True, step, deterministic, window[0], window[1],
                         softcap, alibi, sinks)
    dq, dk, dv, dsinks = backward(grad_o, q, k, v, o, lse, causal, bottom_right, softmax_scale, step, deterministic,
                                  window[0], window[1], softcap, alibi, sinks)
    need = ctx.needs_input_grad
    if len(need) > 12 and need[12]:  # no slope gradient (flash-attn has none): refused, not silently lost
        raise NotImplementedError("fa_course.attention: no gradient for alibi_slopes (the library's backward, like "
                                  "flash-attn's, treats them as constants); detach them")
    # One gradient per argument of the op's schema (14), None for the options.
    grads = [dq if need[0] else None, dk if need[1] else None, dv if need[2] else None] + [None] * 11
    if len(need) > 13 and need[13]:
        grads[13] = dsinks
    return tuple(grads)


torch.library.register_autograd("fa_course::forward", _backward, setup_context=_setup_context, lib=_LIB)


# The LSE as `attention` returns it while a gradient may follow: a copy whose backward refuses. It
# takes q, k and v so that its output requires grad whenever one of them does (the sinks in their
# place when they alone require it). (An op returns no
# view of its input, hence the copy: B·H_q·N_q floats.)
def _returned_lse(lse, q, k, v):
    return lse.clone()


def _returned_lse_fake(lse, q, k, v):
    return torch.empty_like(lse)


def _refuse_lse_gradient(ctx, grad):
    raise NotImplementedError(LSE_GRADIENT_REFUSED)


_LIB.define("returned_lse(Tensor lse, Tensor q, Tensor k, Tensor v) -> Tensor")
_LIB.impl("returned_lse", _returned_lse, "CUDA")
_LIB.impl("returned_lse", _returned_lse, "CPU")
torch.library.register_fake("fa_course::returned_lse", _returned_lse_fake, lib=_LIB)
torch.library.register_autograd("fa_course::returned_lse", _refuse_lse_gradient, lib=_LIB)


def _needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              causal_align: str = "top_left", softmax_scale: Optional[float] = None, return_lse: bool = False,
              step: Optional[int] = None, deterministic: bool = False, window_size=(-1, -1), softcap: float = 0.0,
              alibi_slopes: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None):
    """softmax(scale · q·kᵀ [+ causal mask]) · v for (B, N, H, D) bf16 CUDA tensors, or fp16 ones
    (the production kernels, forward and backward, where the library is built with fp16: FA_DTYPES).

    causal_align: "top_left" (key j visible to query i when j <= i, PyTorch's is_causal) or
    "bottom_right" (j <= i + N_kv − N_q, flash-attn's). softmax_scale: default 1/sqrt(D).
    GQA: H_q a multiple of H_kv. return_lse: also LSE = scale·max + log(sum), fp32 (B, H_q, N_q).
    step: a course step number (fa_course.steps()), or None for the fastest this GPU runs.
    Returns O (B, N_q, H_q, D), or (O, LSE).

    Differentiable in q, k and v (torch.ops.fa_course.backward, the library's fa_backward). With
    step=None the backward is the library's choice; with a pinned step, that step's own backward
    where it has one, else the library's choice. deterministic: the backward gives bitwise-identical
    gradients run to run (a step without that mode refuses with UnsupportedInputError). A gradient
    through the returned LSE raises NotImplementedError (LSE_GRADIENT_REFUSED); under torch.compile
    already when a compiled function returns the LSE of inputs that require grad, so detach it there.

    window_size: flash-attn's sliding window (left, right): query i sees key j only when
    i + offset − left <= j <= i + offset + right (the offset causal_align's); −1 leaves a side
    unbounded; with causal=True both masks apply. Differentiable too (the production kernels'
    backward; a pinned step without a window refuses the call, forward and backward alike).

    The score modifications (the production kernels'; a step without them refuses), applied in this
    order to each scaled score s of query i, key j: softcap (Gemma 2's): s ← softcap·tanh(s / softcap);
    alibi_slopes (H_q,) or (B, H_q) (flash-attn's): s ← s − slope·|i + N_kv − N_q − j|, bottom-right
    whatever causal_align says, no gradient for the slopes (one asked for raises); sinks (H_q,)
    (gpt-oss's, flash-attn's learnable_sink): a logit per head in each row's softmax denominator and
    LSE, adding nothing to O, differentiable (their gradient comes back in their dtype).
    """
    if causal_align not in _ALIGNS:
        raise ValueError(f"fa_course.attention: causal_align must be 'top_left' or 'bottom_right', got {causal_align!r}")
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    # In the C struct the scale is an fp32 and 0 means "1/sqrt(D)": a scale that rounds to 0 would
    # silently become the default. That is the one case only this layer can see.
    if softmax_scale is not None and abs(scale) <= _FP32_ROUNDS_TO_ZERO:
        raise ValueError(f"fa_course.attention: softmax_scale {softmax_scale} rounds to 0 in fp32 (0 asks for the "
                         "default 1/sqrt(D)); the library refuses other non-positive or non-finite scales itself")
    grad = _needs_grad(q, k, v)
    sink_grad = sinks is not None and torch.is_grad_enabled() and sinks.requires_grad
    if (grad or sink_grad) and q.dim() == 4 and q.shape[-1] == 256 and q.is_cuda:
        major, minor = torch.cuda.get_device_capability(q.device)
        if major < 9:
            raise NotImplementedError(f"fa_course.attention: no backward at head dim 256 on this GPU (compute "
                                      f"capability {major}.{minor}; the library's backward at 256 runs on sm_90 GPUs "
                                      "alone); run the forward under torch.no_grad() or with inputs that do not "
                                      "require grad")
    window = _window(window_size, "attention")
    if alibi_slopes is not None and torch.is_grad_enabled() and alibi_slopes.requires_grad:
        raise NotImplementedError("fa_course.attention: no gradient for alibi_slopes (the library's backward, like "
                                  "flash-attn's, treats them as constants); pass alibi_slopes.detach()")
    if softcap or alibi_slopes is not None or sinks is not None:
        # fp32 arrays, as the library reads them: the conversion is differentiable, so the sinks'
        # gradient reaches a bf16 parameter too.
        alibi = alibi_slopes.float().contiguous() if alibi_slopes is not None else None
        sink = sinks.float().contiguous() if sinks is not None else None
        o, lse = forward(q, k, v, bool(causal), _ALIGNS[causal_align], scale, bool(return_lse) or grad or
                         (sink is not None and torch.is_grad_enabled() and sink.requires_grad),
                         -1 if step is None else int(step), bool(deterministic), window[0], window[1], float(softcap),
                         alibi, sink)
    elif window == (-1, -1):
        o, lse = forward(q, k, v, bool(causal), _ALIGNS[causal_align], scale, bool(return_lse) or grad,
                         -1 if step is None else int(step), bool(deterministic))
    else:
        o, lse = forward(q, k, v, bool(causal), _ALIGNS[causal_align], scale, bool(return_lse) or grad,
                         -1 if step is None else int(step), bool(deterministic), window[0], window[1])
    if not return_lse:
        return o
    if grad:
        return o, torch.ops.fa_course.returned_lse.default(lse, q, k, v)
    if sinks is not None and torch.is_grad_enabled() and sinks.requires_grad:  # the sinks' alone
        return o, torch.ops.fa_course.returned_lse.default(lse, sinks, sinks, sinks)
    return o, lse


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


def _unsupported(what: str, fn: str = "flash_attn_func") -> NotImplementedError:
    return NotImplementedError(f"fa_course.{fn}: {what} is not supported yet (the course's later parts "
                               "add it); the call was refused rather than computed without it")


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                    softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, return_lse: bool = False,
                    learnable_sink: Optional[torch.Tensor] = None):
    """flash-attn's `flash_attn_func`, same names, order and layout: q (B, N_q, H_q, D), k and v
    (B, N_kv, H_kv, D), bf16 on a CUDA GPU, or fp16 where the library is built with it (forward and
    backward; elsewhere refused by name before anything runs); GQA by head counts;
    `causal` aligned bottom-right (the last query sees every key), as flash-attn does. The library
    chooses the kernel.

    Options the course does not have yet refuse with NotImplementedError instead of being ignored:
    dropout_p > 0, return_attn_probs. window_size (flash-attn's sliding window, aligned bottom-right
    like causal), softcap, alibi_slopes (fp32 (H_q,) or (B, H_q); constants, as in flash-attn) and
    learnable_sink (flash-attn's name for a per-head sink logit, (H_q,); differentiable) run forward
    and backward (see `attention`).
    Differentiable in q, k and v, as flash-attn's; `deterministic` is the backward's, as there: dQ
    bitwise identical run to run (the library's choice is then a step with that mode; it refuses
    with UnsupportedInputError where none has it). Returns out, or (out, lse) with return_lse=True;
    lse is fp32 (B, H_q, N_q), natural log, and carries no gradient (one through it raises)."""
    if dropout_p:
        raise _unsupported(f"dropout (dropout_p={dropout_p})")
    if return_attn_probs:
        raise _unsupported("return_attn_probs (the probabilities are never stored; return_lse=True gives the LSE)")
    return attention(q, k, v, causal=causal, causal_align="bottom_right", softmax_scale=softmax_scale,
                     return_lse=return_lse, deterministic=deterministic, window_size=window_size, softcap=softcap,
                     alibi_slopes=alibi_slopes, sinks=learnable_sink)


def _window(window_size, fn: str):
    """flash-attn's window_size as (left, right) ints; the library judges the values."""
    window = tuple(int(x) for x in window_size)
    if len(window) != 2:
        raise ValueError(f"fa_course.{fn}: window_size is (left, right), got {window_size!r}")
    return window


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                           softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                           deterministic: bool = False, return_attn_probs: bool = False, block_table=None, *,
                           return_lse: bool = False, check_offsets: bool = True,
                           learnable_sink: Optional[torch.Tensor] = None):
    """flash-attn's `flash_attn_varlen_func`, same names, order and layout: sequences packed end to end,
    q (total_q, H_q, D), k and v (total_k, H_kv, D), bf16 on a CUDA GPU; cu_seqlens_q and cu_seqlens_k
    int32 (B + 1,) offsets on that GPU (sequence b is rows cu_seqlens[b] .. cu_seqlens[b+1] − 1);
    max_seqlen_q, max_seqlen_k the longest lengths. `causal` is aligned bottom-right within each
    sequence. Outside a CUDA graph the offsets are checked first (one copy to the host and one
    synchronisation, about 0.1 ms of a GPU left idle on an H200): starting at 0, ending at the
    tensors' rows, no length negative or past its max_seqlen; a bad one raises ValueError with
    nothing computed. Inside a graph, or with check_offsets=False (a caller whose offsets are right
    by construction, as the transformers integration's from a padding mask), they are the caller's
    to get right, as in flash-attn: the kernel clamps them to the tensors, never reading or writing
    outside them.

    Inference only: the varlen backward is not built yet, so a call that autograd would record (an
    input requiring grad, grad mode on) raises NotImplementedError rather than return an output
    without a gradient. softcap, alibi_slopes (bottom-right to each sequence) and learnable_sink
    (no gradient: a sink that requires one is refused) run on the decode kernel (on an H100/H200 the
    Hopper kernel takes longer packed sequences, but not with these: the library's choice then runs
    the mma.sync kernel's, slower). window_size (flash-attn's (left, right), each sequence's window at
    its own bottom-right diagonal) too: decode-sized calls on the decode kernel, longer ones on the
    mma.sync kernel's (the Hopper kernel's packed prefill has no window). dropout_p > 0,
    return_attn_probs and block_table refuse with NotImplementedError. Returns out (total_q, H_q, D),
    or (out, lse) with return_lse=True: lse fp32 (H_q, total_q), flash-attn's varlen layout."""
    fn = "flash_attn_varlen_func"
    window = _window(window_size, fn)
    for name, given in (("dropout (dropout_p)", bool(dropout_p)),
                        ("return_attn_probs", return_attn_probs),
                        ("a paged KV cache with varlen (block_table)", block_table is not None)):
        if given:
            raise _unsupported(name, fn)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (q, k, v, learnable_sink, alibi_slopes)):
        raise NotImplementedError(f"fa_course.{fn}: the varlen backward is not built yet; call it under "
                                  "torch.no_grad() (inference), or with inputs that need no gradient")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3 or not t.is_cuda or t.dtype not in _DTYPES or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"fa_course.{fn}: {name} must be a 3-D (total, H, D) bfloat16 or float16 CUDA tensor, q, "
                             f"k and v of one dtype on one GPU; got {t.dtype} {tuple(t.shape)} on {t.device} (q "
                             f"{q.dtype} on {q.device})")
    if k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"fa_course.{fn}: k and v must have one shape and q its head dim; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dim() != 1 or cu.dtype != torch.int32 or cu.device != q.device or cu.stride(0) != 1 or len(cu) < 2:
            raise ValueError(f"fa_course.{fn}: {name} must be a contiguous int32 (B + 1,) tensor on {q.device}, "
                             f"got {cu.dtype} {tuple(cu.shape)} on {cu.device}")
    if len(cu_seqlens_q) != len(cu_seqlens_k):
        raise ValueError(f"fa_course.{fn}: cu_seqlens_q and cu_seqlens_k hold different batch sizes "
                         f"({len(cu_seqlens_q) - 1} and {len(cu_seqlens_k) - 1})")
    if check_offsets and not torch.cuda.is_current_stream_capturing():
        # Both offset tensors in one copy to the host (one synchronisation, one small kernel), then
        # judged there: a check per value on the GPU costs a launch and a synchronisation each.
        host = torch.cat((cu_seqlens_q, cu_seqlens_k)).cpu()
        for name, cu, total, longest in (("cu_seqlens_q", host[:len(cu_seqlens_q)], q.shape[0], max_seqlen_q),
                                         ("cu_seqlens_k", host[len(cu_seqlens_q):], k.shape[0], max_seqlen_k)):
            lengths = cu[1:] - cu[:-1]
            if int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()) or \
                    int(lengths.max()) > longest:
                raise ValueError(f"fa_course.{fn}: {name} must run from 0 to the tensor's {total} rows, never "
                                 f"decreasing, no length past {longest}; got {cu.tolist()}")
    b = len(cu_seqlens_q) - 1
    total_q, h_q, d = q.shape
    o = torch.empty((total_q, h_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((h_q, total_q), dtype=torch.float32, device=q.device) if return_lse else None
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    if softmax_scale is not None and abs(scale) <= _FP32_ROUNDS_TO_ZERO:  # 0 would mean 1/sqrt(D) in C
        raise ValueError(f"fa_course.{fn}: softmax_scale {softmax_scale} rounds to 0 in fp32")
    packed = lambda t: [0, t.stride(1), t.stride(0), t.stride(2)]  # (batch, head, row, dim); no batch
    p = _capi.make_params(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
                          lse=lse.data_ptr() if lse is not None else 0, batch=b, heads_q=h_q, heads_kv=k.shape[1],
                          seqlen_q=int(max_seqlen_q), seqlen_kv=int(max_seqlen_k), head_dim=d,
                          strides=[packed(q), packed(k), packed(v), packed(o)], softmax_scale=scale,
                          causal=bool(causal), bottom_right=True, window=window, dtype=_DTYPES[q.dtype])
    mods = _check_mods(q, softcap, alibi_slopes.float().contiguous() if alibi_slopes is not None else None,
                       learnable_sink.detach().float().contiguous() if learnable_sink is not None else None, (b, h_q))
    if mods is not None:
        p.softcap, p.sinks = mods[0], mods[2].data_ptr() if mods[2] is not None else None
        p.alibi_slopes = mods[1].data_ptr() if mods[1] is not None else None
        p.alibi_slopes_stride_batch = _alibi_stride(mods[1])
    p.cu_seqlens_q, p.cu_seqlens_kv = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
    p.total_q, p.total_kv = total_q, k.shape[0]
    workspace = None  # a decode-shaped call's keys are split, its workspace from PyTorch's allocator
    if int(max_seqlen_q) * (h_q // max(k.shape[1], 1)) <= _capi.DECODE_MAX_PACKED_ROWS:
        nbytes = _capi.forward_workspace_size(p)
        if nbytes:
            workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
            p.workspace, p.workspace_bytes = workspace.data_ptr(), nbytes
    with torch.cuda.device(q.device):
        _capi.forward(_capi.STEP_AUTO, p, _stream(q.device.index))
    return (o, lse) if return_lse else o


def _unstack(t: torch.Tensor, count: int, dims: int, fn: str, what: str):
    """flash-attn's packed tensors: `count` tensors stacked on the dim before the heads, views of `t`
    (so the gradients of the pieces reach it through unbind)."""
    if t.dim() != dims or t.shape[-3] != count:
        raise ValueError(f"fa_course.{fn}: {what}, got shape {tuple(t.shape)}")
    return t.unbind(-3)


def flash_attn_qkvpacked_func(qkv: torch.Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                              causal: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                              return_attn_probs: bool = False, *, return_lse: bool = False,
                              learnable_sink: Optional[torch.Tensor] = None):
    """flash-attn's `flash_attn_qkvpacked_func`: qkv (B, N, 3, H, D), q, k and v stacked (one head
    count); flash_attn_func on its three views, whose gradients reach qkv."""
    q, k, v = _unstack(qkv, 3, 5, "flash_attn_qkvpacked_func", "qkv must be (B, N, 3, H, D)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse, learnable_sink=learnable_sink)


def flash_attn_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, dropout_p: float = 0.0,
                             softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                             softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                             deterministic: bool = False, return_attn_probs: bool = False, *, return_lse: bool = False,
                             learnable_sink: Optional[torch.Tensor] = None):
    """flash-attn's `flash_attn_kvpacked_func`: q (B, N_q, H_q, D), kv (B, N_kv, 2, H_kv, D), k and v
    stacked; flash_attn_func on q and kv's two views, whose gradients reach kv."""
    k, v = _unstack(kv, 2, 5, "flash_attn_kvpacked_func", "kv must be (B, N_kv, 2, H_kv, D)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse, learnable_sink=learnable_sink)


def flash_attn_varlen_qkvpacked_func(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                                     dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                     causal: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                                     alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                                     return_attn_probs: bool = False, *, return_lse: bool = False,
                                     learnable_sink: Optional[torch.Tensor] = None):
    """flash-attn's `flash_attn_varlen_qkvpacked_func`: qkv (total, 3, H, D), one cu_seqlens and
    max_seqlen for queries and keys; flash_attn_varlen_func on its three views (inference only, as it)."""
    q, k, v = _unstack(qkv, 3, 4, "flash_attn_varlen_qkvpacked_func", "qkv must be (total, 3, H, D)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                                  return_lse=return_lse, learnable_sink=learnable_sink)


def flash_attn_varlen_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                                    dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                    causal: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                                    alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                                    return_attn_probs: bool = False, *, return_lse: bool = False,
                                    learnable_sink: Optional[torch.Tensor] = None):
    """flash-attn's `flash_attn_varlen_kvpacked_func`: q (total_q, H_q, D), kv (total_k, 2, H_kv, D);
    flash_attn_varlen_func on q and kv's two views (inference only, as it)."""
    k, v = _unstack(kv, 2, 4, "flash_attn_varlen_kvpacked_func", "kv must be (total_k, 2, H_kv, D)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, return_lse=return_lse, learnable_sink=learnable_sink)


def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size=(-1, -1), softcap: float = 0.0, rotary_interleaved: bool = True,
                            alibi_slopes=None, num_splits: int = 0, return_softmax_lse: bool = False, *,
                            check_cache_seqlens: bool = True, learnable_sink: Optional[torch.Tensor] = None):
    """flash-attn's `flash_attn_with_kvcache`, same names, order and layout, for decoding: q (B, N_q,
    H_q, D); k_cache and v_cache (B, capacity, H_kv, D), sequence b's first cache_seqlens[b] rows in
    use (an int: every sequence; None: the whole capacity). With block_table (int32, (B,
    max_blocks_per_sequence)) the caches are paged: k_cache and v_cache are pools (num_blocks,
    page_block_size, H_kv, D), the page size a power of two, and sequence b's key j is row
    j % page_block_size of block block_table[b, j // page_block_size]; the capacity is
    max_blocks_per_sequence · page_block_size. With k and v (B, N_new, H_kv, D) the new
    tokens are written into the caches at rows cache_seqlens[b] .. + N_new (in place, by the same
    library call, before its attention reads them), and attention sees them too; cache_seqlens is
    not changed (the caller advances it, as in flash-attn). `causal` is aligned bottom-right to each sequence's length. Inference
    only (a call autograd would record, an input requiring grad with grad mode on, raises NotImplementedError
    rather than return an output without a gradient), bf16, on the library's decode kernel: at most 64 query rows per KV head
    (N_q·H_q/H_kv), head dim 64 or 128; its split workspace comes from PyTorch's allocator
    (num_splits: 0 lets the library choose). Returns out, or (out, softmax_lse) with
    return_softmax_lse=True (fp32, (B, H_q, N_q)).

    softcap, alibi_slopes (fp32 (H_q,) or (B, H_q); bottom-right to each sequence's length) and
    learnable_sink (a per-head sink logit, (H_q,); added once per row, also with a split) run on the
    decode kernel, as does window_size (flash-attn's (left, right), at each sequence's own diagonal).
    Refused with NotImplementedError: rotary embeddings, cache_batch_idx, cache_leftpad. With k and v, outside a CUDA graph, the lengths (and with a block table the
    new tokens' pages) are checked first, in one copy to the host (one synchronisation): a sequence
    whose new tokens would pass the capacity, or whose table names pages outside the pool for them,
    raises ValueError with nothing written. Inside a graph, or with check_cache_seqlens=False (a
    caller whose lengths are right by construction, as a serving engine's), they are the caller's to
    get right, as in flash-attn: the library writes nothing for such a sequence and clamps its pages
    into the pool, never writing outside the caches."""
    fn = "flash_attn_with_kvcache"
    for name, given in (("rotary embeddings (rotary_cos, rotary_sin)", rotary_cos is not None or rotary_sin is not None),
                        ("cache_batch_idx", cache_batch_idx is not None), ("cache_leftpad", cache_leftpad is not None)):
        if given:
            raise _unsupported(name, fn)
    window = _window(window_size, fn)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (q, k, v, k_cache, v_cache, learnable_sink, alibi_slopes)):
        # flash-attn's returns an output without a gradient here; a training loss would silently lose it.
        raise NotImplementedError(f"fa_course.{fn}: inference only (no backward for a KV cache call); call it "
                                  "under torch.no_grad(), or with inputs that need no gradient")
    paged = block_table is not None
    _check(q, k_cache, v_cache, paged, fn)
    mods = _check_mods(q, softcap, alibi_slopes.float().contiguous() if alibi_slopes is not None else None,
                       learnable_sink.detach().float().contiguous() if learnable_sink is not None else None)
    b, capacity = k_cache.shape[0], k_cache.shape[1]
    if paged:
        if (block_table.dim() != 2 or block_table.dtype != torch.int32 or block_table.device != q.device or
                block_table.shape[0] != q.shape[0] or block_table.stride(1) != 1):
            raise ValueError(f"fa_course.{fn}: block_table must be an int32 (B, max_blocks_per_sequence) tensor on "
                             f"{q.device}, B = {q.shape[0]}, its rows contiguous; got {block_table.dtype} "
                             f"{tuple(block_table.shape)} strides {block_table.stride()} on {block_table.device}")
        page_size = k_cache.shape[1]
        b, capacity = q.shape[0], block_table.shape[1] * page_size
    if (k is None) != (v is None):
        raise ValueError(f"fa_course.{fn}: give both k and v (the new tokens), or neither")
    if cache_seqlens is None:
        seqlens = torch.full((b,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
    else:
        if cache_seqlens.shape != (b,) or cache_seqlens.device != q.device:
            raise ValueError(f"fa_course.{fn}: cache_seqlens must be a ({b},) tensor on {q.device}, got "
                             f"{tuple(cache_seqlens.shape)} on {cache_seqlens.device}")
        seqlens = cache_seqlens.to(torch.int32)
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 4 or t.shape[0] != b or t.shape[2:] != k_cache.shape[2:] or t.dtype != k_cache.dtype \
                    or t.device != q.device:
                raise ValueError(f"fa_course.{fn}: {name} must be (B, N_new, H_kv, D) = ({b}, N_new, "
                                 f"{k_cache.shape[2]}, {k_cache.shape[3]}) in {k_cache.dtype} on {q.device}, got "
                                 f"{tuple(t.shape)} {t.dtype} on {t.device}")
        n_new = k.shape[1]
        if check_cache_seqlens and not torch.cuda.is_current_stream_capturing():
            # The lengths, and the new keys' pages (block_table[b, j // page_size]), in one copy to
            # the host: one synchronisation, where a check per condition on the GPU costs one each.
            parts = [seqlens.long()]
            if paged:
                rows = (parts[0][:, None] + torch.arange(n_new, device=q.device)).clamp(0, capacity - 1)
                parts.append(block_table.long().gather(1, rows // page_size).flatten())
            host = torch.cat(parts).cpu()
            lens = host[:b]
            if bool((lens < 0).any()) or bool((lens + n_new > capacity).any()):
                raise ValueError(f"fa_course.{fn}: appending {n_new} tokens needs 0 <= cache_seqlens and "
                                 f"cache_seqlens + {n_new} <= the caches' capacity ({capacity}); got "
                                 f"{lens.tolist()}; nothing was written")
            if paged and bool(((host[b:] < 0) | (host[b:] >= k_cache.shape[0])).any()):
                raise ValueError(f"fa_course.{fn}: block_table names pages outside the pool's "
                                 f"{k_cache.shape[0]} for the new tokens; nothing was written")
    seqlens = seqlens.contiguous()
    b_, n_q, h_q, d = q.shape
    o = torch.empty((b_, n_q, h_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b_, h_q, n_q), dtype=torch.float32, device=q.device) if return_softmax_lse else None
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    if softmax_scale is not None and abs(scale) <= _FP32_ROUNDS_TO_ZERO:  # 0 would mean 1/sqrt(D) in C
        raise ValueError(f"fa_course.{fn}: softmax_scale {softmax_scale} rounds to 0 in fp32")
    p = _params(q, k_cache, v_cache, o, lse, bool(causal), True, scale, window, mods)
    p.seqlens_kv = seqlens.data_ptr()
    if paged:  # K and V strides are a page's (_strides: between pages, heads, a page's rows)
        p.seqlen_kv, p.block_table, p.block_table_stride = capacity, block_table.data_ptr(), block_table.stride(0)
        p.page_size, p.num_pages = page_size, k_cache.shape[0]
    if k is not None:  # the append, by the library in the same call (new_strides: batch, head, row, dim)
        p.k_new, p.v_new, p.seqlen_new = k.data_ptr(), v.data_ptr(), n_new
        for i, t in enumerate((k, v)):
            p.new_strides[i][0], p.new_strides[i][1] = t.stride(0), t.stride(2)
            p.new_strides[i][2], p.new_strides[i][3] = t.stride(1), t.stride(3)
    p.num_splits = int(num_splits)
    workspace = None
    nbytes = _capi.forward_workspace_size(p)
    if nbytes and num_splits != 1:
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
        p.workspace, p.workspace_bytes = workspace.data_ptr(), nbytes
    with torch.cuda.device(q.device):  # a refused call (validated before anything runs) writes nothing
        _capi.forward(_capi.STEP_AUTO, p, _stream(q.device.index))
    return (o, lse) if return_softmax_lse else o
