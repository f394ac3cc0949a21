#!/usr/bin/env python3
"""Decode calls, course steps beside PyTorch SDPA, in one run: Part V's table.

`fa2 decode` times the course's steps on decode shapes (a few query rows per sequence, a long KV
cache, GQA) and checks each against the fp32 GPU reference; this adds SDPA's flash and cuDNN
backends on the same shapes (GQA through `enable_gqa`), checked against an fp32 reference and timed
the way compare.py times them (L2 flushed, runs queued behind a spin, median), and the memory's copy
rate. Speed is the KV cache's bytes read per second: 2·B·H_kv·N_kv·D·2 bytes over the call's time.

    python3 scripts/decode_compare.py --fa2 build/fa2 --out docs/results --commit abc1234
    python3 scripts/decode_compare.py --fa2 build/fa2 --steps 16,27 --splits auto,1,8 --shapes 1:8k,1:128k
"""
import argparse
import csv
import datetime
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (its Torch timer and check: one way of timing for every report)

SHAPES = "1:8k,8:8k,32:8k,128:8k,1:128k,4:64k,32:1k,256:1k"
SDPA = [("sdpa_flash", "SDPA flash", "FLASH_ATTENTION"), ("sdpa_cudnn", "SDPA cuDNN", "CUDNN_ATTENTION")]
O_TOL = dict(atol=2e-2, rtol=2e-2, max_rel_norm=1e-2)  # harness/compare.h's bf16_tolerance()


def parse_shapes(spec):
    out = []
    for item in spec.split(","):
        b, n = item.split(":")
        out.append((int(b), int(n[:-1]) * 1024 if n[-1] in "kK" else int(n)))
    return out


def run_course(args, tmp):
    path = os.path.join(tmp, "decode.csv")
    cmd = [args.fa2, "decode", "--steps", args.steps, "--shapes", args.shapes, "--h", str(args.h), "--hkv",
           str(args.hkv), "--nq", str(args.nq), "--d", str(args.d), "--splits", args.splits, "--iters", str(args.iters),
           "--repeats", str(args.repeats), "--csv", path] + (["--causal"] if args.causal else []) + \
        (["--seqlens"] if args.seqlens else []) + (["--ragged"] if args.ragged else []) + \
        (["--page-size", str(args.page_size)] if args.page_size else [])
    compare.log("running " + " ".join(cmd))
    env = dict(os.environ, FA_COMMIT=args.commit) if args.commit else None
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    sys.stderr.write(r.stderr[-4000:])
    if r.returncode not in (0, 3) or not os.path.exists(path):
        raise SystemExit(f"decode_compare.py: fa2 decode failed ({r.returncode})")
    with open(path) as f:
        return list(csv.DictReader(f)), r.stdout


