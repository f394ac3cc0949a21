#!/usr/bin/env python3
"""The one report writer of docs/results/, no GPU needed: the comparison's CSV, markdown, plot and README block
(write_compare, called by compare.py), and as a command line the GPU report of scripts/gpu_report.sh."""
import argparse
import glob
import csv
import datetime
import json
import os
import re
import statistics
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = ("provider,label,kind,step,family,B,H,N_q,N_kv,D,causal,repeat,status,median_ms,min_ms,max_ms,iters,tflops,"
           "gbps,max_abs_err,rel_err,config,note,gpu,commit,date,direction").split(",")
REFS = [("sdpa_flash", "SDPA flash"), ("sdpa_cudnn", "SDPA cuDNN"), ("sdpa_efficient", "SDPA efficient"),
        ("triton_fa2", "Triton FA2 (seed)"), ("fa_course", "fa_course.attention (package, step=None)")]
# The backward's providers: a forward provider's pid with BWD appended (step17_bwd, sdpa_flash_bwd), FLOPs 2.5× the
# forward's; a backward step is compared with the backward of SDPA flash and cuDNN.
BWD = "_bwd"
REFS_BWD = [("sdpa_flash" + BWD, "SDPA flash backward"), ("sdpa_cudnn" + BWD, "SDPA cuDNN backward")]
MARK_BEGIN, MARK_END, FAILED = "<!-- results:begin -->", "<!-- results:end -->", ("fail", "error")


def sh(cmd):
    """A command's output ('' when it fails): a shell line, or an argument list run in the repository."""
    try:
        return subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True, timeout=30,
                              cwd=ROOT).stdout.strip()
    except Exception:
        return ""


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def write_csv(rows, path, columns=COLUMNS):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows({c: f"{r[c]:.6g}" if isinstance(r.get(c), float) else r.get(c, "") for c in columns} for r in rows)


def table(head, rows):
    return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] +
            ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""])


def n_label(n):
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def shape_text(fam, B, H, N, D, causal, short=False):
    c = " causal" if causal else ""
    return f"D={D} N={n_label(N)}{c}{' (seed)' * (fam == 'seed')}" if short else f"B={B} H={H} N={n_label(N)} D={D}{c}"


def fmt_tflops(x):
    return "—" if x is None else f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


class Results:
    """Rows per (provider, shape): TFLOP/s of the median over repeats of each repeat's median."""

    def __init__(self, rows):
        self.points = {}
        for r in rows:
            if r["kind"] == "ceiling":
                continue
            key = (r["provider"], r["family"], int(r["B"]), int(r["H"]), int(r["N_q"]), int(r["D"]), int(r["causal"]))
            pt = self.points.setdefault(key, dict(r, ms=[]))
            if r["status"] == "ok":
                pt["ms"].append(float(r["median_ms"]))
                pt["flops"] = float(r["tflops"]) * float(r["median_ms"]) * 1e9
            elif r["status"] in FAILED:  # a failure in any repeat marks the point
                pt.update(status=r["status"], note=r["note"])
        for pt in self.points.values():
            if pt["ms"] and pt["status"] not in FAILED:
                pt.update(status="ok", tflops=pt["flops"] / (statistics.median(pt["ms"]) * 1e-3) / 1e12,
                          spread=(max(pt["ms"]) - min(pt["ms"])) / min(pt["ms"]))
        self.labels = {p["provider"]: p["label"] for p in self.points.values()}
        self.steps = sorted((p for p in self.labels if p.startswith("step")), key=lambda p: (int(p[4:6]), p))
        self.providers = self.steps + [pid for pid, _ in REFS + REFS_BWD if pid in self.labels]
        self.backward = any(p.endswith(BWD) for p in self.labels)
        ceil = lambda pid, f: statistics.median([float(r[f]) for r in rows if r["provider"] == pid
                                                 and r["status"] == "ok"] or [0]) or None
        self.gemm, self.copy = ceil("gemm_bf16", "tflops"), ceil("copy_d2d", "gbps")

    def get(self, pid, *shape):
        return self.points.get((pid,) + shape)

    def shapes(self, family=None):
        return list(dict.fromkeys(k[1:] for k in self.points if family in (None, k[1])))

    def groups(self):
        """(D, causal) -> [(B, H, N)] of the 16k-token family, sorted by N."""
        out = {}
        for _, B, H, N, D, causal in self.shapes("16k-tokens"):
            out.setdefault((D, causal), []).append((B, H, N))
        return {g: sorted(v, key=lambda x: x[2]) for g, v in sorted(out.items())}


