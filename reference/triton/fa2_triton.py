"""FlashAttention-2 forward in Triton: the seed kernel, as a reference to measure the course against.

This is the kernel the course's first seed builds step by step, kept here so that
`scripts/compare.py` can time it next to the CUDA steps and PyTorch's SDPA on the same tensors.
It is deliberately the plain FA2 algorithm, nothing more:

  grid        (cdiv(N_q, BLOCK_M), B * H): one program per (Q tile, batch, head)
  load Q      once per program, kept in registers for the whole KV loop
  state       m_i (running max), l_i (running sum), o_i (unnormalised output), all fp32
  KV loop     S = Q K^T on tensor cores (fp32 accumulate), online-softmax update, P cast to the
              input dtype for P V (tensor cores again), O accumulated in fp32
  normalise   once, after the loop (the FA2 "deferred divide"), and LSE = m + log(l) stored
  causal      the loop stops at the diagonal; only the tiles that straddle it are masked
  autotune    a few (BLOCK_M, BLOCK_N, warps, stages) configs, keyed by shape and causal

Two implementation choices worth knowing when reading it:
  * The softmax runs in base 2: S is multiplied by scale * log2(e) in fp32 right after the dot,
    and exp2 replaces exp (the hardware instruction is exp2). The scale is applied to the fp32
    product, not folded into a bf16 copy of Q, so it costs no precision.
  * KV tiles are split into two loops: the ones entirely visible (no mask at all) and the few
    that touch the causal diagonal or the end of the sequence (masked). The inner loop of the
    first part has no compare/select instructions.

Usage (needs a CUDA GPU, PyTorch and Triton):

    from fa2_triton import fa2_forward
    o, lse = fa2_forward(q, k, v, causal=True)   # q: (B, H, N_q, D), k/v: (B, H_kv, N_kv, D)

Run this file directly to check it against PyTorch SDPA on a few shapes:

    python3 reference/triton/fa2_triton.py
"""

import math

import torch
import triton
import triton.language as tl

LOG2_E = 1.4426950408889634  # 1 / ln(2): exp(x) == exp2(x * LOG2_E)
LN_2 = tl.constexpr(0.6931471805599453)  # a kernel may only read globals that are constexpr


def _configs():
    # The seed's four configurations plus two deeper pipelines for Hopper. BLOCK_N = 128 at
    # HEAD_DIM = 128 holds a 128x128 fp32 S tile per program; autotuning decides whether the
    # register pressure is worth it rather than a rule written here.
    shapes = [
        (64, 64, 4, 3),
        (128, 64, 4, 3),
        (128, 128, 8, 3),
        (64, 128, 8, 3),
        (128, 64, 8, 4),
        (64, 64, 4, 4),
    ]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in shapes
    ]


