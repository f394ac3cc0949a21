"""Context parallelism's bookkeeping, without PyTorch: which rank holds which rows of the sequence,
and which kernel calls one rank makes for the K/V slice visiting it.

A rank holds its query rows and its K/V rows as a few *chunks* of the global sequence, laid end to
end in its local tensors. With the causal mask, the global rule is: key j is visible to query i when
j <= i + offset (offset 0 for top-left alignment, N_kv − N_q for bottom-right). For one (local Q,
visiting K/V) pair, `plan_step` turns that rule into calls of the kernel, each on a rectangle of
local rows and columns with no mask, or with the kernel's own top-left or bottom-right mask, such
that every visible (query, key) pair is computed exactly once and no hidden one ever is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

Chunk = Tuple[int, int]  # (global start, length)
LAYOUTS = ("contiguous", "zigzag")


def layout(n: int, world: int, kind: str) -> List[List[Chunk]]:
    """Each rank's chunks of a sequence of n rows, in the order they sit in its local tensor.

    contiguous: rank r holds the r-th of `world` near-equal slices.
    zigzag: the sequence is cut into 2·world near-equal slices; rank r holds slice r and slice
    2·world − 1 − r, so that under a causal mask every rank gets one early and one late slice.
    """
    if kind not in LAYOUTS:
        raise ValueError(f"context parallel: layout must be one of {LAYOUTS}, got {kind!r}")
    if world < 1 or n < (world if kind == "contiguous" else 2 * world):
        raise ValueError(f"context parallel: {n} rows cannot be split over {world} ranks ({kind} layout)")
    parts = world if kind == "contiguous" else 2 * world
    bounds = [n * p // parts for p in range(parts + 1)]
    cut = [(bounds[p], bounds[p + 1] - bounds[p]) for p in range(parts)]
    if kind == "contiguous":
        return [[cut[r]] for r in range(world)]
    return [[cut[r], cut[parts - 1 - r]] for r in range(world)]


@dataclass(frozen=True)
class Call:
    """One kernel call: local query rows [q0, q1) against local key rows [k0, k1), with no mask
    (mask None) or the kernel's causal mask aligned "top_left" or "bottom_right"."""

    q0: int
    q1: int
    k0: int
    k1: int
    mask: Optional[str]

    def visible(self, i: int, j: int) -> bool:
        """Whether this call computes the pair (local query i, local key j)."""
        if not (self.q0 <= i < self.q1 and self.k0 <= j < self.k1):
            return False
        if self.mask is None:
            return True
        shift = 0 if self.mask == "top_left" else (self.k1 - self.k0) - (self.q1 - self.q0)
        return j - self.k0 <= i - self.q0 + shift


def _local(chunks: Sequence[Chunk]) -> List[Tuple[int, int, int]]:
    """(global start, length, local start) of each chunk."""
    out, at = [], 0
    for start, length in chunks:
        out.append((start, length, at))
        at += length
    return out


def _pair_calls(q: Tuple[int, int, int], k: Tuple[int, int, int], offset: int) -> List[Call]:
    """The calls for one query chunk against one key chunk under the causal rule j <= i + offset.

    In global rows: queries [qa, qb) that see no key of [ka, kb) come first (i + offset < ka), then
    those that see a prefix of it, then those that see all of it (i + offset >= kb − 1). The middle
    part, with the first row that sees everything, is exactly the kernel's bottom-right mask on
    the keys [ka, s + offset): for query i it keeps keys up to i + offset. The rest needs no mask.
    """
    (qa, qn, ql), (ka, kn, kl) = q, k
    qb, kb = qa + qn, ka + kn
    clamp = lambda x, lo, hi: max(lo, min(hi, x))
    r0 = clamp(ka - offset, qa, qb)  # rows before r0 see no key of this chunk
    s = clamp(kb - offset, r0, qb)   # rows from s on see all of it
    calls = []
    if s > r0:
        calls.append(Call(ql + r0 - qa, ql + s - qa, kl, kl + s + offset - ka, "bottom_right"))
    if qb > s:
        calls.append(Call(ql + s - qa, ql + qn, kl, kl + kn, None))
    return calls