def cell(pt):
    if pt is None:
        return "—"
    return fmt_tflops(pt["tflops"]) if pt["status"] == "ok" else {
        "skipped": "skipped", "unsupported": "n/a", "fail": "**FAIL**", "error": "**ERROR**"}.get(pt["status"], "?")


def ratio(pt, ref):
    if not pt or not ref or pt["status"] != "ok" or ref["status"] != "ok":
        return "—"
    r = pt["tflops"] / ref["tflops"]
    return f"{r:.2f}" if r >= 0.1 else f"{r:.1e}"


def tflops_tables(res, shapes, headers):
    """TFLOP/s per provider, then each step over SDPA flash and cuDNN on the same shapes."""
    L = table(["provider"] + headers, [[res.labels[p]] + [cell(res.get(p, *s)) for s in shapes] for p in res.providers])
    if res.gemm:
        best = [max([pt["tflops"] for p in res.providers for pt in [res.get(p, *s)] if pt and pt["status"] == "ok"]
                    or [0]) for s in shapes]
        L.insert(-1, "| *% of bf16 GEMM, best provider* | " + " | ".join(f"{100 * b / res.gemm:.0f}%" if b else "—"
                                                                      for b in best) + " |")
    refs = lambda p: ("sdpa_flash", "sdpa_cudnn") if not p.endswith(BWD) else ("sdpa_flash" + BWD, "sdpa_cudnn" + BWD)
    if res.steps and any(res.get(r, *s) for s in shapes for p in res.steps for r in refs(p)):
        L += ["Each step relative to the production kernels: TFLOP/s ÷ SDPA flash / ÷ SDPA cuDNN (1.00 = as fast; a "
              "backward over theirs)." if res.backward else
              "Each step relative to the production kernels: TFLOP/s ÷ SDPA flash / ÷ SDPA cuDNN (1.00 = as fast).", ""]
        L += table(["step"] + headers, [[res.labels[p]] + [
            f"{ratio(res.get(p, *s), res.get(refs(p)[0], *s))} / {ratio(res.get(p, *s), res.get(refs(p)[1], *s))}"
            for s in shapes] for p in res.steps])
    return L