@triton.jit
def _attend_kv_tiles(
    o_i, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_vn,
    offs_m, offs_n, offs_d,
    lo, hi, N_KV, qk_scale,
    CAUSAL_MASK: tl.constexpr,  # mask keys after the query (only tiles on the diagonal)
    BOUND_MASK: tl.constexpr,   # mask keys at or past N_KV (only the last, partial tile)
    BLOCK_N: tl.constexpr,
):
    """The KV loop over key columns [lo, hi): the online-softmax recurrence, tile by tile."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n                                          # (BLOCK_N,) key index
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :]
        if BOUND_MASK:
            k_tile = tl.load(k_ptrs, mask=cols[:, None] < N_KV, other=0.0)  # (BLOCK_N, HEAD_DIM)
        else:
            k_tile = tl.load(k_ptrs)

        # Scores in the log2 domain: fp32 product, scaled in fp32.
        s = tl.dot(q, tl.trans(k_tile)) * qk_scale                     # (BLOCK_M, BLOCK_N) fp32
        if CAUSAL_MASK:
            # -inf, never 0: exp2(0 - m) would be a real weight. `>=` keeps the diagonal.
            s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
        if BOUND_MASK:
            s = tl.where(cols[None, :] < N_KV, s, float("-inf"))

        # The recurrence, in this order: new max, rescale factor for the old state, weights of
        # this tile, then update l and O, and only then overwrite m.
        m_new = tl.maximum(m_i, tl.max(s, 1))                          # (BLOCK_M,)
        alpha = tl.math.exp2(m_i - m_new)                              # (BLOCK_M,)
        p = tl.math.exp2(s - m_new[:, None])                           # (BLOCK_M, BLOCK_N) fp32
        l_i = l_i * alpha + tl.sum(p, 1)

        if BOUND_MASK:
            v_tile = tl.load(v_ptrs, mask=cols[:, None] < N_KV, other=0.0)  # (BLOCK_N, HEAD_DIM)
        else:
            v_tile = tl.load(v_ptrs)
        o_i = o_i * alpha[:, None]
        # P in the input dtype so P V runs on tensor cores; the sum stays fp32 in o_i.
        o_i = tl.dot(p.to(v_tile.dtype), v_tile, o_i)                 # (BLOCK_M, HEAD_DIM) fp32
        m_i = m_new
    return o_i, l_i, m_i


@triton.autotune(configs=_configs(), key=["N_Q", "N_KV", "HEAD_DIM", "IS_CAUSAL"])
@triton.jit
def _fa2_fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    H, GROUP, N_Q, N_KV,
    qk_scale,                      # softmax scale * log2(e)
    IS_CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # ---- which tile this program owns ---------------------------------------------------------
    pid_m = tl.program_id(0)       # Q tile
    pid_bh = tl.program_id(1)      # (batch, head)
    off_b = pid_bh // H
    off_h = pid_bh % H
    off_hkv = off_h // GROUP       # grouped-query attention: GROUP query heads share a KV head

    # ---- pointers (64-bit batch/head offsets: large tensors exceed 2^31 elements) -------------
    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    o_base = O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)   # (BLOCK_M,) query rows of this tile
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q

    # ---- load Q once ---------------------------------------------------------------------------
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    # ---- init state (fp32, whatever the input dtype) ------------------------------------------
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    o_i = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # ---- KV loop -------------------------------------------------------------------------------
    # [0, mid): whole tiles every query of this tile sees -- no mask.
    # [mid, hi): tiles on the causal diagonal and/or the last partial tile -- masked.
    full_end = (N_KV // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        # Top-left alignment (PyTorch is_causal): query i sees keys j <= i, so the loop ends
        # at the last query row of this tile.
        hi = tl.minimum((pid_m + 1) * BLOCK_M, N_KV)
        mid = tl.minimum((pid_m * BLOCK_M // BLOCK_N) * BLOCK_N, full_end)
    else:
        hi = N_KV
        mid = full_end
    o_i, l_i, m_i = _attend_kv_tiles(o_i, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                     offs_m, offs_n, offs_d, 0, mid, N_KV, qk_scale,
                                     False, False, BLOCK_N)
    o_i, l_i, m_i = _attend_kv_tiles(o_i, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                     offs_m, offs_n, offs_d, mid, hi, N_KV, qk_scale,
                                     IS_CAUSAL, True, BLOCK_N)

    # ---- normalise once, LSE, store ------------------------------------------------------------
    # A row with no visible key (impossible with top-left causal and N_q <= N_kv, kept safe
    # anyway) has l = 0: output 0, LSE -inf, never 0/0.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o_i = o_i / l_safe[:, None]
    lse = tl.where(l_i > 0.0, (m_i + tl.math.log2(l_safe)) * LN_2, float("-inf"))  # natural log
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], o_i.to(O.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=row_ok)


def fa2_forward(q, k, v, causal=False, softmax_scale=None):
    """O, LSE of softmax(scale * Q K^T [causal]) V.

    q: (B, H, N_q, D); k, v: (B, H_kv, N_kv, D) with H_kv dividing H; bf16 or fp16 on a CUDA
    device, unit stride along D. Causal uses PyTorch's top-left alignment (key j visible to
    query i when j <= i). Returns o like q and lse as fp32 (B, H, N_q), natural log.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-D (B, H, N, D)")
    B, H, N_Q, D = q.shape
    Bk, H_KV, N_KV, Dk = k.shape
    if (Bk, Dk) != (B, D) or tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if H % H_KV != 0:
        raise ValueError(f"H ({H}) must be a multiple of H_kv ({H_KV})")
    if D not in (16, 32, 64, 128, 256):
        # tl.arange needs a power of two; pad D (or route to SDPA) for other head dims.
        raise ValueError(f"head dim {D} is not supported; use 16, 32, 64, 128 or 256")
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError("q, k, v must all be bf16 or all fp16")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("q, k, v need unit stride along the head dim")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)

    o = torch.empty_like(q)
    lse = torch.empty((B, H, N_Q), dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(N_Q, meta["BLOCK_M"]), B * H)  # noqa: E731
    _fa2_fwd_kernel[grid](
        q, k, v, o, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        H, H // H_KV, N_Q, N_KV,
        scale * LOG2_E,
        IS_CAUSAL=bool(causal),
        HEAD_DIM=D,
    )
    return o, lse


