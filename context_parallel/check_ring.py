#!/usr/bin/env python3
"""The ring over real processes, checked against one process's answer. Run with torchrun:

    torchrun --nproc_per_node=2 context_parallel/check_ring.py                  # NCCL, one GPU a rank
    torchrun --nproc_per_node=2 context_parallel/check_ring.py --backend gloo   # CPU, fp64 attention
    torchrun --nproc_per_node=4 context_parallel/check_ring.py --backend gloo --subgroup   # ranks 1-3 only

Every rank makes the same whole inputs (one seed), keeps its rows, runs ring_attention, and
compares its rows of O and LSE with the whole sequence computed in one process: by the course's
kernel on one GPU for NCCL (the single-GPU result), by the fp64 reference for gloo.
Exit 0 when every rank agrees on every case, 1 otherwise; each rank prints its worst error.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

try:  # the installed package, else this checkout's (with FA_COURSE_LIB naming a built library)
    import fa_course  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from fa_course import context_parallel as cp  # noqa: E402
from fa_course.reference import attend_fp64  # noqa: E402

# (B, N_q, N_kv, H_q, H_kv, D, causal, align): ragged lengths, GQA, both alignments, N_q != N_kv.
CASES = [(1, 1000, 1000, 4, 2, 128, True, "top_left"), (2, 777, 777, 4, 4, 64, False, "top_left"),
         (1, 600, 1531, 8, 2, 64, True, "bottom_right"), (1, 2048, 2048, 2, 1, 128, True, "bottom_right")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--subgroup", action="store_true",
                    help="run the ring on ranks 1.. only, a process group of its own (rank 0 waits)")
    a = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
    gpu = a.backend == "nccl"
    rank = int(os.environ["RANK"])
    if gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(a.backend)
    device = "cuda" if gpu else "cpu"
    # The ring's own ranks: all of them, or (--subgroup) ranks 1.. as a group whose ranks differ
    # from the global ones. Every process takes part in new_group, members or not.
    members = list(range(1 if a.subgroup else 0, dist.get_world_size()))
    group = dist.new_group(members) if a.subgroup else None
    world = len(members)
    attend = cp.kernel_attend if gpu else attend_fp64
    dtype, atol = (torch.bfloat16, 1e-2) if gpu else (torch.float64, 1e-6)
    failed = 0
    me = members.index(rank) if rank in members else -1
    for ci, (b, n_q, n_kv, h_q, h_kv, d, causal, align) in enumerate(CASES if me >= 0 else []):
        for kind in ("zigzag", "contiguous"):
            g = torch.Generator(device="cpu").manual_seed(100 + ci)
            q, k, v = (torch.randn(b, n, h, d, generator=g).to(device, dtype)
                       for n, h in ((n_q, h_q), (n_kv, h_kv), (n_kv, h_kv)))
            whole_o, whole_lse = attend(q, k, v, align if causal else None, d ** -0.5)
            o, lse = cp.ring_attention(*(cp.shard(t, world, me, kind) for t in (q, k, v)), seqlen_q=n_q,
                                       seqlen_kv=n_kv, kind=kind, causal=causal, causal_align=align, attend=attend,
                                       group=group)
            want_o = cp.shard(whole_o, world, me, kind).double()
            want_lse = cp.shard(whole_lse.transpose(1, 2), world, me, kind).transpose(1, 2).double()
            diff = (o.double() - want_o).abs()
            err, outside = diff.max().item(), int((diff > atol + atol * want_o.abs()).sum())
            seen = torch.isfinite(want_lse)
            lse_err = (lse.double()[seen] - want_lse[seen]).abs().max().item() if seen.any() else 0.0
            ok = outside == 0 and lse_err <= 1e-3 and torch.equal(torch.isfinite(lse), seen)
            failed += not ok
            print(f"rank {me}/{world} (global {rank}) {a.backend} case {ci} {kind}: max|O err| {err:.2e}, "
                  f"max|LSE err| {lse_err:.2e} {'ok' if ok else 'FAILED'}", flush=True)
    bad = torch.tensor([failed], device=device)
    dist.all_reduce(bad)
    dist.destroy_process_group()
    if rank == 0:
        print(f"check_ring: {'FAILED on ' + str(int(bad.item())) + ' rank-cases' if bad.item() else 'all ranks agree'}")
    sys.exit(1 if bad.item() else 0)


if __name__ == "__main__":
    main()
