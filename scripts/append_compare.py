#!/usr/bin/env python3
"""The decode step's append, in the library call against PyTorch indexing before it (step 32).

One decode step of flash_attn_with_kvcache, GQA 32/8, D = 128, one new token per sequence after
a cache of --length keys (capacity --length + 64), B in --batches, timed two ways each:

  in-call   fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens): the
            library writes k and v at each length and attends (step 32's append kernel), after the
            package's check of the lengths (one copy to the host, one synchronisation);
  unchecked the same with check_cache_seqlens=False (no synchronisation: a serving engine's call);
  torch     the package's former path: the capacity check (two synchronisations), the rows' index
            computation and two scatters in PyTorch, then the call on cache_seqlens + 1 without k, v.

  host loop: --iters calls back to back, then one synchronisation: µs per call as a model's decode
            loop sees it (bound by the host at small batch);
  graph:    --iters calls captured in one CUDA graph and replayed: the GPU's µs per call alone
            (each replay appends the same rows again: the append is idempotent).

Both are checked against each other once (the same output, the same caches, bit for bit). Medians
of --repeats. Writes docs/results/<name>_<GPU>.md."""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

import torch

import fa_course


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="docs/results")
    ap.add_argument("--name", default="kv_append")
    args = ap.parse_args()
    dev = torch.device("cuda")
    h_q, h_kv, d, cap = 32, 8, 128, args.length + 64
    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        g = torch.Generator(device=dev).manual_seed(b)
        rnd = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16, generator=g)  # noqa: E731
        k_cache, v_cache = rnd(b, cap, h_kv, d), rnd(b, cap, h_kv, d)
        q, k, v = rnd(b, 1, h_q, d), rnd(b, 1, h_kv, d), rnd(b, 1, h_kv, d)
        seqlens = torch.full((b,), args.length, dtype=torch.int32, device=dev)
        grown = seqlens + 1
        batch_idx = torch.arange(b, device=dev)[:, None]

        def in_call():
            return fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens)

        def unchecked():
            return fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                                     check_cache_seqlens=False)

        def torch_append():
            if not torch.cuda.is_current_stream_capturing():
                if bool((seqlens < 0).any()) or bool((seqlens.long() + 1 > cap).any()):
                    raise ValueError("does not fit")
            at = seqlens.long()[:, None] + torch.arange(1, device=dev)
            idx = batch_idx.expand_as(at)
            k_cache[idx, at] = k
            v_cache[idx, at] = v
            return fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=grown)

        with torch.no_grad():
            kc0, vc0 = k_cache.clone(), v_cache.clone()
            o1 = in_call()
            kc1, vc1 = k_cache.clone(), v_cache.clone()
            k_cache.copy_(kc0), v_cache.copy_(vc0)
            o2 = torch_append()
            torch.cuda.synchronize()
            same = torch.equal(o1, o2) and torch.equal(kc1, k_cache) and torch.equal(vc1, v_cache)
            if not same:
                sys.exit(f"B = {b}: the in-call append and PyTorch's differ")
            res = {}
            for label, fn in (("in-call", in_call), ("unchecked", unchecked), ("torch", torch_append)):
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
                host = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        fn()
                    torch.cuda.synchronize()
                    host.append((time.perf_counter() - t0) / args.iters * 1e6)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(args.iters):
                        fn()
                graph.replay()
                torch.cuda.synchronize()
                gpu = []
                for _ in range(args.repeats):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    graph.replay()
                    end.record()
                    torch.cuda.synchronize()
                    gpu.append(start.elapsed_time(end) / args.iters * 1e3)
                res[label] = (statistics.median(host), statistics.median(gpu))
                del graph
        rows.append((b, res))
        print(f"B = {b}: " + "; ".join(f"{k} host {h:.1f} us, graph {g_:.1f} us" for k, (h, g_) in res.items()),
              flush=True)
    gpu_name = torch.cuda.get_device_name().replace(" ", "_")
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# The decode step's append on the {torch.cuda.get_device_name()}: in the call or in PyTorch", "",
             f"Commit `{commit}`, {when}; torch {torch.__version__}. flash_attn_with_kvcache, GQA {h_q}/{h_kv}, "
             f"D = {d}, one new token per sequence after {args.length} cached keys. µs per call, medians of "
             f"{args.repeats} runs of {args.iters} calls: **host loop**, the calls back to back and one "
             "synchronisation (what a model's decode loop sees); **graph**, the same calls replayed from one "
             "CUDA graph (the GPU alone). The two paths give the same output and caches bit for bit.", "",
             f"Command: `python3 scripts/append_compare.py --batches {args.batches} --length {args.length} "
             f"--commit {commit}`", "",
             "| B | host loop: in-call | unchecked | torch | torch ÷ in-call | graph: in-call | torch | torch ÷ in-call |",
             "|---|---|---|---|---|---|---|---|"]
    for b, r in rows:
        (ih, ig), (uh, _), (th, tg) = r["in-call"], r["unchecked"], r["torch"]
        lines.append(f"| {b} | {ih:.1f} | {uh:.1f} | {th:.1f} | {th / ih:.2f} | {ig:.1f} | {tg:.1f} | {tg / ig:.2f} |")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.name}_{gpu_name}.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("wrote", path)


if __name__ == "__main__":
    main()