def best_config(n_q, n_kv, head_dim, causal):
    """The autotuned config for a key, as a short string ("" before the first call)."""
    for key, cfg in getattr(_fa2_fwd_kernel, "cache", {}).items():
        if tuple(key[:4]) == (n_q, n_kv, head_dim, bool(causal)):
            kw = cfg.kwargs
            return f"BLOCK_M={kw['BLOCK_M']} BLOCK_N={kw['BLOCK_N']} warps={cfg.num_warps} stages={cfg.num_stages}"
    return ""


def _self_check():
    """Compare against PyTorch SDPA (and LSE against an fp32 logsumexp) on awkward shapes."""
    torch.manual_seed(0)
    shapes = [  # (B, H, H_kv, N_q, N_kv, D)
        (2, 16, 16, 4096, 4096, 64),  # the seed's shape
        (1, 8, 8, 1000, 1000, 128),   # N not a multiple of any tile
        (2, 4, 4, 17, 300, 64),       # N_q != N_kv, fewer queries than a tile
        (1, 8, 2, 512, 512, 64),      # grouped-query attention
    ]
    ok = True
    for B, H, H_KV, N_Q, N_KV, D in shapes:
        for causal in (False, True):
            if causal and N_Q > N_KV:
                continue
            q = torch.randn(B, H, N_Q, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, H_KV, N_KV, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(B, H_KV, N_KV, D, device="cuda", dtype=torch.bfloat16)
            o, lse = fa2_forward(q, k, v, causal=causal)
            kf = k.float().repeat_interleave(H // H_KV, dim=1)
            vf = v.float().repeat_interleave(H // H_KV, dim=1)
            s = q.float() @ kf.transpose(-1, -2) / math.sqrt(D)
            if causal:
                mask = torch.ones(N_Q, N_KV, device="cuda", dtype=torch.bool).tril()
                s = s.masked_fill(~mask, float("-inf"))
            ref = torch.softmax(s, -1) @ vf
            ref_lse = torch.logsumexp(s, -1)
            err = (o.float() - ref).abs().max().item()
            lse_err = (lse - ref_lse).abs().max().item()
            good = torch.allclose(o.float(), ref, atol=1e-2, rtol=1e-2) and lse_err < 1e-3 * (1 + ref_lse.abs().max().item())
            ok &= good
            print(f"B={B} H={H} H_kv={H_KV} N_q={N_Q} N_kv={N_KV} D={D} causal={causal}: "
                  f"max|O err|={err:.2e} max|LSE err|={lse_err:.2e} {'ok' if good else 'MISMATCH'} "
                  f"[{best_config(N_Q, N_KV, D, causal)}]")
    return ok


if __name__ == "__main__":
    raise SystemExit(0 if _self_check() else 1)
