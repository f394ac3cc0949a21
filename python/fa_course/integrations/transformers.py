"""fa_course as an attention implementation of Hugging Face transformers.

    import fa_course.integrations.transformers as fa_hf
    name = fa_hf.register()                                # "fa_course"
    model = AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16, attn_implementation=name)
    # or, on a loaded model: model.set_attn_implementation(name)

What it serves: bf16 attention at the head dims the course builds (64, 128; with FA_HEAD_DIMS=all
also 32, 96, 192, 256, training too, at 256 on sm_90 GPUs), grouped-query heads,
prefill (causal; with fewer queries than keys, as after a KV cache, the mask is aligned bottom-right,
flash-attn's convention), decoding (one query against the cache) and non-causal (encoder-style)
attention; sliding-window layers (Mistral, Qwen2, Gemma-style: a token sees itself and the W − 1
before it, transformers' sliding_window = W), logit softcapping (Gemma 2's `softcap`) and attention
sinks (gpt-oss's `s_aux`, a logit per head that trains), in inference and training. A padded batch
(sequences of different lengths, left or right padded, as `generate` makes them) runs without its
padding in inference: each sequence's tokens are gathered into a packed batch for
fa_course.flash_attn_varlen_func (with the layer's window, softcap and sinks) and scattered back,
the padded rows' outputs zero. What it refuses, with a ValueError or fa_course.UnsupportedInputError
that says why, instead of computing something else: a padding mask in training (the varlen backward
is not built yet), packed sequences, a chunked mask, any other mask a model overlays, dropout,
another dtype or head dim (float16 runs where the library is built with it, FA_DTYPES: inference,
padded batches and training alike).

Training: query, key and value get their gradients from the course's backward (fa_course.attention
is differentiable), so a model trains with it as with 'sdpa'. Attention dropout is refused, as
above: train with the config's attention_dropout = 0.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import ops

NAME = "fa_course"


def _refuse(what: str) -> ValueError:
    return ValueError(f"fa_course attention ({NAME}) does not support {what}; use attn_implementation='sdpa' "
                      "for this model or input")


# Keyword arguments a model may pass that change what attention computes. Passed with a value other
# than these, they are refused: computing without them would give another model's output.
_NEUTRAL = {"cu_seq_lens_q": (None,), "cu_seq_lens_k": (None,), "head_mask": (None,)}


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, **kwargs):
    """The attention function transformers calls: query (B, H_q, N_q, D), key and value
    (B, H_kv, N_kv, D); returns ((B, N_q, H_q, D), None) like transformers' own implementations."""
    if dropout:
        raise _refuse(f"attention dropout ({dropout}); call model.eval(), or set the config's attention_dropout to 0")
    for name, neutral in _NEUTRAL.items():
        if kwargs.get(name) is not None and kwargs[name] not in neutral:
            raise _refuse(f"{name}={kwargs[name]!r}")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    position_ids = kwargs.get("position_ids")
    if (attention_mask is None and position_ids is not None and query.shape[0] == 1 and query.shape[2] > 1
            and not torch.compiler.is_compiling() and _packed(position_ids)):
        raise _refuse("packed sequences (position_ids that restart within the row: several documents in one "
                      "row, as padding-free training passes them); attending across them would mix documents")
    # Score modifications: Gemma 2's logit softcapping (softcap), gpt-oss's sinks (s_aux; a learnable
    # logit per head, trained through the course's backward).
    softcap = kwargs.get("softcap") or 0.0
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    window = (-1, -1)
    sliding = kwargs.get("sliding_window")
    if sliding is not None:
        # transformers' sliding window: key j visible to query i when i − W < j <= i (its
        # sliding_window_overlay on the causal mask), flash-attn's window_size (W − 1, 0).
        if not causal:
            raise _refuse(f"a bidirectional sliding window (sliding_window={sliding!r} without the causal mask)")
        window = (int(sliding) - 1, -1)
    if attention_mask is not None:
        # The mask function registered with this one returns None unless the batch has padding.
        return _without_padding(query, key, value, attention_mask, bool(causal), scaling, window, float(softcap),
                                sinks), None
    if softcap or sinks is not None:
        out = ops.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=bool(causal),
                            causal_align="bottom_right", softmax_scale=scaling, window_size=window,
                            softcap=float(softcap), sinks=sinks)
        return out, None
    out = ops.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=bool(causal),
                        causal_align="bottom_right", softmax_scale=scaling, window_size=window)
    return out, None


def _packed(position_ids: torch.Tensor) -> bool:
    """Whether one row's positions restart (packed documents): transformers' mask builder looks for
    them only without a cache, and a model with use_cache on builds one in training too. One
    synchronisation, on prefill calls of batch 1 only (not checked inside torch.compile)."""
    pos = position_ids.reshape(-1)
    return bool((pos[1:] - pos[:-1] != 1).any())


