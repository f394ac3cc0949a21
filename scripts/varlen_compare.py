#!/usr/bin/env python3
"""Packed prefill (flash_attn_varlen_func) against the alternatives, in one run on one GPU.

A batch of sequences of different lengths, GQA 32/8, D = 128, causal, run four ways, each checked
once against an fp32 reference and then timed (scripts/compare.py's timer: L2 flushed, median):

  varlen      fa_course.flash_attn_varlen_func on the packed batch (the library's choice: on Hopper
              kernel 101's packed instantiations; elsewhere the production decode kernel, which
              reads the offsets);
  varlen-unchecked  the same call with check_offsets=False (outside a graph the library first
              checks the offsets, one synchronisation a call), as the transformers integration;
  varlen-graph  the same call captured once in a CUDA graph and replayed: the kernel alone;
  per-seq     fa_course.flash_attn_func once per sequence (the library's choice, kernel 101 on
              Hopper), the time summed: what a caller without varlen does;
  padded      fa_course.flash_attn_func on the batch padded to the longest, bottom-right per row...
              of the padded length: the work a padded batch pays for (not the same answer for the
              short sequences, so timed only);
  sdpa-flash  PyTorch SDPA's flash backend on the padded batch (timed only, as padded).

TFLOP/s count the real work, Σ over sequences of 4·L_q·L_k·H_q·D, halved for causal (L_q = L_k).
Writes docs/results/<name>_<GPU>.md with the table and the run's facts."""
import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402

BATCHES = {
    "mixed": [512, 1024, 2048, 4096, 256, 3000, 128, 1900],
    "equal": [2048] * 8,
    "one-long": [8192, 64, 64, 64, 64, 64, 64, 64],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default=os.path.join(compare.ROOT, "docs", "results"))
    ap.add_argument("--name", default="varlen")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import fa_course

    timer = compare.Torch(dict(warmup=3, iters=args.iters, repeats=args.repeats), None)
    h, hkv, d = args.h, args.hkv, args.d
    rows = []
    for name, lengths in BATCHES.items():
        g = torch.Generator(device="cuda").manual_seed(31)
        total = sum(lengths)
        q = torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device="cuda")
        spans = list(zip(cu[:-1].tolist(), lengths))
        flops = sum(4 * n * n * h * d / 2 for n in lengths)
        with torch.no_grad():
            varlen = lambda: fa_course.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
            per_seq = lambda: [fa_course.flash_attn_func(q[None, a:a + n], k[None, a:a + n], v[None, a:a + n],
                                                         causal=True) for a, n in spans]
            out = varlen()
            worst = 0.0
            for a, n in spans:  # fp32 reference, one sequence at a time
                qq = q[a:a + n].float().transpose(0, 1)
                kk, vv = (t[a:a + n].float().repeat_interleave(h // hkv, 1).transpose(0, 1) for t in (k, v))
                ref = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).transpose(0, 1)
                worst = max(worst, (out[a:a + n].float() - ref).abs().max().item())
            padded_len = max(lengths)
            pq = torch.zeros(len(lengths), padded_len, h, d, device="cuda", dtype=torch.bfloat16)
            pk = torch.zeros(len(lengths), padded_len, hkv, d, device="cuda", dtype=torch.bfloat16)
            pv = torch.zeros_like(pk)
            for i, (a, n) in enumerate(spans):
                pq[i, :n], pk[i, :n], pv[i, :n] = q[a:a + n], k[a:a + n], v[a:a + n]
            padded = lambda: fa_course.flash_attn_func(pq, pk, pv, causal=True)
            tq, tk, tv = (t.transpose(1, 2) for t in (pq, pk, pv))

            def sdpa():
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                    return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)

            # The same call replayed from a CUDA graph, as a serving engine runs it: no offset check
            # (the library checks them outside a graph, one synchronisation), no host work.
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                varlen()  # warm-up on a side stream before capture, as PyTorch asks
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                varlen()
            unchecked = lambda: fa_course.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                                                                 causal=True, check_offsets=False)
            for label, fn in (("varlen", varlen), ("varlen-unchecked", unchecked), ("varlen-graph", graph.replay),
                              ("per-seq", per_seq),
                              ("padded", padded), ("sdpa-flash", sdpa)):
                try:
                    fn()
                    torch.cuda.synchronize()
                except Exception as e:  # no kernel for this here: say so
                    rows.append(dict(batch=name, provider=label, us=None, note=str(e).splitlines()[0][:80]))
                    continue
                meds = sorted(timer.time(fn)[0] for _ in range(args.repeats))
                ms = meds[len(meds) // 2]
                rows.append(dict(batch=name, provider=label, us=1e3 * ms, tflops=flops / (ms * 1e-3) / 1e12,
                                 note=f"max err {worst:.1e}" if label == "varlen" else ""))
            compare.log(f"[varlen] {name} done")
        del q, k, v, pq, pk, pv, graph
        torch.cuda.empty_cache()

    gpu = torch.cuda.get_device_name(0)
    lines = [f"# Packed prefill (varlen) — {gpu}", "",
             f"Commit `{args.commit or compare.report.sh(['git', 'rev-parse', '--short', 'HEAD']) or 'unknown'}`; bf16, H_q={h}, H_kv={hkv}, D={d}, causal; "
             f"median of {args.iters} runs × {args.repeats} repeats, L2 flushed; PyTorch {torch.__version__}. "
             "TFLOP/s on the real work (Σ 2·L²·H_q·D); `padded` and `sdpa-flash` compute the padded batch.", "",
             "Batches: " + "; ".join(f"{n} = {l}" for n, l in BATCHES.items()), "",
             "| batch | provider | µs | TFLOP/s (real work) | × varlen | note |", "|---|---|---|---|---|---|"]
    base = {r["batch"]: r["us"] for r in rows if r["provider"] == "varlen" and r["us"]}
    for r in rows:
        us = r["us"]
        ratio = f"{base[r['batch']] / us:.2f}" if us and base.get(r["batch"]) else "—"
        lines.append(f"| {r['batch']} | {r['provider']} | {us:.1f} | {r['tflops']:.0f} | {ratio} | {r['note']} |"
                     if us else f"| {r['batch']} | {r['provider']} | — | — | — | {r['note']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.name}_{gpu.replace(' ', '_')}.md")
    with open(path, "w") as f:
        f.write(text)
    compare.log("wrote " + path)


if __name__ == "__main__":
    main()
