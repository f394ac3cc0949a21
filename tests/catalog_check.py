#!/usr/bin/env python3
"""Keeps docs/bug_catalog.md honest (a CPU test, run by ctest as `catalog`).

- every entry names a test and a patch (or says why there is none);
- every patch it names exists as steps/NN_name/bugs/<bug>.patch, and every such patch is in the
  catalog;
- a patch's `Catalog:` header is the id of the entry that lists it, and its diff is against its
  own step's attention.cu;
- a patch's `Test:` filter selects at least one test of that step's test program (listed with
  --gtest_list_tests, so no GPU is needed), and the entry's test field mentions that filter;
- every file path the catalog quotes (`steps/...`, `tests/...`, ...) exists;
- the catalog holds every entry the course promises (REQUIRED below).

`--selftest` runs the check on a copy of the repository, then on copies with an entry and a patch
made to disagree (and similar breakages), and fails unless each broken copy gets an error that the
unchanged copy does not have.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

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
    "no-max-subtraction", "batch-head-swapped", "ragged-store", "lse-is-m", "kv-tail-not-zeroed",
    # Part II
    "row-tile-offset", "lazy-rescale-stale-state", "grid-y-limit",
    # Part III
    "wgmma-read-before-wait", "missing-proxy-fence", "mbarrier-phase-parity",
    "producer-overwrites-stage", "setmaxnreg-ignored", "consumer-releases-early",
    # Part V
    "combine-without-empty-guard", "paged-lookup-one-tile-behind", "varlen-load-past-sequence",
    "append-past-seqlens",
    # Part VI
    "window-left-edge", "window-right-edge", "softcap-outside-scale", "softcap-derivative-missing",
    "sink-without-rescale", "sink-once-per-split", "alibi-row-part-dropped", "decode-window-start-unmasked",
]

PATCH_RE = re.compile(r"steps/(\d\d)_\w+/bugs/[\w-]+\.patch|kernels/bugs/[\w-]+\.patch")
# Paths the catalog may quote; anything in backticks that starts with one of these must exist.
QUOTED_PATH_RE = re.compile(r"`((?:steps|tests|device|kernels|library|harness|reference|include|tools|scripts|docs|capi)/[^`\s]+)`")


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
    target = None
    for line in open(path, encoding="utf-8"):
        if line.startswith("--- "):
            target = line[4:].split("\t")[0].strip()
            break
        m = re.match(r"^(\w+):\s*(.*)$", line)
        if m:
            head[m.group(1)] = m.group(2).strip()
    return head, target


def check(repo, build):
    """The catalog's errors (a list of strings); with build=None the test programs are not asked."""
    errors = []
    cat_path = os.path.join(repo, "docs", "bug_catalog.md")
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
        for m in PATCH_RE.finditer(e["patch"]):
            listed.setdefault(m.group(0), []).append(e["id"])
    text = open(cat_path, encoding="utf-8").read()
    for n, line in enumerate(text.splitlines(), 1):
        for m in QUOTED_PATH_RE.finditer(line):
            if re.search(r"[<*]|\bNN", m.group(1)):  # a pattern such as steps/NN_name/bugs/<bug>.patch
                continue
            if not os.path.exists(os.path.join(repo, m.group(1))):
                errors.append(f"docs/bug_catalog.md:{n}: `{m.group(1)}` does not exist")
    patches = sorted(os.path.relpath(p, repo).replace(os.sep, "/")
                     for p in glob.glob(os.path.join(repo, "steps", "[0-9][0-9]_*", "bugs", "*.patch")) +
                     glob.glob(os.path.join(repo, "kernels", "bugs", "*.patch")))
    for p in patches:
        if p not in listed:
            errors.append(f"{p} is not in the catalog")
    for p, ids in sorted(listed.items()):
        path = os.path.join(repo, p)
        if not os.path.exists(path):
            errors.append(f"catalog entry `{ids[0]}` names {p}, which does not exist")
            continue
        head, target = patch_header(path)
        step_dir = p.split("/bugs/")[0]
        kernel = head.get("Kernel") if step_dir == "kernels" else None
        if step_dir == "kernels":  # a production kernel's mutant: any file of kernels/, its test program's
            if not (target or "").startswith("a/kernels/") or not os.path.exists(os.path.join(repo, target[2:])):
                errors.append(f"{p}: the diff is against '{target}', not a file a/kernels/<file> of the repository")
            if kernel not in ("mma", "hopper"):
                errors.append(f"{p}: header 'Kernel: {kernel}': a kernel mutant names mma or hopper")
                continue
        elif target != f"a/{step_dir}/attention.cu":
            errors.append(f"{p}: the diff is against '{target}', not a/{step_dir}/attention.cu")
        if head.get("Catalog") not in ids:
            errors.append(f"{p}: header 'Catalog: {head.get('Catalog')}' but it is listed under {ids}")
        if head.get("Symptom", "fault") not in ("fault", "hang"):
            errors.append(f"{p}: 'Symptom: {head['Symptom']}': the symptoms a header can declare are 'fault' and 'hang'")
        nn = PATCH_RE.match(p).group(1)
        program = f"fa_test_kernel_{kernel}" if kernel else f"fa_test_step{nn}"
        filt = head.get("Test")
        if filt:
            for i in ids:
                if filt not in entries[i]["test"]:
                    errors.append(f"entry `{i}`: its test field does not mention the filter `{filt}` of {p}")
            if build is None:
                continue
            exe = os.path.join(build, program)
            if not os.path.exists(exe):
                errors.append(f"{p}: no test program {exe}")
                continue
            extra = head.get("Args", "").split()
            out = subprocess.run([exe, *extra, "--gtest_list_tests", f"--gtest_filter={filt}"], capture_output=True,
                                 text=True).stdout
            names = [line for line in out.splitlines() if line.startswith("  ")]
            if not names:
                errors.append(f"{p}: the filter `{filt}` selects no test of {program}")
            else:
                print(f"ok  {p}: `{filt}` selects {len(names)} test(s)")
        elif "Static" not in head:
            errors.append(f"{p}: header has neither 'Test:' nor 'Static:'")
        else:
            print(f"ok  {p}: static check")
    print(f"{len(entries)} catalog entries, {len(patches)} patches")
    return errors


