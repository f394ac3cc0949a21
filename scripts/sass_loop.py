#!/usr/bin/env python3
"""The instructions of a kernel's main loop, read from its SASS, by class and by source line.

    scripts/sass_loop.py FILE.cubin KERNEL_REGEX [--innermost] [--by-line N] [--max-body N] [--max-class CLASS=N ...]

FILE is a cubin (or an object with one; cuobjdump extracts it) or nvdisasm's text. The kernel is the
first function whose mangled name matches KERNEL_REGEX. Its main loop is the backward branch whose
body holds the most HGMMA (tensor) instructions, the shortest such body (a branch back over the
whole kernel, such as a warp-specialised kernel's cold retry of an mbarrier wait, holds as many),
or, without any HGMMA, the most instructions. Every
instruction of the body is counted once, whichever path runs it: a per-item budget of issue slots
for one thread, as the lessons use it (steps 26 and 33).

Compile with -lineinfo for --by-line: each instruction is charged to the innermost source line the
line table gives it, and the N lines with the most integer instructions are listed.

--innermost takes the shortest loop with tensor instructions instead: in a persistent kernel (the
Hopper forward) the default finds the loop over work tiles, its first KV tile, the epilogue and one
pass of the KV loop together; --innermost finds the KV loop, one tile a pass.

--max-body N and --max-class integer=N make it a check: exit 1 when the body, or a class of it, holds
more (the lesson's claim as a test that can fail).
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

CLASSES = [
    ("tensor", ("HGMMA", "WARPGROUP", "HMMA")),
    ("memory", ("LDS", "STS", "LDG", "STG", "LDGSTS", "REDG", "RED", "ATOMG", "ATOMS", "ATOM", "LDSM", "STSM",
                "UTMA", "UBLKCP", "SYNCS", "LDGDEPBAR", "LD", "ST")),
    ("float", ("FMUL", "FFMA", "FADD", "FSEL", "FMNMX", "MUFU", "F2FP", "FSETP", "FCHK", "F2F", "FSET", "HADD2",
               "HMUL2", "HFMA2")),
    ("sync/control", ("BAR", "BRA", "BSSY", "BSYNC", "WARPSYNC", "DEPBAR", "EXIT", "CALL", "RET", "NOP", "YIELD",
                      "MEMBAR", "FENCE", "ACQBULK", "ELECT", "VOTE", "VOTEU", "ERRBAR", "CCTL")),
]


def classify(op):
    base = op.split(".")[0]
    for name, prefixes in CLASSES:
        if base in prefixes:
            return name
    return "integer"  # integer, address, predicate, moves and conversions, uniform datapath


TOOL_DIR = None  # --cuobjdump's folder, where nvdisasm lies too


def find_tool(name):
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (TOOL_DIR and os.path.join(TOOL_DIR, name), shutil.which(name), os.path.join(here, "..", ".deps", "cuobjdump", "nvidia", "cu13", "bin", name)):
        if p and os.path.exists(p):
            return p
    nvcc = shutil.which("nvcc")
    if nvcc and os.path.exists(os.path.join(os.path.dirname(nvcc), name)):
        return os.path.join(os.path.dirname(nvcc), name)
    sys.exit(f"sass_loop: {name} not found (scripts/install_deps.sh installs it)")


def disassemble(path):
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        return open(path, encoding="utf-8", errors="replace").read()
    out = subprocess.run([find_tool("nvdisasm"), "--print-line-info", path], capture_output=True, text=True)
    if out.returncode == 0:
        return out.stdout
    # Not a bare cubin (an object or executable): extract its sm_90 cubins first.
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([find_tool("cuobjdump"), "-xelf", "all", os.path.abspath(path)], cwd=tmp, check=True,
                       capture_output=True)
        texts = []
        for name in sorted(os.listdir(tmp)):
            r = subprocess.run([find_tool("nvdisasm"), "--print-line-info", os.path.join(tmp, name)],
                               capture_output=True, text=True)
            if r.returncode == 0:
                texts.append(r.stdout)
        return "\n".join(texts)


ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def short_path(path):
    path = os.path.normpath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LINE = re.compile(r'//## File "([^"]+)", line (\d+)(.*)')
LABEL = re.compile(r"^(\.L_x_\d+):")


def parse_function(text, kernel_regex):
    lines = text.splitlines()
    start = None
    pat = re.compile(kernel_regex)
    for i, l in enumerate(lines):
        m = re.match(r"^\.text\.(\S+):", l)
        if m and pat.search(m.group(1)):
            start, name = i, m.group(1)
            break
    if start is None:
        sys.exit(f"sass_loop: no kernel matches {kernel_regex!r}")
    instrs, labels, where = [], {}, None
    for l in lines[start + 1:]:
        if re.match(r"^\.text\.", l) or re.match(r"^\s*\.section", l):
            break
        lm = LINE.search(l)
        if lm:
            where = (short_path(lm.group(1)), int(lm.group(2)))
            continue
        m = LABEL.match(l.strip())
        if m:
            labels[m.group(1)] = len(instrs)
            continue
        m = INSTR.search(l)
        if m:
            instrs.append({"addr": int(m.group(1), 16), "op": m.group(3), "args": m.group(4), "where": where})
    return name, instrs, labels


def main_loop(instrs, labels, innermost=False):
    best = None
    for j, ins in enumerate(instrs):
        if not ins["op"].startswith("BRA"):
            continue
        m = re.search(r"\(\s*(\.L_x_\d+)\s*\)", ins["args"])
        if not m or m.group(1) not in labels:
            continue
        i = labels[m.group(1)]
        if i > j:
            continue
        body = instrs[i:j + 1]
        tensor = sum(classify(x["op"]) == "tensor" for x in body)
        if innermost:  # the shortest loop with tensor work, else the longest loop
            key = (tensor > 0, -len(body) if tensor else len(body))
        else:
            key = (tensor, -len(body) if tensor else len(body))
        if best is None or key > best[0]:
            best = (key, i, j)
    if best is None:
        sys.exit("sass_loop: the kernel has no loop")
    return best[1], best[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("kernel")
    ap.add_argument("--by-line", type=int, default=0, metavar="N")
    ap.add_argument("--max-body", type=int, default=None)
    ap.add_argument("--max-class", action="append", default=[], metavar="CLASS=N")
    ap.add_argument("--innermost", action="store_true",
                    help="the shortest loop with tensor instructions (a persistent kernel's KV loop, inside "
                    "the loop over work tiles that the default picks)")
    ap.add_argument("--cuobjdump", default=None, help="the cuobjdump to use (nvdisasm from its folder)")
    a = ap.parse_args()
    if a.cuobjdump:
        global TOOL_DIR
        TOOL_DIR = os.path.dirname(os.path.abspath(a.cuobjdump))
    name, instrs, labels = parse_function(disassemble(a.file), a.kernel)
    i, j = main_loop(instrs, labels, a.innermost)
    body = instrs[i:j + 1]
    counts = collections.Counter(classify(x["op"]) for x in body)
    print(f"kernel {name}")
    print(f"main loop: {len(body)} instructions per thread and iteration (SASS offsets "
          f"{body[0]['addr']:#x}-{body[-1]['addr']:#x})")
    for cls in ("integer", "float", "memory", "sync/control", "tensor"):
        print(f"  {cls:13s} {counts[cls]:5d}  {100.0 * counts[cls] / len(body):5.1f} %")
    if a.by_line:
        per = collections.Counter(x["where"] for x in body if classify(x["op"]) == "integer")
        print(f"integer instructions by source line (top {a.by_line}):")
        for (where, n) in per.most_common(a.by_line):
            print(f"  {n:5d}  {where[0]}:{where[1]}" if where else f"  {n:5d}  (no line info)")
    failed = []
    if a.max_body is not None and len(body) > a.max_body:
        failed.append(f"the loop body holds {len(body)} instructions, more than {a.max_body}")
    for spec in a.max_class:
        cls, n = spec.split("=")
        if counts[cls] > int(n):
            failed.append(f"the loop body holds {counts[cls]} {cls} instructions, more than {n}")
    for f in failed:
        print("FAIL: " + f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
