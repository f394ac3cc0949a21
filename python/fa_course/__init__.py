"""The FlashAttention course's kernels from Python.

    import fa_course
    o = fa_course.attention(q, k, v, causal=True)          # (B, N, H, D) bf16 CUDA tensors
    o = fa_course.flash_attn_func(q, k, v, causal=True)    # flash-attn's names (causal bottom-right)
    o.backward(do)                                         # gradients: q.grad, k.grad, v.grad
    o, lse = fa_course.attention(q, k, v, return_lse=True)
    fa_course.steps()                                      # every step, with its lesson
    fa_course.pick_step(q, k, v, causal=True)              # the step attention(step=None) runs

`attention` needs PyTorch; `steps()` and the C interface layer (`fa_course._capi`) do not.
"""
from __future__ import annotations

from ._capi import AttentionError, InvalidCallError, Step, UnsupportedInputError

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("fa-course")
except PackageNotFoundError:  # run from the source tree, not installed
    __version__ = "0+source"

__all__ = ["attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "pick_step", "describe", "steps", "Step", "AttentionError", "InvalidCallError", "UnsupportedInputError"]


def steps() -> list:
    """Every step of the course, in order: number, name, one-line lesson, causal and LSE support."""
    from . import _capi

    return _capi.steps()


try:
    import torch  # noqa: F401
except ImportError:  # the torch-free layer still works
    def attention(*args, **kwargs):
        raise ImportError("fa_course.attention needs PyTorch (pip install torch)")

    pick_step = describe = flash_attn_func = flash_attn_varlen_func = flash_attn_with_kvcache = attention
    flash_attn_qkvpacked_func = flash_attn_kvpacked_func = attention
    flash_attn_varlen_qkvpacked_func = flash_attn_varlen_kvpacked_func = attention
else:
    from .ops import (attention, describe, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                      flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
                      flash_attn_with_kvcache, pick_step)
