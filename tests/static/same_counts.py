#!/usr/bin/env python3
"""A production kernel against the step it generalises, configuration by configuration: the same
count of each named instruction (tensor-core, ldmatrix, cp.async, exp2) in the SASS of every
(architecture, head dim, Config) both objects compile. The policies are free only if this holds.

  same_counts.py --cuobjdump PATH --kernel OBJ --step OBJ [--ins HMMA LDSM LDGSTS MUFU.EX2] [--head-dims 64 128]
                 [--family forward|backward] [--skip REGEX] [--only REGEX] [--kernel-only REGEX]

Kernels are matched by their template arguments `attention_kernel<HEAD_DIM, Config<...>, ...>`
(--family backward: `backward_kernel<HEAD_DIM, BwdConfig<...>, DETERMINISTIC, ...>`, BwdConfig's integer
arguments whatever their number: <BLOCK_M, BLOCK_N> on mma.sync, <HEAD_DIM> on Hopper);
a configuration one object has and the other lacks is a failure too. --head-dims: compare only those (the
head dims the build compiles the production kernels for, FA_HEAD_DIMS). --skip: the kernel object's
functions whose names match are left out (instantiations the step has no counterpart for, such as
the Hopper forward's for packed sequences: kernels/sequences.h). --only: in both objects, keep only
the functions whose names match (a production kernel that takes one step's way in some
configurations and another step's in the rest: kernels/bwd_hopper.cu). --kernel-only: in the kernel
object alone, keep only the functions whose names match (the production forwards' fp16
instantiations, __half in their names, against the step's bf16 kernels: the same counts).
Exit 1 with a table of every difference."""
import argparse
import collections
import re
import subprocess
import sys

KEY_RE = {
    "forward": re.compile(r"attention_kernelILi(\d+)E.*?ConfigILi(-?\d+)ELi(-?\d+)ELi(-?\d+)E"),
    "backward": re.compile(r"backward_kernelILi(\d+)E.*?BwdConfigI((?:Li\d+E)+)EELb([01])E"),
}


def config_key(family, m):
    """The configuration's integers (and, backward, the deterministic flag last)."""
    if family == "backward":
        return tuple(int(x) for x in re.findall(r"Li(\d+)E", m.group(2))) + (int(m.group(3)),)
    return tuple(int(g) for g in m.groups()[1:])


def counts(cuobjdump, obj, names, family="forward", skip=None, only=None, kernel_only=None):
    out = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, check=True).stdout
    table = collections.defaultdict(collections.Counter)
    arch = key = None
    for line in out.splitlines():
        if "arch = " in line:
            arch = line.split("arch = ")[1].strip()
        elif "Function : " in line:
            m = KEY_RE[family].search(line)
            key = (arch, int(m.group(1)), config_key(family, m)) if m else None
            if skip and re.search(skip, line):
                key = None
            if only and not re.search(only, line):
                key = None
            if kernel_only and not re.search(kernel_only, line):
                key = None
        elif key is not None:
            for n in names:
                if re.search(r"\b" + re.escape(n) + r"\b", line):
                    table[key][n] += 1
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--step", required=True)
    ap.add_argument("--ins", nargs="+", default=["HMMA", "LDSM", "LDGSTS", "MUFU.EX2"])
    ap.add_argument("--head-dims", nargs="+", type=int)
    ap.add_argument("--family", choices=sorted(KEY_RE), default="forward")
    ap.add_argument("--skip", help="leave out the kernel object's functions whose names match")
    ap.add_argument("--only", help="in both objects, keep only the functions whose names match")
    ap.add_argument("--kernel-only", help="in the kernel object alone, keep only the functions whose names match")
    a = ap.parse_args()
    k = counts(a.cuobjdump, a.kernel, a.ins, a.family, a.skip, a.only, a.kernel_only)
    s = counts(a.cuobjdump, a.step, a.ins, a.family, None, a.only)
    if a.head_dims:  # both sides: a production kernel has head dims no step has (kernel 100's Part VI ones)
        s = {key: v for key, v in s.items() if key[1] in a.head_dims}
        k = {key: v for key, v in k.items() if key[1] in a.head_dims}
    if not k or not s:
        print(f"no {a.family} kernel with its configuration found ({len(k)} in the kernel, {len(s)} in the step)")
        return 1
    bad = 0
    for key in sorted(set(k) | set(s)):
        line = f"{key[0]} D={key[1]} Config<{','.join(map(str, key[2]))}>: " + " ".join(
            f"{n} {k[key][n] if key in k else '-'}/{s[key][n] if key in s else '-'}" for n in a.ins)
        same = key in k and key in s and all(k[key][n] == s[key][n] for n in a.ins)
        bad += not same
        print(("same   " if same else "DIFFER ") + line)
    print(f"{len(set(k) | set(s))} configurations, {bad} differ (counts: kernel/step)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
