"""Context-parallel forward attention: each of P ranks holds a slice of the sequence, K/V slices
travel around a ring, and every rank merges the partial results of the slices that visit it with
their log-sum-exps, in fp32.

    from fa_course import context_parallel as cp
    q_l, k_l, v_l = (cp.shard(t, world, rank, "zigzag") for t in (q, k, v))      # this rank's rows
    o_l, lse_l = cp.ring_attention(q_l, k_l, v_l, seqlen_q=N, seqlen_kv=N, causal=True)
    o = cp.unshard([...every rank's o_l...], "zigzag")                           # if you need it whole

`ring_attention` runs under torch.distributed (NCCL for CUDA tensors); `simulate` runs the same
per-rank code for P ranks in one process, which is how the merge is tested against the fp64
reference without a second GPU. The bookkeeping (who holds which rows, which kernel calls a step
makes) is fa_course.cp_plan, which needs no PyTorch.

Tensors are (B, N, H, D) like fa_course.attention; GQA by head counts; both causal alignments,
and N_q ≠ N_kv. LSE is (B, H_q, N) in natural-log units, as the op returns it.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import torch

from . import cp_plan

# attend(q, k, v, mask, softmax_scale) -> (O (B, n, H, D), LSE fp32 (B, H, n)); mask None,
# "top_left" or "bottom_right". The default is the course's fastest kernel through the package.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Optional[str], float], Tuple[torch.Tensor, torch.Tensor]]


def kernel_attend(q, k, v, mask, softmax_scale):
    from .ops import attention

    return attention(q, k, v, causal=mask is not None, causal_align=mask or "top_left", softmax_scale=softmax_scale,
                     return_lse=True)


def shard(t: torch.Tensor, world: int, rank: int, kind: str) -> torch.Tensor:
    """Rank `rank`'s rows (dim 1) of a whole (B, N, H, D) tensor, in the layout's local order."""
    chunks = cp_plan.layout(t.shape[1], world, kind)[rank]
    return torch.cat([t[:, s:s + n] for s, n in chunks], dim=1).contiguous()


def unshard(parts: Sequence[torch.Tensor], kind: str, dim: int = 1) -> torch.Tensor:
    """The whole tensor from every rank's local one (rows along `dim`: 1 for O, 2 for LSE)."""
    n = sum(p.shape[dim] for p in parts)
    lay = cp_plan.layout(n, len(parts), kind)
    pieces = []
    for rank, part in enumerate(parts):
        at = 0
        for start, length in lay[rank]:
            pieces.append((start, part.narrow(dim, at, length)))
            at += length
    return torch.cat([p for _, p in sorted(pieces, key=lambda x: x[0])], dim=dim)


