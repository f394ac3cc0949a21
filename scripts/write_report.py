#!/usr/bin/env python3
"""Writes docs/results/<gpu>.md and <gpu>.csv from the logs of scripts/gpu_report.sh."""
import argparse
import csv
import datetime
import os
import re
import subprocess


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""


def parse_ctest(path):
    tests = []
    pat = re.compile(r"Test\s+#\d+: (.+?) \.{3,}\**\s*(Passed|Failed|Skipped|Not Run|Timeout|Exception|\w+)")
    with open(path, errors="replace") as f:
        for line in f:
            m = pat.search(line)
            if m:
                tests.append((m.group(1), m.group(2)))
    return tests


def mutant_symptoms(path):
    """Each bug.* test's verdict and first failure message, from run_mutant.sh's last line
    (`MUTANT <name>: KILLED|SURVIVED|CRASHED|NOT RUN — <message>`), else from its output."""
    import xml.etree.ElementTree as ET
    out = {}
    if not os.path.exists(path):
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("bug."):
            continue
        text = "".join(e.text or "" for e in case.iter("system-out"))
        verdict, pick = "", ""
        m = re.search(r"^MUTANT \S+: (KILLED|SURVIVED|CRASHED|NOT RUN|ERROR) — (.*)$", text, re.M)
        if m:
            verdict, pick = m.group(1), m.group(2)
        else:
            for pat in (r"FAIL: (max\|err\|=[^\n]*)", r"(has \d+ HMMA, expected at least \d+)",
                        r"(no \w+ in the kernels[^\n]*)", r"(\[  FAILED  \] Sass\.\w+)", r"(Expected[^\n]*)",
                        r"(Value of[^\n]*)", r"(bad input was accepted)", r"(\[  FAILED  \] \S+)"):
                m = re.search(pat, text)
                if m:
                    pick = m.group(1)
                    break
        pick = re.sub(r" \(first at \d+\)", "", pick)
        out[name] = (verdict, pick[:230].replace("|", "\\|"))
    return out


def printed_measurements(path):
    """Lines a test prints as a measurement, `    <what>: <value> ...` (e.g. the tuner's host cost per
    call), with the test that printed them: the numbers a lesson quotes from a test run."""
    import xml.etree.ElementTree as ET
    out = []
    if not os.path.exists(path):
        return out
    pat = re.compile(r"^ {4}((?:host cost per call|first call): .*)$", re.M)
    for case in ET.parse(path).getroot().iter("testcase"):
        text = "".join(e.text or "" for e in case.iter("system-out"))
        for m in pat.finditer(text):
            out.append((case.get("name", ""), m.group(1).strip().replace("|", "\\|")))
    return out


def measurements_section(path):
    rows = printed_measurements(path)
    if not rows:
        return []
    lines = ["## Measurements printed by the tests\n", "| test | measurement |", "|---|---|"]
    lines += [f"| `{name}` | {text} |" for name, text in sorted(rows)]
    return lines + [""]


def clock_summary(path):
    """"min / median / max MHz over N samples" of the SM clock sampled while the GPU work ran
    (gpu_report.sh samples every 500 ms), or "" when there are no samples."""
    if not os.path.exists(path):
        return ""
    mhz = []
    for line in open(path, errors="replace"):
        m = re.match(r"\s*(\d+)\s*(MHz)?\s*$", line)
        if m:
            mhz.append(int(m.group(1)))
    if not mhz:
        return ""
    mhz.sort()
    return f"{mhz[0]} / {mhz[len(mhz) // 2]} / {mhz[-1]} MHz (min / median / max of {len(mhz)} samples)"