def measure_sdpa(args, shapes):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    timer = compare.Torch(dict(warmup=5, iters=args.iters, repeats=args.repeats), None)
    rows = []
    for si, (B, N) in enumerate(shapes):
        gen = torch.Generator(device="cuda").manual_seed(4242 + si)
        q = torch.randn((B, args.h, args.nq, args.d), device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn((B, args.hkv, N, args.d), device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        # fp32 reference, one sequence at a time, K/V repeated over each group's query heads
        ref = torch.empty(q.shape, device="cuda")
        g = args.h // args.hkv
        for b in range(B):
            kk, vv = (t[b].float().repeat_interleave(g, 0) for t in (k, v))
            s = torch.matmul(q[b].float(), kk.transpose(-1, -2)) / math.sqrt(args.d)
            if args.causal:  # bottom-right: row i sees keys j <= i + N - N_q
                i = torch.arange(args.nq, device="cuda")[:, None]
                s.masked_fill_(torch.arange(N, device="cuda")[None, :] > i + N - args.nq, -math.inf)
            ref[b] = torch.matmul(torch.softmax(s, -1), vv)
        del kk, vv, s
        for pid, label, backend in ([] if args.ragged else SDPA):
            r = dict(provider=pid, label=label, B=B, N_kv=N, status="ok", note="")

            def fn(be=getattr(SDPBackend, backend)):
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True) \
                        if not args.causal else _causal_br(F, q, k, v)

            try:
                out = fn()
                torch.cuda.synchronize()
            except Exception as e:  # no kernel for this shape or option here: not a wrong answer
                rows.append(dict(r, status="unsupported", note=(str(e).strip().splitlines() or [type(e).__name__])[0]))
                continue
            ok, err, rel, why = timer.check(out, ref, O_TOL)
            r.update(max_abs_err=err)
            if not ok:
                rows.append(dict(r, status="fail", note="FAILED check: " + why))
                continue
            meds = []
            for _ in range(args.repeats):
                meds.append(timer.time(fn)[0])
            meds.sort()
            r["median_us"] = 1e3 * meds[len(meds) // 2]
            rows.append(r)
        compare.log(f"[sdpa] B={B} N_kv={N} done")
        del q, k, v, ref
        torch.cuda.empty_cache()
    # the memory's copy rate (read + write), timed the same way: the ceiling a decode call reads at
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timer.time(lambda: dst.copy_(src))[0]
    return rows, 2 * src.numel() / (ms * 1e-3) / 1e12, dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__,
                                                           cudnn=str(torch.backends.cudnn.version()))


def _causal_br(F, q, k, v):
    """Bottom-right causal through an explicit mask (SDPA's is_causal is top-left)."""
    import torch
    nq, n = q.shape[-2], k.shape[-2]
    mask = torch.ones((nq, n), dtype=torch.bool, device=q.device).tril(n - nq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fa2", required=True)
    ap.add_argument("--steps", default="16,27")
    ap.add_argument("--splits", default="auto")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--nq", type=int, default=1)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seqlens", action="store_true", help="the course's steps get each length in device memory")
    ap.add_argument("--ragged", action="store_true",
                    help="the course's steps only, sequences of different lengths (fa2 decode --ragged); SDPA "
                         "has no lengths and is left out")
    ap.add_argument("--page-size", type=int, default=0,
                    help="the steps that read a block table get the same keys in pages of this many (fa2 decode "
                         "--page-size); SDPA reads the unpaged cache")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default=os.path.join(compare.ROOT, "docs", "results"))
    ap.add_argument("--name", default="decode")
    args = ap.parse_args()
    shapes = parse_shapes(args.shapes)
    with tempfile.TemporaryDirectory() as tmp:
        course, course_table = run_course(args, tmp)
    sdpa, copy_rate, env = measure_sdpa(args, shapes)
    kv_bytes = lambda B, N: 2 * B * args.hkv * N * args.d * 2
    commit = args.commit or (course[0]["commit"] if course else "unknown")
    rows = []
    for r in course:
        us = float(r["median_us"]) if r["median_us"] else None
        label = f"step {int(r['step']):02d}" + ("" if r["splits_asked"] == "-" else f" (splits {r['splits_asked']})")
        rows.append(dict(provider=f"step{int(r['step']):02d}", label=label, B=int(r["B"]), N_kv=int(r["N_kv"]),
                         splits=r["splits_used"] if r["splits_asked"] != "-" else "", median_us=us,
                         status=r["status"], note=r["note"], kv_tb_s=float(r["kv_tb_s"]) if r["kv_tb_s"] else None))
    rows += [dict(r, splits="") for r in sdpa]
    for r in rows:  # fa2 decode's rows carry their own (the keys that exist, with --ragged)
        us = r.get("median_us")
        if r.get("kv_tb_s") is None:
            r["kv_tb_s"] = kv_bytes(r["B"], r["N_kv"]) / (us * 1e-6) / 1e12 if us else None
    labels = list(dict.fromkeys(r["label"] for r in rows))
    get = {(r["label"], r["B"], r["N_kv"]): r for r in rows}
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = [f"# Decode on the {env['gpu']}: KV-cache bytes read per second", "",
          f"Commit `{commit}`, {date}; torch {env['torch']}, cuDNN {env['cudnn']}. bf16, H_q = {args.h}, "
          f"H_kv = {args.hkv}, N_q = {args.nq}, D = {args.d}{', causal (bottom-right)' if args.causal else ''}. "
          f"Each cell: TB/s (µs), the median of {args.repeats} repeats of {args.iters} runs, L2 flushed. "
          f"Bytes: 2·B·H_kv·N_kv·D·2, the cache read once. The memory's copy rate (read + write) in this run: "
          f"**{copy_rate:.2f} TB/s**.", "",
          "Command: `python3 scripts/decode_compare.py " + " ".join(sys.argv[1:]) + "`", "",
          "| B | N_kv | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for B, N in shapes:
        cells = []
        for lab in labels:
            r = get.get((lab, B, N))
            if r is None or r["status"] != "ok" or not r.get("median_us"):
                cells.append("—" if r is None else r["status"])
            else:
                cells.append(f"{r['kv_tb_s']:.2f} ({r['median_us']:.1f})" + (f" S={r['splits']}" if r["splits"] else ""))
        md.append(f"| {B} | {N // 1024 if N % 1024 == 0 else N}{'k' if N % 1024 == 0 else ''} | " + " | ".join(cells)
                  + " |")
    notes = [r for r in rows if r["status"] != "ok" or r.get("note")]
    if notes:
        md += ["", "Notes:"] + [f"- {r['label']}, B={r['B']} N_kv={r['N_kv']}: {r['status']} {r.get('note', '')}"
                                for r in notes]
    md += ["", "The course's own table from `fa2 decode`:", "", course_table.strip()]
    os.makedirs(args.out, exist_ok=True)
    gpu = env["gpu"].replace(" ", "_")
    with open(os.path.join(args.out, f"{args.name}_{gpu}.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(args.out, f"{args.name}_{gpu}.csv"), "w", newline="") as f:
        cols = ["provider", "label", "B", "N_kv", "splits", "median_us", "kv_tb_s", "status", "note"]
        w = csv.DictWriter(f, fieldnames=cols + ["H_q", "H_kv", "N_q", "D", "causal", "gpu", "commit", "copy_tb_s"],
                           extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, H_q=args.h, H_kv=args.hkv, N_q=args.nq, D=args.d, causal=int(args.causal),
                            gpu=env["gpu"], commit=commit, copy_tb_s=f"{copy_rate:.3f}"))
    print("\n".join(md))


if __name__ == "__main__":
    main()