class Accumulator:
    """One rank's running result: O and LSE in fp32 over its local query rows.

    Merging a partial (O_p, LSE_p) of the same rows, computed over other keys:
        LSE' = log(exp(LSE) + exp(LSE_p)),  O' = O·exp(LSE − LSE') + O_p·exp(LSE_p − LSE')
    which is step 07's identity: each partial O is normalised by its own sum, exp(LSE) is that
    sum (times exp of the max), so the weights are the shares of the total sum. A row no key has
    reached yet has LSE = −inf and O = 0, and stays so through merges with other such partials.
    """

    def __init__(self, b: int, n: int, h: int, d: int, device):
        self.o = torch.zeros((b, n, h, d), dtype=torch.float32, device=device)
        self.lse = torch.full((b, h, n), -math.inf, dtype=torch.float32, device=device)

    def merge(self, rows: slice, o_p: torch.Tensor, lse_p: torch.Tensor) -> None:
        old, lse_p = self.lse[:, :, rows], lse_p.float()
        new = torch.logaddexp(old, lse_p)
        seen = torch.isfinite(new)
        w_old = torch.where(seen, torch.exp(old - new), torch.zeros_like(new))
        w_new = torch.where(seen, torch.exp(lse_p - new), torch.zeros_like(new))
        as_o = lambda w: w.transpose(1, 2).unsqueeze(-1)  # (B, H, n) -> (B, n, H, 1)
        self.o[:, rows] = self.o[:, rows] * as_o(w_old) + o_p.float() * as_o(w_new)
        self.lse[:, :, rows] = new

    def result(self, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.o.to(dtype), self.lse


def local_step(acc: Accumulator, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, calls: Sequence[cp_plan.Call],
               softmax_scale: float, attend: Attend) -> None:
    """This rank's work for one visiting K/V slice: the plan's kernel calls, each merged into acc."""
    for c in calls:
        o_p, lse_p = attend(q[:, c.q0:c.q1], k[:, c.k0:c.k1], v[:, c.k0:c.k1], c.mask, softmax_scale)
        acc.merge(slice(c.q0, c.q1), o_p, lse_p)


def _setup(head_dim: int, seqlen_q: int, seqlen_kv: int, world: int, kind: str, causal_align: str,
           softmax_scale: Optional[float]):
    """What every rank works out alike: the scale, the global causal offset, both layouts."""
    if causal_align not in ("top_left", "bottom_right"):
        raise ValueError(f"context parallel: causal_align must be 'top_left' or 'bottom_right', got {causal_align!r}")
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    offset = seqlen_kv - seqlen_q if causal_align == "bottom_right" else 0
    return scale, offset, cp_plan.layout(seqlen_q, world, kind), cp_plan.layout(seqlen_kv, world, kind)


def simulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world: int, *, kind: str = "zigzag",
             causal: bool = False, causal_align: str = "top_left", softmax_scale: Optional[float] = None,
             attend: Attend = kernel_attend, timer: Optional[Callable] = None):
    """`world` ranks in one process on whole tensors: shard, run every rank's ring steps in turn,
    unshard. Returns (O, LSE) of the whole sequence. timer(rank, step, fn), if given, runs fn and
    may time it (the idle-fraction measurement); a timer that runs fn more than once merges the
    same partial again, and the result is then meaningless (the benchmark only times it)."""
    scale, offset, q_lay, kv_lay = _setup(q.shape[-1], q.shape[1], k.shape[1], world, kind, causal_align, softmax_scale)
    ks, vs = [shard(k, world, r, kind) for r in range(world)], [shard(v, world, r, kind) for r in range(world)]
    outs, lses = [], []
    for r in range(world):
        q_l = shard(q, world, r, kind)
        acc = Accumulator(q.shape[0], q_l.shape[1], q.shape[2], q.shape[3], q.device)
        for t in range(world):
            src = (r - t) % world  # the ring: at step t, rank r holds the K/V slice of rank r − t
            calls = cp_plan.plan_step(q_lay[r], kv_lay[src], causal, offset)
            run = lambda: local_step(acc, q_l, ks[src], vs[src], calls, scale, attend)
            timer(r, t, run) if timer is not None else run()
        o_l, lse_l = acc.result(q.dtype)
        outs.append(o_l)
        lses.append(lse_l)
    return unshard(outs, kind, 1), unshard(lses, kind, 2)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, seqlen_q: int, seqlen_kv: int,
                   kind: str = "zigzag", causal: bool = False, causal_align: str = "top_left",
                   softmax_scale: Optional[float] = None, group=None, attend: Attend = kernel_attend,
                   overlap: bool = True):
    """This rank's (O, LSE) under torch.distributed: q, k, v are its local rows (`shard`) of
    sequences of seqlen_q and seqlen_kv rows. K and V travel to the next rank while this one
    computes on the slice it holds (batch_isend_irecv; NCCL runs it on its own stream, so the copy
    overlaps the kernel). overlap=False waits for each transfer before computing: the measurement
    of how much of the communication the overlap hides."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    scale, offset, q_lay, kv_lay = _setup(q.shape[-1], seqlen_q, seqlen_kv, world, kind, causal_align, softmax_scale)
    # Every rank must pass the same B, H_q, H_kv, D and dtype (only the rows differ): the message
    # sizes are worked out from this rank's own tensors, and a rank that disagrees hangs the ring.
    if q.shape[1] != sum(n for _, n in q_lay[rank]) or k.shape[1] != sum(n for _, n in kv_lay[rank]):
        raise ValueError(f"context parallel: rank {rank} holds {q.shape[1]} query and {k.shape[1]} key rows; the "
                         f"{kind} layout gives it {sum(n for _, n in q_lay[rank])} and "
                         f"{sum(n for _, n in kv_lay[rank])}")
    acc = Accumulator(q.shape[0], q.shape[1], q.shape[2], q.shape[3], q.device)
    kv = torch.stack([k, v]).contiguous()  # one message per step
    # P2POp takes global ranks; the ring's neighbours are neighbours within the group.
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    nxt_rank, prv_rank = peer((rank + 1) % world), peer((rank - 1) % world)
    for t in range(world):
        src = (rank - t) % world
        pending = []
        if t + 1 < world:
            incoming = kv.new_empty((2, kv.shape[1], sum(n for _, n in kv_lay[(src - 1) % world])) + kv.shape[3:])
            ops = [dist.P2POp(dist.isend, kv, nxt_rank, group), dist.P2POp(dist.irecv, incoming, prv_rank, group)]
            pending = dist.batch_isend_irecv(ops)
            if not overlap:
                for req in pending:
                    req.wait()
        calls = cp_plan.plan_step(q_lay[rank], kv_lay[src], causal, offset)
        local_step(acc, q, kv[0], kv[1], calls, scale, attend)
        for req in pending:
            req.wait()  # for NCCL: the current stream waits for the transfer, the CPU does not
        if pending:
            kv = incoming
    return acc.result(q.dtype)
