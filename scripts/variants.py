#!/usr/bin/env python3
"""Part VI's variants beside the plain call and beside FlexAttention, forward and backward, in one run.

The score modifications (softcap 50, ALiBi, sinks, all three) at D = 64 and 128, N = 4096, causal,
B·N = 16k tokens, H·D = 2048 (the reference shapes' family), and a causal sliding window of 1024
keys at D = 128 for N = 4k, 16k and 64k. Each is timed on the course's production kernels through
the package (`fa_course.attention`: the library's choice, 101 on an H100/H200, and kernel 100 pinned),
on FlexAttention (torch.compile'd; its score_mod and block mask express softcap, ALiBi and the window,
not sinks) and, for the plain call, on SDPA's cuDNN backend; timed as compare.py times SDPA (L2
flushed before each call, CUDA events, the median of `--iters`). A provider's output is checked
against FlexAttention's where both run (or the course's plain kernel's at the plain call).

FLOPs: 4·D per visible (query, key) pair forward (the window's pairs counted exactly), 2.5× that
backward. Reported: TFLOP/s, each variant's ratio to its provider's plain call (the issue's targets:
softcap ≥ 0.85×, ALiBi and sinks ≥ 0.95×), the window's TFLOP/s at 16k and its time per query row
from 4k to 64k (flat is the target).

    python3 scripts/variants.py --fa2 build/fa2                        # the run (a few minutes)
    python3 scripts/variants.py --fa2 build/fa2 --quick                # D = 128, no 64k, fewer iterations
    python3 scripts/variants.py --selftest-fake-data --out /tmp/v      # no GPU, no torch: the report
"""
import argparse
import csv
import datetime
import math
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import write_report as report  # noqa: E402

ROOT = report.ROOT
TOKENS, HIDDEN, CAP, WINDOW = 16384, 2048, 50.0, 1024
MODS = ("plain", "softcap", "alibi", "sinks", "all")
PROVIDERS = ("fa_course", "kernel_100", "flex", "sdpa_cudnn")
COLUMNS = ("group", "variant", "provider", "direction", "B", "H", "N", "D", "causal", "window", "pairs", "flops",
           "status", "median_ms", "min_ms", "max_ms", "iters", "tflops", "max_abs_diff", "checked_against", "note",
           "gpu", "commit", "date")
TARGETS = {"softcap": 0.85, "alibi": 0.95, "sinks": 0.95}
FA4_WINDOW_TFLOPS = 478.0  # FlashAttention-4, causal window 1k, N = 16k, D = 128, H200, 2026-12-01 (the issue's)


def visible_pairs(n, window):
    """Causal (query i, key j) pairs, N_q = N_kv = n, with a window of `window` keys before the
    diagonal (−1: none): row i sees min(i, window) + 1 keys."""
    if window < 0:
        return n * (n + 1) // 2
    full = max(0, n - window)  # rows i >= window see window + 1 keys
    return full * (window + 1) + min(n, window) * (min(n, window) + 1) // 2


