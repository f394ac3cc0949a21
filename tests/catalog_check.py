#!/usr/bin/env python3
"""Keeps docs/bug_catalog.md honest (a CPU test, run by ctest as `catalog`).

- every entry names a test and a patch (or says why there is none);
- every patch it names exists in tests/bugs/, and every patch in tests/bugs/ is in the catalog;
- a patch's `Catalog:` header is the id of the entry that lists it;
- a patch's `Test:` filter selects at least one test of that step's test program (listed with
  --gtest_list_tests, so no GPU is needed), and the entry's test field mentions that filter;
- the catalog holds every entry the course promises (REQUIRED below).
"""
import argparse
import glob
import os
import re
import subprocess
import sys

REQUIRED = [
    # seed correctness bugs #1-#10 and performance bugs #1-#4
    "fp32-state", "scale-placement", "mask-zero", "causal-direction", "update-order", "p-not-cast",
    "head-dim-not-pow2", "fully-masked-nan", "stride-confusion", "stale-autotune-cache",
    "perf-too-many-warps", "perf-too-many-stages", "perf-spills", "perf-alignment-hints",
    # the second seed's failure modes
    "no-alpha-rescale", "mask-after-max", "k-boundary-zero", "gqa-head-stride", "fp16-state",
    "grid-ordering", "block-kv-below-16",
    # what users of attention kernels report
    "n-smaller-than-tile", "causal-alignment", "offset-overflow-32bit", "missing-barrier",
    # the course's own
    "no-max-subtraction", "batch-head-swapped", "ragged-store", "lse-is-m",
]


def parse_catalog(path):
    entries = {}
    cur = None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^###\s+`([a-z0-9-]+)`", line)
        if m:
            cur = {"id": m.group(1), "test": "", "patch": ""}
            entries[cur["id"]] = cur
            continue
        if cur is None:
            continue
        m = re.match(r"^- \*\*(Test|Patch):?\*\*:?\s*(.*)$", line.strip())
        if m:
            cur[m.group(1).lower()] = m.group(2)
    return entries


def patch_header(path):
    head = {}
    for line in open(path, encoding="utf-8"):
        if line.startswith("--- "):
            break
        m = re.match(r"^(\w+):\s*(.*)$", line)
        if m:
            head[m.group(1)] = m.group(2).strip()
    return head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--build", required=True)
    args = ap.parse_args()
    errors = []
    cat_path = os.path.join(args.repo, "docs", "bug_catalog.md")
    entries = parse_catalog(cat_path)
    for rid in REQUIRED:
        if rid not in entries:
            errors.append(f"catalog lacks the entry `{rid}`")
    listed = {}
    for e in entries.values():
        if not e["test"]:
            errors.append(f"entry `{e['id']}` names no test")
        if not e["patch"]:
            errors.append(f"entry `{e['id']}` names no patch (write 'none — <why>' if there cannot be one)")
        for p in re.findall(r"tests/bugs/([\w.-]+\.patch)", e["patch"]):
            listed.setdefault(p, []).append(e["id"])
    patches = sorted(os.path.basename(p) for p in glob.glob(os.path.join(args.repo, "tests", "bugs", "*.patch")))
    for p in patches:
        if p not in listed:
            errors.append(f"tests/bugs/{p} is not in the catalog")
    for p, ids in listed.items():
        path = os.path.join(args.repo, "tests", "bugs", p)
        if not os.path.exists(path):
            errors.append(f"catalog entry `{ids[0]}` names tests/bugs/{p}, which does not exist")
            continue
        head = patch_header(path)
        if head.get("Catalog") not in ids:
            errors.append(f"tests/bugs/{p}: header 'Catalog: {head.get('Catalog')}' but it is listed under {ids}")
        filt = head.get("Test")
        if filt:
            for i in ids:
                if filt not in entries[i]["test"]:
                    errors.append(f"entry `{i}`: its test field does not mention the filter `{filt}` of {p}")
            exe = os.path.join(args.build, f"fa_test_step{p[:2]}")
            if not os.path.exists(exe):
                errors.append(f"{p}: no test program {exe}")
                continue
            extra = head.get("Args", "").split()
            out = subprocess.run([exe, *extra, "--gtest_list_tests", f"--gtest_filter={filt}"], capture_output=True,
                                 text=True).stdout
            names = [l for l in out.splitlines() if l.startswith("  ")]
            if not names:
                errors.append(f"{p}: the filter `{filt}` selects no test of fa_test_step{p[:2]}")
            else:
                print(f"ok  {p}: `{filt}` selects {len(names)} test(s)")
        elif "Static" not in head:
            errors.append(f"{p}: header has neither 'Test:' nor 'Static:'")
        else:
            print(f"ok  {p}: static check")
    print(f"{len(entries)} catalog entries, {len(patches)} patches")
    for e in errors:
        print("ERROR:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
