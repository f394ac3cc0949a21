#!/usr/bin/env python3
"""Context-parallel attention, measured. Two modes:

    python3 context_parallel/bench.py --simulate 2 [--seqlen 131072]    # one GPU: the causal idle fraction
    torchrun --nproc_per_node=2 context_parallel/bench.py [--seqlen 131072]    # P GPUs over NCCL

--simulate P times every (rank, ring step) of P simulated ranks one after the other on one GPU,
for the contiguous and the zigzag layout, and reports the idle fraction of a synchronous ring:
1 − Σ work / (P · Σ_steps max_rank work). It also times the whole sequence on one GPU, the
baseline of the scaling efficiency.

Under torchrun: tokens/s of ring_attention per layout, with the K/V transfer overlapped and not,
against one GPU on the whole sequence (timed on rank 0 alone), and PyTorch's own
context_parallel (SDPA inside torch.distributed.tensor.experimental.context_parallel) where it runs.
Default shape: B=1, H=16 (H_kv=16), D=128, causal. Medians of --iters runs; prints one table.
"""
import argparse
import os
import statistics
import sys
import time

import torch

try:  # the installed package, else this checkout's (with FA_COURSE_LIB naming a built library)
    import fa_course  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import fa_course  # noqa: E402,F811
from fa_course import context_parallel as cp  # noqa: E402
from fa_course import cp_plan  # noqa: E402


def cuda_ms(fn, iters, warmup=2, sync=None):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        (sync or torch.cuda.synchronize)()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        (sync or torch.cuda.synchronize)()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def flops(a):
    pairs = a.n * (a.n + 1) // 2 if a.causal else a.n * a.n
    return 4 * a.b * a.h * a.d * pairs


def inputs(a, device="cuda"):
    g = torch.Generator(device=device).manual_seed(0)
    return [torch.randn(a.b, a.n, h, a.d, device=device, dtype=torch.bfloat16, generator=g) for h in (a.h, a.h_kv,
                                                                                                       a.h_kv)]


def simulate(a):
    q, k, v = inputs(a)
    one = cuda_ms(lambda: fa_course.attention(q, k, v, causal=a.causal), a.iters)
    print(f"B={a.b} H={a.h} H_kv={a.h_kv} N={a.n} D={a.d} causal={a.causal}; one GPU, whole sequence: {one:.2f} ms, "
          f"{flops(a) / one / 1e9:.0f} TFLOP/s, {a.b * a.n / one * 1e3:.3g} tokens/s (step "
          f"{fa_course.pick_step(q, k, v, causal=a.causal)})")
    for kind in cp_plan.LAYOUTS:
        times = {}

        def timer(rank, step, fn):
            times[rank, step] = cuda_ms(fn, a.iters, warmup=1)

        cp.simulate(q, k, v, a.simulate, kind=kind, causal=a.causal, timer=timer)
        P = a.simulate
        busiest = sum(max(times[r, t] for r in range(P)) for t in range(P))
        total = sum(times.values())
        per_step = " | ".join("step {}: {}".format(t, " ".join(f"{times[r, t]:.1f}" for r in range(P)))
                              for t in range(P))
        print(f"  {kind:<10} P={P}: ms per (rank) at each ring step: {per_step}")
        print(f"  {kind:<10} P={P}: idle fraction {1 - total / (P * busiest):.1%}; a synchronous ring's time "
              f"{busiest:.2f} ms (work {total / P:.2f} ms a rank on average); ideal speed-up {one / busiest:.2f}× of "
              f"{P} (merges included)")


def distributed(a):
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = inputs(a)
    barrier = lambda: (torch.cuda.synchronize(), dist.barrier())
    rows = []
    if rank == 0:
        one = cuda_ms(lambda: fa_course.attention(q, k, v, causal=a.causal), a.iters)
        rows.append(("one GPU, whole sequence (fa_course.attention)", one))
    dist.barrier()
    for kind in cp_plan.LAYOUTS:
        local = [cp.shard(t, world, rank, kind) for t in (q, k, v)]
        for overlap in (True, False):
            ms = cuda_ms(lambda: cp.ring_attention(*local, seqlen_q=a.n, seqlen_kv=a.n, kind=kind, causal=a.causal,
                                                   overlap=overlap), a.iters, sync=barrier)
            rows.append((f"ring_attention {kind}, transfer {'overlapped' if overlap else 'waited for'}", ms))
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        mesh = init_device_mesh("cuda", (world,))
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # (B, H, N, D): SDPA's layout
        with context_parallel(mesh, buffers=(qt, kt, vt), buffer_seq_dims=(2, 2, 2)):
            ms = cuda_ms(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=a.causal,
                                                                                enable_gqa=a.h != a.h_kv),
                         a.iters, sync=barrier)
        rows.append(("PyTorch context_parallel (SDPA ring)", ms))
    except Exception as e:  # not in this PyTorch, or not for this shape
        rows.append((f"PyTorch context_parallel: unavailable: {type(e).__name__}: {str(e).splitlines()[0][:100]}",
                     float("nan")))
    if rank == 0:
        one = rows[0][1]
        print(f"{world} GPUs, B={a.b} H={a.h} H_kv={a.h_kv} N={a.n} D={a.d} causal={a.causal}, medians of {a.iters}")
        print("| run | ms | tokens/s | TFLOP/s (all GPUs) | scaling efficiency vs one GPU |\n|---|---|---|---|---|")
        for name, ms in rows:
            eff = one / (ms * world) if ms == ms else float("nan")
            print(f"| {name} | {ms:.2f} | {a.b * a.n / ms * 1e3:.4g} | {flops(a) / ms / 1e9:.0f} | {eff:.1%} |")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulate", type=int, default=0, help="P simulated ranks on one GPU (no torchrun)")
    ap.add_argument("--seqlen", dest="n", type=int, default=131072)
    ap.add_argument("--b", type=int, default=1)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--h-kv", type=int, default=None)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--no-causal", dest="causal", action="store_false")
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    a.h_kv = a.h_kv or a.h
    t0 = time.time()
    simulate(a) if a.simulate else distributed(a)
    print(f"({time.time() - t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