def compare_markdown(res, meta, plots):
    t, tol, g = meta["timing"], meta["tolerance"], lambda k: meta.get(k, "?")
    spreads = sorted((pt["spread"], pt["label"], k[1:]) for k, pt in res.points.items() if "spread" in pt)
    title = "Attention forward and backward" if res.backward else "Attention forward"
    L = [f"# {title}: course steps vs PyTorch SDPA and Triton — {meta['gpu']}", ""] + table(["", ""], [
        ["GPU", f"{meta['gpu']}, {g('sms')} SMs, max SM clock {g('max_sm_clock')} MHz"],
        ["SM clock while the kernels ran", meta.get("sm_clock") or "not sampled"],
        ["driver / CUDA (torch) / cuDNN", f"{g('driver')} / {g('cuda')} / {g('cudnn')}"],
        ["torch / triton", f"{g('torch')} / {g('triton')}"], ["commit", f"`{meta['commit']}`"], ["date", meta["date"]],
        ["timing", f"CUDA events; {t['warmup']} warm-up runs, then the median of {t['iters']} runs (fewer, but at "
                   f"least 5, where they would exceed {t['point_budget_ms']:.0f} ms: column `iters`), each after an "
                   f"L2 flush; every point measured {t['repeats']}×; course steps timed by `fa2 bench`, the rest in "
                   "the same process as PyTorch"],
        ["correctness", f"every output vs an fp32 reference: \\|out − ref\\| ≤ {tol['o']['atol']:g} + "
                        f"{tol['o']['rtol']:g}·\\|ref\\|, ‖out − ref‖/‖ref‖ ≤ {tol['o']['max_rel_norm']:g}, no NaN/Inf;"
                        f" LSE within {tol['lse']['atol']:g} + {tol['lse']['rtol']:g}·\\|ref\\| (harness/compare.h, "
                        "harness/check.h)"],
        ["produced by", f"`{meta.get('command', 'python3 scripts/compare.py')}`"]] + [
        ["spread between repeats", f"median {100 * spreads[len(spreads) // 2][0]:.1f} %, largest "
                                   f"{100 * spreads[-1][0]:.1f} % ({spreads[-1][1]}, {shape_text(*spreads[-1][2])})"]
        for _ in spreads[:1]])
    L += ["## Physical limits, measured in the same run", "",
          f"- bf16 GEMM, 8192³ with `torch.matmul`: **{fmt_tflops(res.gemm)} TFLOP/s** (CSV rows "
          "`provider = gemm_bf16`). No attention kernel can beat this: both of its matmuls run on the same tensor "
          "cores, and the softmax between them costs extra.",
          f"- device-to-device copy of 1 GiB: **{res.copy or 0:.0f} GB/s** read + write (CSV rows "
          "`provider = copy_d2d`).", "",
          "FLOPs per point (from `fa2 bench --list --json`, harness/flops.h): 4·B·H·D per visible (query, key) "
          "pair, counting only the pairs the causal mask lets through. TFLOP/s = FLOPs / median time." +
          (" A backward counts 2.5× its forward's FLOPs (five matmuls to the forward's two), as flash-attention "
           "counts them; its rows (`direction = bwd`) are checked against an fp32 backward by the course's own tests "
           "(steps) or here (SDPA: dQ, dK, dV)." if res.backward else ""), ""]
    if res.groups():
        L += [f"## TFLOP/s, B·N = {meta.get('tokens', 16384) // 1024}k tokens, H·D = {meta.get('hidden', 2048)}"
              " (bf16)", ""]
    for (D, causal), pts in res.groups().items():
        L += [f"### D = {D}, {'causal' if causal else 'non-causal'}", ""] + tflops_tables(
            res, [("16k-tokens", B, H, N, D, causal) for B, H, N in pts], [f"N={n_label(N)} (B={B}, H={H})"
                                                                          for B, H, N in pts])
    for fam, title in (("seed", "The seeds' shape: B=2, H=16, N=4096, D=64"), ("custom", "Custom shapes")):
        if res.shapes(fam):
            L += [f"## TFLOP/s, {title}", ""] + tflops_tables(res, res.shapes(fam),
                                                              [shape_text(*s, short=True) for s in res.shapes(fam)])
    L += ["## Correctness", "", "Largest error of each provider over all shapes it ran, against the fp32 reference.",
          ""]
    rows, failures, notes = [], [], {}
    for pid in res.providers:
        pts = [(k[1:], pt) for k, pt in res.points.items() if k[0] == pid]
        checked = [pt for _, pt in pts if pt.get("max_abs_err") not in ("", None) or pt["status"] in FAILED]
        errs = [float(pt["max_abs_err"]) for pt in checked if pt.get("max_abs_err") not in ("", None)]
        rows.append([res.labels[pid], len(checked), sum(pt["status"] not in FAILED for pt in checked),
                     f"{max(errs):.2e}" if errs else "—"])
        failures += [f"- {res.labels[pid]}, {shape_text(*s)}: {pt['note']}" for s, pt in pts if pt["status"] in FAILED]
        for s, pt in pts:
            if pt["status"] in ("skipped", "unsupported"):
                reason = re.sub(r"\d+ ms >", "… ms >", pt["note"])
                notes.setdefault(f"{res.labels[pid]}: {reason}", []).append(shape_text(*s, short=True))
    L += table(["provider", "shapes checked", "passed", "worst max \\|err\\|"], rows)
    L += (["**Failures:**", ""] + failures if failures else
          ["Every provider that ran agrees with the reference within tolerance."]) + [""]
    if notes:
        L += ["## Not timed", ""] + [f"- {k} — {', '.join(v)}" for k, v in sorted(notes.items())] + [""]
    L += ["## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})\n" for p in plots] if plots else []
    return "\n".join(L + ["Reading the numbers: see docs/performance.md (the FLOP count, how the timing is taken, "
                          "the reference numbers production kernels reach on an H200).", ""])