def main():
    ap = argparse.ArgumentParser()
    for a in ("logs", "out", "slug", "gpu", "commit", "ctest-rc"):
        ap.add_argument("--" + a, required=True)
    args = ap.parse_args()
    logs = args.logs
    tests = parse_ctest(os.path.join(logs, "ctest.log"))
    count = {}
    for _, r in tests:
        count[r] = count.get(r, 0) + 1
    failed = [n for n, r in tests if r not in ("Passed", "Skipped")]
    skipped = [n for n, r in tests if r == "Skipped"]
    clocks = sh("nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,driver_version --format=csv,noheader")
    lines = []
    lines.append(f"# GPU results: {args.gpu}\n")
    lines.append(f"- commit: `{args.commit}`")
    lines.append(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    lines.append(f"- GPU: {args.gpu}; SM clock now, max SM clock, memory clock, driver: {clocks}")
    running = clock_summary(os.path.join(logs, "clocks.txt"))
    if running:
        lines.append(f"- SM clock while the tests, sanitizer and ladder ran: {running}")
    lines.append(f"- CUDA: {sh('nvcc --version | tail -1')}")
    lines.append("- produced by `scripts/gpu_report.sh` (build, all tests, compute-sanitizer, ladder)\n")
    lines.append("## Tests\n")
    lines.append(f"{len(tests)} ctest cases: " + ", ".join(f"{v} {k.lower()}" for k, v in sorted(count.items())) +
                 f" (ctest exit code {args.ctest_rc}).\n")
    if failed:
        lines.append("Failed: " + ", ".join(f"`{n}`" for n in failed) + "\n")
    if skipped:
        lines.append("Skipped: " + ", ".join(f"`{n}`" for n in skipped[:50]) + "\n")
    per_step = {}
    for n, r in tests:
        m = re.match(r"step(\d\d)\.(?!registered$)", n)
        if m:
            d = per_step.setdefault(m.group(1), {})
            d[r] = d.get(r, 0) + 1
    if per_step:
        lines.append("| step | GPU suite cases | passed | failed | skipped |")
        lines.append("|---|---|---|---|---|")
        for s, d in sorted(per_step.items()):
            tot = sum(d.values())
            nf = tot - d.get("Passed", 0) - d.get("Skipped", 0)
            lines.append(f"| {s} | {tot} | {d.get('Passed', 0)} | {nf} | {d.get('Skipped', 0)} |")
        lines.append("")
    lines.append("## Bug catalog mutants\n")
    lines.append("A mutant is killed when its regression test fails on the build with the bug injected.\n")
    symptoms = mutant_symptoms(os.path.join(logs, "ctest.xml"))
    lines.append("| mutant | result | how the regression test failed (first message) |")
    lines.append("|---|---|---|")
    for n, r in sorted(tests):
        if n.startswith("bug."):
            verdict, text = symptoms.get(n, ("", ""))
            res = {"Passed": "killed", "Failed": "**SURVIVED**", "Skipped": "not run (skipped)"}.get(r, r)
            if r == "Failed" and verdict in ("CRASHED", "ERROR"):
                res = f"**{verdict}**"
            lines.append(f"| `{n[4:]}` | {res} | {text} |")
    lines.append("")
    lines += measurements_section(os.path.join(logs, "ctest.xml"))
    san = os.path.join(logs, "sanitizer.csv")
    if os.path.exists(san):
        rows = list(csv.DictReader(open(san)))
        if rows:
            lines.append("## compute-sanitizer (B=1, H=2, H_kv=1, N_q=77, N_kv=131, D=64)\n")
            lines.append("| step | tool | result | errors |")
            lines.append("|---|---|---|---|")
            for r in rows:
                lines.append(f"| {r['step']} | {r['tool']} | {r['result']} | {r['errors']} |")
            lines.append("")
    csv_rows = []
    for d in ("d64", "d128"):
        md = os.path.join(logs, f"ladder_{d}.md")
        if os.path.exists(md):
            lines.append(f"## Ladder, D={d[1:]}\n")
            lines.append(open(md).read().strip() + "\n")
        c = os.path.join(logs, f"ladder_{d}.csv")
        if os.path.exists(c):
            csv_rows += list(csv.DictReader(open(c)))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.slug}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if csv_rows:
        with open(os.path.join(args.out, f"{args.slug}.csv"), "w", newline="") as f:
            fields = ["commit", "gpu"] + list(csv_rows[0].keys())
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for r in csv_rows:
                w.writerow({"commit": args.commit, "gpu": args.gpu, **r})
    print(f"wrote {args.out}/{args.slug}.md")


if __name__ == "__main__":
    main()