def cases(quick):
    """(group, variant, B, H, N, D, window) in the order they run."""
    out = []
    for d in ((128,) if quick else (64, 128)):
        for m in MODS:
            out.append(("mods", m, TOKENS // 4096, HIDDEN // d, 4096, d, -1))
    for n in ((4096, 16384) if quick else (4096, 16384, 65536)):
        out.append(("window", "window", max(1, TOKENS // n), HIDDEN // 128, n, 128, WINDOW))
    return out


class Runner:
    """The providers on one case: inputs, callables and the checks."""

    def __init__(self, args):
        import torch
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        import compare
        self.torch = torch
        t = dict(iters=args.iters, warmup=args.warmup, repeats=1)
        self.timer = compare.Torch(t, None)
        self.fa, why = compare.load_package(args.fa2 or os.path.join(ROOT, "build", "fa2"))
        if self.fa is None:
            raise SystemExit(f"variants: {why}")
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            # Each variant's score_mod and block mask, forward and backward (grad mode), is a graph of
            # its own: past dynamo's default limit of 8 FlexAttention fell back to its unfused
            # implementation, which materialises the scores (3-8 TFLOP/s and out of memory at 64k).
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, 256)
            self.flex = torch.compile(flex_attention, dynamic=False)
            self.block_mask = create_block_mask
        except Exception as e:  # FlexAttention missing: its rows say so
            self.flex, self.flex_why = None, f"{type(e).__name__}: {e}"

    def inputs(self, b, h, n, d, seed):
        torch = self.torch
        g = torch.Generator(device="cuda").manual_seed(seed)
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device="cuda")
        sinks = torch.randn(h, device="cuda", generator=g) + math.log(n)  # trained sinks sit near ln N
        return q, k, v, do, slopes, sinks

    def course(self, variant, q, k, v, slopes, sinks, window, step):
        kw = dict(causal=True, causal_align="bottom_right", step=step)
        if variant in ("softcap", "all"):
            kw["softcap"] = CAP
        if variant in ("alibi", "all"):
            kw["alibi_slopes"] = slopes
        if variant in ("sinks", "all"):
            kw["sinks"] = sinks
        if window >= 0:
            kw["window_size"] = (window, 0)
        return lambda q_, k_, v_, s_=None: self.fa.attention(q_, k_, v_, **dict(kw, **({"sinks": s_} if s_ is not None
                                                                                          else {})))

    def flex_fn(self, variant, n, window, slopes):
        """FlexAttention's call for the variant, (B, N, H, D) in and out, or None (sinks)."""
        if self.flex is None or variant in ("sinks", "all"):
            return None
        torch = self.torch
        if window >= 0:
            mask = lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= window)
        else:
            mask = lambda b, h, qi, ki: qi >= ki
        block = self.block_mask(mask, None, None, n, n, device="cuda")
        if variant == "softcap":
            mod = lambda s, b, h, qi, ki: CAP * torch.tanh(s / CAP)
        elif variant == "alibi":
            mod = lambda s, b, h, qi, ki: s - slopes[h] * (qi - ki).abs()
        else:
            mod = None
        flex = self.flex
        return lambda q_, k_, v_: flex(q_.transpose(1, 2), k_.transpose(1, 2), v_.transpose(1, 2), score_mod=mod,
                                       block_mask=block).transpose(1, 2)

    def sdpa(self, variant, window):
        if variant != "plain" or window >= 0:
            return None
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        f = torch.nn.functional.scaled_dot_product_attention

        def call(q_, k_, v_):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return f(q_.transpose(1, 2), k_.transpose(1, 2), v_.transpose(1, 2), is_causal=True).transpose(1, 2)
        return call

    def run(self, case, meta):
        group, variant, b, h, n, d, window = case
        torch = self.torch
        q, k, v, do, slopes, sinks = self.inputs(b, h, n, d, seed=zlib.crc32(repr(case).encode()) & 0xFFFF)
        pairs = visible_pairs(n, window) * b * h
        fwd_flops = 4.0 * d * pairs
        fns = {"fa_course": self.course(variant, q, k, v, slopes, sinks, window, None),
               "kernel_100": self.course(variant, q, k, v, slopes, sinks, window, 100),
               "flex": self.flex_fn(variant, n, window, slopes), "sdpa_cudnn": self.sdpa(variant, window)}
        base = dict(group=group, variant=variant, B=b, H=h, N=n, D=d, causal=1, window=window, pairs=pairs, **meta)
        rows, outs = [], {}
        for prov in PROVIDERS:
            fn = fns[prov]
            for direction in ("fwd", "bwd"):
                r = dict(base, provider=prov, direction=direction, flops=fwd_flops * (2.5 if direction == "bwd" else 1))
                if fn is None:
                    rows.append(dict(r, status="not run", note="FlexAttention has no sinks" if prov == "flex" and
                                     self.flex is not None else "no such call"))
                    continue
                try:
                    if direction == "fwd":
                        with torch.no_grad():
                            outs[prov] = fn(q, k, v).float()
                            med, lo, hi = self.timer.time(lambda: fn(q, k, v))
                    else:
                        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                        learn = variant in ("sinks", "all") and prov in ("fa_course", "kernel_100")
                        if learn:
                            leaves.append(sinks.detach().clone().requires_grad_())
                        out = fn(*leaves)
                        med, lo, hi = self.timer.time(
                            lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
                    rows.append(dict(r, status="ok", median_ms=med, min_ms=lo, max_ms=hi, iters=self.timer.t["iters"],
                                     tflops=r["flops"] / (med * 1e-3) / 1e12))
                except Exception as e:  # a refusal or a failure is this row's result, not the run's end
                    rows.append(dict(r, status="failed", note=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"))
                    break
        # Agreement: each output against FlexAttention's (the course's plain kernel's where Flex has none).
        ref_name = "flex" if "flex" in outs else ("sdpa_cudnn" if "sdpa_cudnn" in outs else None)
        for r in rows:
            if r["direction"] == "fwd" and r["provider"] in outs and ref_name and r["provider"] != ref_name:
                r["max_abs_diff"] = float((outs[r["provider"]] - outs[ref_name]).abs().max())
                r["checked_against"] = ref_name
        if "fa_course" in outs and "kernel_100" in outs:
            for r in rows:
                if r["provider"] == "kernel_100" and r["direction"] == "fwd" and not r.get("checked_against"):
                    r["max_abs_diff"] = float((outs["kernel_100"] - outs["fa_course"]).abs().max())
                    r["checked_against"] = "fa_course"
        return rows


def fmt(x, spec="{:.0f}"):
    return "—" if x in (None, "") else spec.format(float(x))


def render(rows, meta):
    """The report: tables by group and direction, then the targets' verdicts."""
    def get(group, variant, prov, direction, n=None, d=None):
        for r in rows:
            if (r["group"], r["variant"], r["provider"], r["direction"]) == (group, variant, prov, direction) and \
                    (n is None or int(r["N"]) == n) and (d is None or int(r["D"]) == d):
                return r
        return None

    tf = lambda r: float(r["tflops"]) if r and r.get("status") == "ok" and r.get("tflops") not in (None, "") else None
    lines = [f"# Part VI's variants — {meta['gpu']}", "",
             f"Commit `{meta['commit']}`, {meta['date']}; `{meta['command']}`. TFLOP/s on the visible pairs (4·D a pair "
             "forward, 2.5× that backward), the median of each call; in brackets each variant's ratio to the same "
             "provider's plain call. Course: `fa_course.attention` (the library's choice) and kernel 100 pinned; "
             "FlexAttention compiled; SDPA cuDNN where it has the call.", ""]
    verdicts = []
    dims = sorted({int(r["D"]) for r in rows if r["group"] == "mods"})
    for d in dims:
        for direction in ("fwd", "bwd"):
            head = ["variant"] + list(PROVIDERS)
            body = []
            for m in MODS:
                cells = [m]
                for prov in PROVIDERS:
                    r, p = get("mods", m, prov, direction, d=d), tf(get("mods", "plain", prov, direction, d=d))
                    x = tf(r)
                    cells.append("—" if x is None else f"{x:.0f}" + (f" ({x / p:.2f}×)" if p and m != "plain" else ""))
                    if prov == "fa_course" and m in TARGETS and x is not None and p:
                        ok = x / p >= TARGETS[m]
                        verdicts.append(f"- {m} at D = {d}, {direction}: {x / p:.2f}× the plain call (target "
                                        f"≥ {TARGETS[m]:.2f}×): {'met' if ok else 'missed'}")
                body.append(cells)
            lines += [f"## Score modifications, D = {d}, N = 4096, causal, {direction}", ""] + report.table(head, body)
    wn = sorted({int(r["N"]) for r in rows if r["group"] == "window"})
    if wn:
        for direction in ("fwd", "bwd"):
            head = ["N"] + [f"{p} TFLOP/s" for p in PROVIDERS[:3]] + ["fa_course ns per query row"]
            body = []
            per_row = []
            for n in wn:
                cells = [report.n_label(n)]
                for prov in PROVIDERS[:3]:
                    cells.append(fmt(tf(get("window", "window", prov, direction, n=n))))
                r = get("window", "window", "fa_course", direction, n=n)
                ns = float(r["median_ms"]) * 1e6 / (int(r["B"]) * n) if tf(r) else None
                per_row.append(ns)
                cells.append(fmt(ns, "{:.1f}"))
                body.append(cells)
            lines += [f"## Sliding window of {WINDOW} keys, causal, D = 128, {direction}", ""] + report.table(head, body)
            x = tf(get("window", "window", "fa_course", direction, n=16384))
            if direction == "fwd" and x is not None:
                verdicts.append(f"- window {WINDOW} at 16k, D = 128, fwd: {x:.0f} TFLOP/s (FlashAttention-4: "
                                f"{FA4_WINDOW_TFLOPS:.0f}): {'met' if x >= FA4_WINDOW_TFLOPS else 'missed'}")
            got = [p for p in per_row if p]
            rates = [x for x in (tf(get("window", "window", "fa_course", direction, n=n)) for n in wn) if x]
            if direction == "fwd" and len(got) >= 2 and len(rates) >= 2:
                # Flat per visible pair: a row's work grows to 1,025 keys over its first 1,024 rows, so the
                # time per row at 4k sits a few per cent below the longer sequences' by the count alone.
                spread = max(rates) / min(rates)
                verdicts.append(f"- window time per query row, {report.n_label(wn[0])} to {report.n_label(wn[-1])}: "
                                f"{min(got):.1f}–{max(got):.1f} ns; TFLOP/s on the visible pairs {spread:.2f}× apart "
                                f"(flat within 10 %: {'met' if spread <= 1.10 else 'missed'})")
    bad = [r for r in rows if r.get("status") == "failed"]
    far = [r for r in rows if r.get("max_abs_diff") not in (None, "") and float(r["max_abs_diff"]) > 0.05]
    lines += ["## Targets", ""] + (verdicts or ["- no target measured"]) + [""]
    if bad or far:
        lines += ["## Problems", ""] + [f"- {r['provider']} {r['variant']} N = {r['N']} D = {r['D']} {r['direction']}: "
                                        f"{r.get('note') or ''}" for r in bad] + \
                 [f"- {r['provider']} {r['variant']} N = {r['N']} D = {r['D']}: max |O − {r['checked_against']}| = "
                  f"{float(r['max_abs_diff']):.3f}" for r in far] + [""]
    return "\n".join(lines)


def fake_rows(quick, meta):
    rows = []
    for case in cases(quick):
        group, variant, b, h, n, d, window = case
        pairs = visible_pairs(n, window) * b * h
        for i, prov in enumerate(PROVIDERS):
            for direction in ("fwd", "bwd"):
                flops = 4.0 * d * pairs * (2.5 if direction == "bwd" else 1)
                r = dict(group=group, variant=variant, provider=prov, direction=direction, B=b, H=h, N=n, D=d, causal=1,
                         window=window, pairs=pairs, flops=flops, **meta)
                if (prov == "flex" and variant in ("sinks", "all")) or (prov == "sdpa_cudnn" and variant != "plain"):
                    rows.append(dict(r, status="not run", note="no such call"))
                    continue
                t = 500.0 - 40 * i - 60 * MODS.index(variant) if group == "mods" else 480.0 - 10 * i
                rows.append(dict(r, status="ok", tflops=t, median_ms=flops / t / 1e9, min_ms=flops / t / 1e9,
                                 max_ms=flops / t / 1e9, iters=1))
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fa2", help="this build's fa2 (its folder's libfa2_capi.so is the package's library)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results"))
    ap.add_argument("--name", help="file stem (default: variants_<gpu>)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="D = 128 only, no 64k, 10 iterations")
    ap.add_argument("--commit", help="commit to stamp the results with (default: git rev-parse)")
    ap.add_argument("--selftest-fake-data", action="store_true", help="no GPU, no torch: the report from made-up rows")
    args = ap.parse_args(argv)
    if args.quick:
        args.iters = min(args.iters, 10)
    meta = dict(commit=args.commit or (report.sh(["git", "rev-parse", "--short", "HEAD"]) or "unknown"),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                command=" ".join(["python3 scripts/variants.py"] + argv))
    if args.selftest_fake_data:
        meta["gpu"] = "FAKE GPU"
        rows = fake_rows(args.quick, meta)
    else:
        runner = Runner(args)
        meta["gpu"] = runner.torch.cuda.get_device_name(0)
        rows = []
        for case in cases(args.quick):
            print(f"variants: {case}", flush=True)
            rows += runner.run(case, meta)
    os.makedirs(args.out, exist_ok=True)
    stem = args.name or "variants_" + meta["gpu"].replace(" ", "_")
    with open(os.path.join(args.out, stem + ".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: ("" if r.get(c) is None else r.get(c, "")) for c in COLUMNS})
    text = render(rows, dict(meta, command=meta["command"]))
    report.write(os.path.join(args.out, stem + ".md"), text + "\n")
    print(text)
    if args.selftest_fake_data:
        # The fake numbers give every verdict: the report must say each (a renderer that drops one fails).
        need = [f"- {m} at D = 128, fwd:" for m in TARGETS] + ["- window 1024 at 16k", "- window time per query row"]
        missing = [x for x in need if x not in text]
        if missing:
            print(f"variants selftest: the report lacks {missing}", file=sys.stderr)
            return 1
        ok_rows = sum(1 for r in rows if r["status"] == "ok")
        print(f"variants selftest: {len(rows)} rows ({ok_rows} timed), report and CSV written to {args.out}")
    return 1 if any(r.get("status") == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