def readme_block(res, meta, report_rel, plot_rels=()):
    """Every provider at N = 4k (or the largest N) of each (D, causal), and the TFLOP/s plot."""
    cols = [("16k-tokens",) + next((p for p in pts if p[2] == 4096), pts[-1]) + (D, causal)
            for (D, causal), pts in res.groups().items()] or res.shapes()
    t = meta["timing"]
    L = [f"{meta.get('dtype', 'bf16')} forward{' and backward' * res.backward}, TFLOP/s, on {meta['gpu']} (commit `{meta['commit']}`, {meta['date']}); "
         f"{'B·N = 16k tokens, H·D = 2048' if res.groups() else 'custom shapes'}. Full report with every N, the ratios "
         f"to SDPA and the plots: [{report_rel}]({report_rel}).", ""]
    L += table(["provider"] + [shape_text(*s, short=True) for s in cols],
               [[res.labels[p]] + [cell(res.get(p, *s)) for s in cols] for p in res.providers])
    if res.gemm:
        L.append(f"bf16 GEMM ceiling on this GPU: {fmt_tflops(res.gemm)} TFLOP/s; copy bandwidth: "
                 f"{res.copy or 0:.0f} GB/s.")
    if any(pt["status"] in ("skipped", "unsupported") for pt in res.points.values()):
        L.append(f"“skipped”: steps {', '.join(f'{n:02d}' for n in t['slow_steps'])} run in fp32 on CUDA cores and are "
                 f"not timed above N = {t['slow_max_n']} (nor is anything whose single run exceeds "
                 f"{t['max_ms_per_point']:.0f} ms); “n/a”: the provider does not support the shape (e.g. a step before "
                 "the causal lesson) or is not installed.")
    return "\n".join(L + [f"\n[![TFLOP/s against N]({r})]({r})" for r in plot_rels])