def selftest(repo):
    """The check passes on a copy of the repository and fails on each of a few broken copies."""
    def copy():
        d = tempfile.mkdtemp(prefix="catalog_selftest_")
        for top in ("docs", "steps", "tests", "device", "library", "harness", "reference", "include", "tools",
                    "scripts", "capi"):
            src = os.path.join(repo, top)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(d, top), ignore=shutil.ignore_patterns("__pycache__", "results"))
        return d

    def first_patch(d):
        return sorted(glob.glob(os.path.join(d, "steps", "[0-9][0-9]_*", "bugs", "*.patch")))[0]

    def rewrite(path, old, new):
        text = open(path, encoding="utf-8").read()
        assert old in text, f"{old!r} not in {path}"
        open(path, "w", encoding="utf-8").write(text.replace(old, new, 1))

    def wrong_catalog_header(d):
        p = first_patch(d)
        head, _ = patch_header(p)
        rewrite(p, f"Catalog: {head['Catalog']}", "Catalog: no-such-entry")

    def entry_names_missing_patch(d):
        p = os.path.relpath(first_patch(d), d).replace(os.sep, "/")
        rewrite(os.path.join(d, "docs", "bug_catalog.md"), p, p.replace(".patch", "_renamed.patch"))

    def patch_not_in_catalog(d):
        p = first_patch(d)
        shutil.copy(p, p.replace(".patch", "_copy.patch"))

    def filter_not_in_entry(d):
        for p in sorted(glob.glob(os.path.join(d, "steps", "[0-9][0-9]_*", "bugs", "*.patch"))):
            head, _ = patch_header(p)
            if "Test" in head:
                rewrite(p, f"Test: {head['Test']}", "Test: NoSuchSuite.*")
                return
        raise AssertionError("no patch with a Test: header")

    def diff_against_another_step(d):
        p = first_patch(d)
        _, target = patch_header(p)
        rewrite(p, f"--- {target}", "--- a/steps/99_elsewhere/attention.cu")

    def stale_path(d):
        rewrite(os.path.join(d, "docs", "bug_catalog.md"), "## The course's own",
                "See `tests/bugs/00-no_max_subtraction.patch`.\n\n## The course's own")

    # The errors the unchanged copy has already (the `catalog` test reports those) do not count:
    # each breakage must add one of its own.
    d = copy()
    try:
        baseline = set(check(d, None))
    finally:
        shutil.rmtree(d)
    status = 0
    for breakage in (wrong_catalog_header, entry_names_missing_patch, patch_not_in_catalog, filter_not_in_entry,
                     diff_against_another_step, stale_path):
        d = copy()
        try:
            breakage(d)
            new = [e for e in check(d, None) if e not in baseline]
            if new:
                print(f"selftest ok: {breakage.__name__}: {new[0]}")
            else:
                print(f"SELFTEST FAIL: {breakage.__name__}: the check found nothing wrong with the broken catalog")
                status = 1
        finally:
            shutil.rmtree(d)
    return status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--build", help="the build folder, whose fa_test_stepNN programs list the test names")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.selftest:
        return selftest(args.repo)
    if not args.build:
        ap.error("--build is required (except with --selftest)")
    errors = check(args.repo, args.build)
    for e in errors:
        print("ERROR:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
