#!/usr/bin/env python3
"""The device layer's symbols a step uses that its base does not (and the ones it stops using):
scripts/diff_steps.sh prints them after the diff, so that a lesson's new building blocks are named.

  device_symbols.py A/attention.cu B/attention.cu

A symbol is a name the device layer (device/, its ptx/ wrappers) declares: a struct or class, an
alias, a constant, a function or function template. A step uses one when the name appears in its
attention.cu as a word (comments excluded)."""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECL = [
    re.compile(r"\b(?:struct|class)\s+(\w+)"),
    re.compile(r"\busing\s+(\w+)\s*="),
    re.compile(r"\bconstexpr\s+[\w:<>]+\s+(\w+)\s*="),
    # a function: FA_HD / __device__ ... name( at the start of a declaration line
    re.compile(r"^(?:FA_HD|__device__|__host__|inline)[^;{=()]*?\b(\w+)\s*\(", re.M),
]
KEYWORDS = {"operator", "if", "for", "while", "return", "sizeof", "static_cast", "reinterpret_cast"}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def device_symbols():
    names = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "device", "**", "*.h"), recursive=True)):
        text = strip_comments(open(path).read())
        rel = os.path.relpath(path, ROOT)
        for rx in DECL:
            for m in rx.finditer(text):
                if m.group(1) not in KEYWORDS and not m.group(1).startswith("FA_"):
                    names.setdefault(m.group(1), rel)
    return names


def used(path, names):
    words = set(re.findall(r"\b\w+\b", strip_comments(open(path).read())))
    return {n for n in names if n in words}


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    names = device_symbols()
    a, b = used(sys.argv[1], names), used(sys.argv[2], names)
    for title, group in (("newly used", sorted(b - a)), ("no longer used", sorted(a - b))):
        print(f"=== device layer, {title}: " + (", ".join(f"{n} ({names[n]})" for n in group) if group else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