def _without_padding(query, key, value, mask, causal, scaling, window=(-1, -1), softcap=0.0, sinks=None):
    """Attention over a padded batch, each sequence on its own tokens: the (B, N_kv) mask's kept keys
    and, for the queries, its last N_q columns (the new tokens), gathered into packed sequences for the
    varlen call and scattered back; padded query rows are zero. The layer's window, softcap and sinks
    go with them (each sequence's window at its own diagonal). Inference only: the varlen backward is
    not built, so a call autograd would record is refused."""
    if mask.dim() != 2 or mask.shape[0] != query.shape[0] or mask.shape[1] != key.shape[2]:
        raise _refuse(f"an attention mask of shape {tuple(mask.shape)} (a (B, N_kv) padding mask is served)")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        raise _refuse("a padding mask (sequences of different lengths in one batch) while autograd records "
                      "(training, or a forward outside torch.no_grad()): the varlen backward is not built yet; "
                      "run inference under torch.no_grad(), or train with 'sdpa'")
    b, h_q, n_q, d = query.shape
    h_kv, n_kv = key.shape[1], key.shape[2]
    keep_k = mask.bool()
    # Which queries are tokens: with as many queries as keys, the mask's own; one query (decoding, or
    # a cross-attention step) is always one; new tokens after a cache are the mask's last N_q. Other
    # shapes (cross-attention over a padded memory with several queries, more queries than keys) have
    # no query mask here to go by.
    if n_q == n_kv:
        keep_q = keep_k
    elif n_q == 1:
        keep_q = torch.ones(b, 1, dtype=torch.bool, device=keep_k.device)
    elif causal and n_q < n_kv:
        keep_q = keep_k[:, -n_q:]
    else:
        raise _refuse(f"a padding mask on a call of {n_q} queries and {n_kv} keys (cross-attention over a padded "
                      "memory): its queries' padding is not known here")
    rows_q, rows_k = keep_q.flatten().nonzero().squeeze(1), keep_k.flatten().nonzero().squeeze(1)
    len_q, len_k = keep_q.sum(1, dtype=torch.int32), keep_k.sum(1, dtype=torch.int32)

    def cu(lengths):  # B + 1 offsets
        return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))

    def packed(t, n, h, rows):  # (B, H, N, D) → the kept rows of (B·N, H, D)
        return t.transpose(1, 2).reshape(b * n, h, d)[rows]

    q, k, v = packed(query, n_q, h_q, rows_q), packed(key, n_kv, h_kv, rows_k), packed(value, n_kv, h_kv, rows_k)
    out = torch.zeros(b * n_q, h_q, d, dtype=query.dtype, device=query.device)
    if len(rows_q) and len(rows_k):
        # The offsets are the mask's own cumulative sums: right by construction, so not checked again
        # (the check is a synchronisation a call).
        out[rows_q] = ops.flash_attn_varlen_func(q, k, v, cu(len_q), cu(len_k), int(len_q.max()), int(len_k.max()),
                                                 softmax_scale=scaling, causal=causal, window_size=window,
                                                 softcap=softcap, learnable_sink=sinks, check_offsets=False)
    return out.view(b, n_q, h_q, d)


# transformers' mask primitives this integration honours (each model composes its mask from them;
# anything composed is another function), and its FlashAttention mask builder: None for an unpadded
# batch, else the 2-D padding mask. Looked up once, by register(): an import inside the mask
# builder would stop torch.compile's trace of the model.
_HONOURED: tuple = ()
_FLASH_MASK = None


def _is_sliding_window_causal(fn) -> bool:
    """Whether `fn` is transformers' sliding-window causal mask, and_masks(sliding_window_overlay(W),
    causal_mask_function): a closure over exactly those two functions. Its W reaches attention_forward
    as the layer's sliding_window argument."""
    causal = _HONOURED[0] if _HONOURED else None  # causal_mask_function (register())
    parts = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
    fns = [f for p in parts for f in (p if isinstance(p, tuple) else (p,)) if callable(f)]
    return (len(fns) == 2 and any(f is causal for f in fns)
            and any(getattr(f, "__qualname__", "").startswith("sliding_window_overlay.") for f in fns))


def mask_function(*args, **kwargs):
    """The attention-mask builder registered beside `attention_forward`. A plain causal or
    bidirectional mask is served by the kernel's own causal flag (None), a sliding-window causal mask
    by its window (the layer passes its size to `attention_forward`); a mask that hides other keys
    (chunks, packed sequences, a model's overlay) is refused here, since it never reaches the kernel
    as a tensor; padding goes on as a 2-D mask (`attention_forward` serves it without a window)."""
    fn = kwargs.get("mask_function")
    if fn is not None and not any(fn is h for h in _HONOURED) and not _is_sliding_window_causal(fn):
        raise _refuse(f"this model's attention mask ({getattr(fn, '__name__', fn)}: chunked attention, packed "
                      "sequences or another overlay on the causal mask)")
    return _FLASH_MASK(*args, **kwargs)


def register(name: str = NAME) -> str:
    """Registers fa_course with transformers' AttentionInterface (and its mask builder with
    AttentionMaskInterface) under `name`, for `attn_implementation=name`. Returns the name."""
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
    except ImportError as e:  # transformers < 4.54 has no mask interface: masks could not be checked
        raise ImportError("fa_course.integrations.transformers needs transformers >= 4.54 (AttentionInterface and "
                          "AttentionMaskInterface)") from e
    global _HONOURED, _FLASH_MASK
    from transformers import masking_utils as mu

    _HONOURED = tuple(getattr(mu, f) for f in ("causal_mask_function", "bidirectional_mask_function") if hasattr(mu, f))
    _FLASH_MASK = mu.flash_attention_mask
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_function)
    return name