def write_plot(res, meta, prefix):
    """compare_<gpu>_tflops.png: TFLOP/s against N, one panel per (D, causal) of the 16k-token family."""
    groups, path = res.groups(), f"{prefix}_tflops.png"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[report] warning: matplotlib not installed; no plots")
        return []
    styles = {"sdpa_flash": ("tab:red", "s"), "sdpa_cudnn": ("tab:purple", "^"), "sdpa_efficient": ("tab:brown", "v"),
              "triton_fa2": ("tab:orange", "D"), "fa_course": ("tab:green", "x")}
    cols = 2 if len(groups) > 1 else 1
    fig, axes = plt.subplots(-(-len(groups) // cols), cols, figsize=(6.4 * cols, 4.6 * len(groups) / cols + 1),
                             squeeze=False)
    handles = {}
    for ax, ((D, causal), pts) in zip(axes.flat, groups.items()):
        for pid in res.providers:
            xy = [(N, pt["tflops"]) for B, H, N in pts for pt in [res.get(pid, "16k-tokens", B, H, N, D, causal)]
                  if pt and pt["status"] == "ok"]
            if not xy:
                continue
            i = res.steps.index(pid) if pid in res.steps else 0
            color, marker = styles.get(pid, (plt.get_cmap("viridis")(0.9 * i / max(1, len(res.steps) - 1)), "o"))
            handles[res.labels[pid]] = ax.plot(*zip(*xy), color=color, marker=marker, markersize=5,
                                               linestyle="--" if pid in styles else "-")[0]
        if res.gemm:
            handles[f"bf16 GEMM ({fmt_tflops(res.gemm)})"] = ax.axhline(res.gemm, color="gray", linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xticks([N for _, _, N in pts], [n_label(N) for _, _, N in pts])
        ax.minorticks_off()
        ax.set(xlabel="sequence length N (B = 16k / N)", title=f"D = {D}, {'causal' if causal else 'non-causal'}",
               yscale="log", ylabel="TFLOP/s (log scale)")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.suptitle(f"Attention forward{' and backward' * res.backward}, {meta.get('dtype', 'bf16')}, TFLOP/s — {meta['gpu']}, "
                 f"commit {meta['commit']}")
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=6, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.025 * (len(handles) // 6), 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def pair_report(res, meta, old, new):
    """Provider `new` against `old` on every shape (★: the 12 reference shapes), with both configs."""
    if old not in res.labels or new not in res.labels:
        raise SystemExit(f"--pair: {old} or {new} not in these results; providers: {', '.join(res.providers)}")
    a, b, rows, worst = res.labels[new], res.labels[old], [], []
    for s in res.shapes():
        pn, po = res.get(new, *s), res.get(old, *s)
        star = s[0] == "16k-tokens" and s[3] in (1024, 4096, 16384)
        worst += [pn["tflops"] / po["tflops"]] if star and ratio(pn, po) != "—" else []
        rows.append([shape_text(*s) + " ★" * star, cell(pn), cell(po), ratio(pn, po), (pn or {}).get("config", ""),
                     (po or {}).get("config", "")])
    L = [f"# {a} against {b} — {meta['gpu']}", "", f"Measured in one run (commit `{meta['commit']}`, {meta['date']}), "
         "shape by shape, L2 flushed between runs, median of each repeat's median; ratio = TFLOP/s of the first column "
         "over the second. ★ marks the 12 reference shapes (B·N = 16k tokens, H·D = 2048, N ∈ {1k, 4k, 16k}).", ""]
    L += table(["shape", a, b, "ratio", f"config ({a})", f"config ({b})"], rows)
    return "\n".join(L + ([f"Lowest ratio on the reference shapes: {min(worst):.3f}.", ""] if worst else []))


def write_compare(rows, meta, out, name, readme=None):
    """compare_<gpu>.csv/.json/.md, the plot and (unless readme is None) the README block; returns what it wrote."""
    os.makedirs(out, exist_ok=True)
    prefix = os.path.join(out, name)
    write_csv(rows, prefix + ".csv")
    res = Results(read_csv(prefix + ".csv"))  # the report says what the CSV says, and --from-csv reproduces it
    write(prefix + ".json", json.dumps(meta, indent=1))
    plots = write_plot(res, meta, prefix) if res.groups() else []
    write(prefix + ".md", compare_markdown(res, meta, plots))
    written = [prefix + ext for ext in (".csv", ".json", ".md")] + plots
    if readme:
        here, text = os.path.dirname(os.path.abspath(readme)), read(readme) if os.path.exists(readme) else ""
        b, e = text.find(MARK_BEGIN), text.find(MARK_END)
        if b < 0 or e < b:
            print(f"[report] warning: {readme} has no results markers; not updated")
            return res, written
        block = readme_block(res, meta, os.path.relpath(prefix + ".md", here),
                             [os.path.relpath(p, here) for p in plots])
        write(readme, text[:b + len(MARK_BEGIN)] + "\n" + block.rstrip() + "\n" + text[e:])
        written.append(readme)
    return res, written


# ---- the GPU report of scripts/gpu_report.sh ----------------------------------------------------

def clock_summary(path):
    """'min / median / max MHz (of N samples)' of the SM clock sampled while the GPU work ran: samples
    "<MHz>" or "<MHz>, <utilization %>", the latter kept only while a kernel was running (utilization > 0)."""
    lines = read(path).split("\n") if os.path.exists(path) else []
    mhz = sorted(int(m.group(1)) for m in (re.match(r"\s*(\d+)\s*(?:MHz)?\s*(?:,\s*(\d+)\s*%?)?\s*$", x) for x in lines)
                 if m and (m.group(2) is None or int(m.group(2)) > 0))
    return f"{mhz[0]} / {mhz[len(mhz) // 2]} / {mhz[-1]} MHz (min / median / max of {len(mhz)} samples)" if mhz else ""


def mutant_symptom(text):
    """(verdict, message) of run_mutant.sh's `MUTANT <name>: VERDICT — <message>`, else the first failure message."""
    m = re.search(r"^MUTANT \S+: (KILLED|SURVIVED|CRASHED|NOT RUN|ERROR) — (.*)$", text, re.M)
    verdict, pick = (m.group(1), m.group(2)) if m else ("", "")
    for pat in (r"FAIL: (max\|err\|=[^\n]*)", r"(has \d+ HMMA[^\n]*)", r"(Expected[^\n]*)", r"(Value of[^\n]*)",
                r"(bad input was accepted)", r"(\[  FAILED  \] \S+)"):
        m = None if pick else re.search(pat, text)
        pick = m.group(1) if m else pick
    return verdict, re.sub(r" \(first at \d+\)", "", pick)[:230].replace("|", "\\|")


def ladder_markdown(rows):
    """The ladder CSV (fa2 ladder --csv) as a table: each step's speed-up over the previous timed step."""
    out, prev = [], {}
    for r in rows:
        ms, key = float(r["median_ms"]) if r.get("median_ms") else 0, (r["D"], r["causal"])
        speedup = f"{prev[key] / ms:.2f}×" if ms and key in prev else "—"
        prev[key] = ms or prev.get(key)
        err = lambda c: f"{float(r[c]):.2e}" if r.get(c) else "—"
        out.append([f"{int(r['step']):02d}_{r['name']}", "yes" if r["causal"] == "1" else "no", err("max_abs_err"),
                    err("rel_err"), f"{ms:.3f}" if ms else "—", f"{float(r['tflops']):.1f}" if ms else "—", speedup,
                    "pass" if r["status"] == "ok" else r["note"].replace("|", "\\|"), r.get("config") or "—"])
    return table(["step", "causal", "max err", "rel err", "ms", "TFLOP/s", "× previous step", "check", "config"], out)


def gpu_report(a):
    """<slug>.md (tests, mutants, printed measurements, sanitizer, ladder) and <slug>.csv (the ladder rows)."""
    # ctest.log and ctest.xml, or one ctest_<part>.log/.xml per part when the tests ran in parts.
    logs, xmls = (sorted(glob.glob(os.path.join(a.logs, f"ctest*.{ext}"))) for ext in ("log", "xml"))
    san = os.path.join(a.logs, "sanitizer.csv")
    pat = re.compile(r"Test\s+#\d+: (.+?) \.{3,}\**\s*(Passed|Failed|Skipped|Not Run|Timeout|Exception|\w+)")
    tests = [m.groups() for log in logs for m in map(pat.search, read(log).split("\n")) if m]
    cases = [(c.get("name", ""), "".join(e.text or "" for e in c.iter("system-out")))
             for xml in xmls for c in ET.parse(xml).getroot().iter("testcase")]
    clock = clock_summary(os.path.join(a.logs, "clocks.txt"))
    L = [f"# GPU results: {a.gpu}", "", f"- commit: `{a.commit}`",
         f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
         f"- GPU: {a.gpu}; max SM clock, memory clock, driver: "
         f"{sh('nvidia-smi --query-gpu=clocks.max.sm,clocks.mem,driver_version --format=csv,noheader')}"]
    L += [f"- SM clock while the tests, sanitizer and ladder ran: {clock}"] * bool(clock)
    L += [f"- CUDA: {sh('nvcc --version | tail -1')}",
          "- produced by `scripts/gpu_report.sh` (build, all tests, compute-sanitizer, ladder)", "", "## Tests", "",
          f"{len(tests)} ctest cases: " + ", ".join(f"{v} {k.lower()}" for k, v in sorted(Counter(
              r for _, r in tests).items())) + f" (ctest exit code {a.ctest_rc}).", ""]
    for what, names in (("Failed", [n for n, r in tests if r not in ("Passed", "Skipped")]),
                        ("Skipped", [n for n, r in tests if r == "Skipped"][:50])):
        L += [f"{what}: " + ", ".join(f"`{n}`" for n in names), ""] if names else []
    per_step = {}
    for n, r in tests:
        if re.match(r"step\d\d\.(?!registered$)", n):
            per_step.setdefault(n[4:6], Counter())[r] += 1
    L += table(["step", "GPU suite cases", "passed", "failed", "skipped"], [
        [s, sum(d.values()), d["Passed"], sum(d.values()) - d["Passed"] - d["Skipped"], d["Skipped"]]
        for s, d in sorted(per_step.items())]) if per_step else []
    symptoms = {n: mutant_symptom(t) for n, t in cases if n.startswith("bug.")}
    L += ["## Bug catalog mutants", "", "A mutant is killed when its regression test fails by its assertion on the "
          "build with the bug injected; a crash or a skipped test is never counted as a kill.", ""]
    verdict = lambda r, v: f"**{v}**" if r == "Failed" and v in ("CRASHED", "ERROR") else {
        "Passed": "killed", "Failed": "**SURVIVED**", "Skipped": "not run (skipped)"}.get(r, r)
    L += table(["mutant", "result", "how the regression test failed (first message)"], [
        [f"`{n[4:]}`", verdict(r, symptoms.get(n, ("", ""))[0]), symptoms.get(n, ("", ""))[1]]
        for n, r in sorted(tests) if n.startswith("bug.")])
    printed = [(n, m.group(1).strip().replace("|", "\\|")) for n, t in cases
               for m in re.finditer(r"^ {4}((?:host cost per call|first call): .*)$", t, re.M)]
    L += ["## Measurements printed by the tests", ""] + table(["test", "measurement"], [
        [f"`{n}`", t] for n, t in sorted(printed)]) if printed else []
    if os.path.exists(san) and read_csv(san):
        L += ["## compute-sanitizer (B=1, H=2, H_kv=1, N_q=77, N_kv=131, D=64)", ""] + table(
            ["step", "tool", "result", "errors"], [[r[c] for c in ("step", "tool", "result", "errors")]
                                                   for r in read_csv(san)])
    ladder = []
    for d in ("64", "128"):
        path = os.path.join(a.logs, f"ladder_d{d}.csv")
        if os.path.exists(path):
            rows = read_csv(path)
            ladder += rows
            L += [f"## Ladder, D={d}" + (" (B={B} H={H_q} N={N_q}, bf16)".format(**rows[0]) if rows else ""), ""]
            L += ladder_markdown(rows)
    os.makedirs(a.out, exist_ok=True)
    write(os.path.join(a.out, f"{a.slug}.md"), "\n".join(L) + "\n")
    if ladder:
        write_csv(ladder, os.path.join(a.out, f"{a.slug}.csv"), list(ladder[0]))
    print(f"wrote {a.out}/{a.slug}.md")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="docs/results/<gpu>.md and .csv from the logs of scripts/gpu_report.sh")
    for name in ("logs", "out", "slug", "gpu", "commit", "ctest-rc"):
        ap.add_argument("--" + name, required=True)
    gpu_report(ap.parse_args())
