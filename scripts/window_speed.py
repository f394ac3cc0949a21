#!/usr/bin/env python3
"""A sliding window's forward speed through the package: flash_attn_func with window_size=(W, 0),
causal, at growing N, beside the same call without the window, in one run.

    FA_COURSE_LIB=build/libfa2_capi.so PYTHONPATH=python python3 scripts/window_speed.py \
        [--window 1024] [--ns 4096,16384,65536] [--d 128] [--tokens 65536] [--csv out.csv]

B·N is held at --tokens (B = tokens / N, at least 1) and H·D at 2048, as the course's benchmarks do.
FLOPs count the visible (query, key) pairs only: 4·B·H·D per pair. Reports TFLOP/s and the time per
query token, which a window makes flat in N (each row sees at most W + 1 keys) where full causal
attention grows with N. Medians of --iters CUDA-event timings after --warmup calls; the output is
checked against the fp64 reference on the smallest N first.
"""
import argparse
import csv
import statistics
import sys

import torch

import fa_course
from fa_course.reference import attention_fp64


def visible_pairs(n_q, n_kv, left, right, causal):
    offset = n_kv - n_q  # bottom-right, flash-attn's
    total = 0
    for i in range(n_q):
        j1 = n_kv if not causal else min(n_kv, i + offset + 1)
        if right >= 0:
            j1 = min(j1, max(i + offset + right + 1, 0))
        j0 = 0 if left < 0 else min(max(i + offset - left, 0), n_kv)
        total += max(j1 - j0, 0)
    return total


def time_call(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--ns", default="4096,16384,65536")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--csv")
    a = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    checked = False
    print(f"{torch.cuda.get_device_name()}, bf16, D = {a.d}, causal, window ({a.window}, 0), B·N = {a.tokens}, "
          f"H·D = 2048; step {fa_course.pick_step(*(torch.empty(1, 64, 2048 // a.d, a.d, device='cuda', dtype=torch.bfloat16) for _ in range(3)), causal=True)}")
    print(f"{'N':>7} {'B':>3} {'H':>3} | {'window ms':>10} {'TFLOP/s':>8} {'ns/token':>9} | {'causal ms':>10} "
          f"{'TFLOP/s':>8} {'ns/token':>9}")
    for n in (int(x) for x in a.ns.split(",")):
        b, h = max(1, a.tokens // n), 2048 // a.d
        q, k, v = (torch.randn(b, n, h, a.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        if not checked:  # the window's output against the fp64 reference, once
            o = fa_course.flash_attn_func(q[:1], k[:1], v[:1], causal=True, window_size=(a.window, 0))
            ref, _ = attention_fp64(q[:1], k[:1], v[:1], causal=True, causal_align="bottom_right",
                                    window_size=(a.window, 0))
            err = (o.double() - ref).abs().max().item()
            if err > 0.02:
                sys.exit(f"window output differs from the fp64 reference by {err}")
            checked = True
        res = {}
        for name, window in (("window", (a.window, 0)), ("causal", (-1, -1))):
            ms = time_call(lambda: fa_course.flash_attn_func(q, k, v, causal=True, window_size=window), a.warmup,
                           a.iters)
            flops = 4.0 * b * h * a.d * visible_pairs(n, n, window[0], window[1], True)
            res[name] = (ms, flops / ms / 1e9, ms * 1e6 / (b * n))
        w, c = res["window"], res["causal"]
        print(f"{n:>7} {b:>3} {h:>3} | {w[0]:>10.3f} {w[1]:>8.1f} {w[2]:>9.2f} | {c[0]:>10.3f} {c[1]:>8.1f} {c[2]:>9.2f}")
        rows.append({"N": n, "B": b, "H": h, "D": a.d, "window": a.window, "window_ms": round(w[0], 4),
                     "window_tflops": round(w[1], 1), "window_ns_per_token": round(w[2], 3),
                     "causal_ms": round(c[0], 4), "causal_tflops": round(c[1], 1),
                     "causal_ns_per_token": round(c[2], 3), "gpu": torch.cuda.get_device_name()})
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)


if __name__ == "__main__":
    main()
