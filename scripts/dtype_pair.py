#!/usr/bin/env python3
"""fp16 against bf16, interleaved: is a kernel's fp16 as fast as its bf16?

Two runs one after the other cannot say whether a kernel's fp16 is within 2 % of its bf16: the
clock drifts between runs by as much (docs/results/run_z_NVIDIA_H100.md). This alternates the two
types, `--rounds` times, `fa2 bench --dtype bf16` then `--dtype fp16` over the same points, and
reports each point's fp16 ÷ bf16 TFLOP/s in every round and their median. Every point is checked
against the fp32 reference by `fa2 bench` before it is timed; a point that fails fails the run.

    python3 scripts/dtype_pair.py --fa2 build/fa2 --steps 100,101 --d 128 --n 4096,16384 --rounds 3 \\
        --out docs/results --name dtype_interleaved --commit abc1234

Writes <out>/<name>_<gpu>.csv (every fa2 bench row, with its round) and <name>_<gpu>.md (the
table). Without a GPU, --selftest-fake-data writes both from made-up rows.
"""
import argparse
import csv
import datetime
import os
import statistics
import subprocess
import sys
import tempfile


def bench(fa2, args, dtype, round_):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.csv")
        cmd = [fa2, "bench", "--steps", args.steps, "--d", args.d, "--n", args.n, "--dtype", dtype,
               "--direction", args.direction, "--repeats", "1", "--no-seed-shape", "--csv", path]
        if args.causal_only:
            cmd.append("--causal-only")
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"dtype_pair: {' '.join(cmd)} failed (exit {out.returncode}):\n{(out.stdout + out.stderr)[-2000:]}")
        with open(path) as f:
            rows = list(csv.DictReader(f))
    for r in rows:
        if r["status"] == "fail":
            sys.exit(f"dtype_pair: step {r['step']} in {dtype} failed its check: {r['note']}")
        r["round"] = str(round_)
    return rows


def fake_rows(args, dtype, round_):
    rows = []
    for step in args.steps.split(","):
        for d in args.d.split(","):
            for n in args.n.split(","):
                for causal in ("0", "1"):
                    for direction in args.direction.split(","):
                        t = 500.0 + 10 * round_ + (5 if dtype == "bf16" else 0) - (100 if direction == "bwd" else 0)
                        rows.append({"step": step, "D": d, "N_q": n, "causal": causal, "dtype": dtype,
                                     "tflops": str(t), "status": "ok", "gpu": "Fake GPU", "round": str(round_),
                                     "direction": direction})
    return rows


def table(rows):
    by = {}
    for r in rows:
        if r.get("status") != "ok" or not r.get("tflops"):
            continue
        key = (r.get("direction", "fwd"), int(r["step"]), int(r["D"]), r["causal"], int(r["N_q"]))
        by.setdefault(key, {}).setdefault(r["round"], {})[r["dtype"]] = float(r["tflops"])
    lines = ["| direction | step | D | causal | N | bf16 TFLOP/s (median) | fp16 | fp16 ÷ bf16 each round | median |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(by):
        rounds = [v for _, v in sorted(by[key].items()) if "bf16" in v and "fp16" in v]
        if not rounds:
            continue
        ratios = [v["fp16"] / v["bf16"] for v in rounds]
        direction, step, d, causal, n = key
        lines.append(f"| {direction} | {step} | {d} | {'yes' if causal == '1' else 'no'} | {n} | "
                     f"{statistics.median(v['bf16'] for v in rounds):.0f} | "
                     f"{statistics.median(v['fp16'] for v in rounds):.0f} | "
                     f"{' '.join(f'{x:.3f}' for x in ratios)} | {statistics.median(ratios):.3f} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fa2", default="build/fa2")
    ap.add_argument("--steps", default="100,101")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--n", default="4096,16384")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--causal-only", action="store_true")
    ap.add_argument("--direction", default="fwd", choices=["fwd", "bwd", "fwd,bwd"],
                    help="fa2 bench's: the forward, the backward (2.5× the forward's FLOPs), or both")
    ap.add_argument("--out", default="docs/results")
    ap.add_argument("--name", default="dtype_interleaved")
    ap.add_argument("--commit", default="")
    ap.add_argument("--selftest-fake-data", action="store_true", help="no GPU: the reports from made-up rows")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds is at least 1")
    rows = []
    for i in range(1, args.rounds + 1):
        for dtype in ("bf16", "fp16"):
            print(f"[dtype_pair] round {i}/{args.rounds}: {dtype}", file=sys.stderr)
            rows += fake_rows(args, dtype, i) if args.selftest_fake_data else bench(args.fa2, args, dtype, i)
    gpu = rows[0].get("gpu", "unknown") if rows else "unknown"
    slug = "".join(c if c.isalnum() else "_" for c in gpu).strip("_")
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{args.name}_{slug}")
    fields = list(rows[0].keys())
    with open(stem + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = [f"# fp16 against bf16, interleaved — {gpu}", "",
          f"Commit `{args.commit or 'unknown'}`, {when}. {args.rounds} rounds of `fa2 bench --dtype bf16` then "
          f"`--dtype fp16` (steps {args.steps}, {args.direction}, D = {args.d}, N = {args.n}; B·N = 16k tokens, H·D = 2048), "
          "each point checked against the fp32 reference before it was timed. Command: `python3 scripts/"
          f"dtype_pair.py {' '.join(sys.argv[1:])}`.", ""] + table(rows)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(table(rows)))
    print(f"[dtype_pair] wrote {stem}.csv, {stem}.md", file=sys.stderr)


if __name__ == "__main__":
    main()