def _relation(q: Tuple[int, int, int], k: Tuple[int, int, int], shift: int) -> str:
    """'all', 'none' or 'some': which (i, j) of the chunk pair satisfy j <= i + shift (any rows)."""
    (qa, qn, _), (ka, kn, _) = q, k
    if ka + kn - 1 <= qa + shift:
        return "all"
    if ka > qa + qn - 1 + shift:
        return "none"
    return "some"


def _fuse(calls: List[Call]) -> List[Call]:
    """Unmasked calls on the same keys with adjacent rows (or the same rows and adjacent keys)
    become one: fewer, larger launches."""
    calls = list(calls)
    merged = True
    while merged:
        merged = False
        for a in range(len(calls)):
            for b in range(len(calls)):
                x, y = calls[a], calls[b]
                if a == b or x.mask is not None or y.mask is not None:
                    continue
                if (x.k0, x.k1) == (y.k0, y.k1) and x.q1 == y.q0:
                    joined = Call(x.q0, y.q1, x.k0, x.k1, None)
                elif (x.q0, x.q1) == (y.q0, y.q1) and x.k1 == y.k0:
                    joined = Call(x.q0, x.q1, x.k0, y.k1, None)
                else:
                    continue
                calls = [c for i, c in enumerate(calls) if i not in (a, b)] + [joined]
                merged = True
                break
            if merged:
                break
    return sorted(calls, key=lambda c: (c.q0, c.k0))


def plan_step(q_chunks: Sequence[Chunk], kv_chunks: Sequence[Chunk], causal: bool, offset: int = 0) -> List[Call]:
    """The kernel calls for this rank's queries against one visiting K/V slice.

    offset: the global causal offset (0 top-left, N_kv − N_q bottom-right). When the global rule
    agrees with the kernel's own mask on the whole local block (the zigzag layout's diagonal step
    does), the plan is one causal call; else one or two calls per chunk pair, fused where possible.
    """
    qs, ks = _local(q_chunks), _local(kv_chunks)
    nq, nk = sum(c[1] for c in qs), sum(c[1] for c in ks)
    if not causal:
        return [Call(0, nq, 0, nk, None)]
    pairs = [(q, k) for q in qs for k in ks]
    glob = [_relation(q, k, offset) for q, k in pairs]
    if all(g == "none" for g in glob):
        return []
    if all(g == "all" for g in glob):
        return [Call(0, nq, 0, nk, None)]
    for mask, shift in (("top_left", 0), ("bottom_right", nk - nq)):
        # The pair's rule in local rows: j' <= i' + (offset + (qa − ql) − (ka − kl)); the kernel's is
        # j' <= i' + shift. They agree on the pair when the offsets match, or when both keep all of
        # it, or both none.
        def agrees(q, k, g):
            d = offset + (q[0] - q[2]) - (k[0] - k[2])
            loc = (q[2], q[1], q[2]), (k[2], k[1], k[2])
            return d == shift or g == _relation(*loc, shift) != "some"
        if all(agrees(q, k, g) for (q, k), g in zip(pairs, glob)):
            return [Call(0, nq, 0, nk, mask)]
    return _fuse([c for q, k in pairs for c in _pair_calls(q, k, offset)])


def work(calls: Sequence[Call]) -> int:
    """(query, key) pairs the calls compute: the step's share of the FLOPs."""
    total = 0
    for c in calls:
        n, m = c.q1 - c.q0, c.k1 - c.k0
        if c.mask is None:
            total += n * m
        else:
            shift = 0 if c.mask == "top_left" else m - n
            total += sum(max(0, min(m, i + shift + 1)) for i in range(n))
    return total
