"""Attention in fp64 with PyTorch, on any device: the ground truth the package's tests compare with.

Same conventions as fa_course.attention: (B, N, H, D) tensors, GQA by head counts, causal with
top-left (key j visible to query i when j <= i) or bottom-right (j <= i + N_kv − N_q) alignment,
LSE (B, H_q, N_q) in natural-log units, −inf (and O = 0) for a row that sees no key.
"""
import math
from typing import Optional, Tuple

import torch


def attention_fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   causal_align: str = "top_left", softmax_scale: Optional[float] = None, window_size=(-1, -1)
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))  # (B, H, N, D)
    group = qd.shape[1] // kd.shape[1]
    kd, vd = kd.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    s = scale * qd @ kd.transpose(-1, -2)
    left, right = window_size
    if causal or left >= 0 or right >= 0:
        n_q, n_kv = s.shape[-2], s.shape[-1]
        offset = n_kv - n_q if causal_align == "bottom_right" else 0
        i = torch.arange(n_q, device=s.device)[:, None]
        j = torch.arange(n_kv, device=s.device)[None, :]
        if causal:
            s = s.masked_fill(j > i + offset, float("-inf"))
        if left >= 0:  # a sliding window (flash-attn's window_size), the causal mask's offset
            s = s.masked_fill(j < i + offset - left, float("-inf"))
        if right >= 0:
            s = s.masked_fill(j > i + offset + right, float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
    l = p.sum(-1, keepdim=True)
    o = (p / torch.where(l == 0, torch.ones_like(l), l)) @ vd
    return o.transpose(1, 2), (m + torch.log(l)).squeeze(-1)


def attend_fp64(q, k, v, mask, softmax_scale):
    """attention_fp64 in the form fa_course.context_parallel calls a local kernel: mask None,
    "top_left" or "bottom_right"; returns (O, LSE)."""
    return attention_fp64(q, k, v, causal=mask is not None, causal_align=mask or "top_left",
                          softmax_scale=softmax_scale)
