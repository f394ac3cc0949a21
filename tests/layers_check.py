#!/usr/bin/env python3
"""The layers of the repository, checked (ctest: `layers`; `layers_selftest` checks the checker).

Bottom up, each layer may include from the layers listed for it and from nothing above:

  include/fa  the public API                  include/fa
  device      header-only kernel pieces       include/fa, device
  library     host code the library ships     include/fa, device, library
  kernels     the production kernels          include/fa, device, library, kernels
  reference   the fp64 / fp32 references      include/fa, device, reference
  harness     problems, checks, timing, CLI   include/fa, device, library, reference, harness
  steps       steps/NN_name/ (the lessons)    include/fa, device, library, and its own folder
  capi        the C interface                 include/fa, library, kernels, capi
  tools       fa2                             everything but tests/
  tests       tests/ and steps/NN_name/tests  everything but tools/

The lessons never include the production kernels (kernels/): a step's diff against its base must
show its one idea, not a change in a shared kernel. A step that included the harness could not ship in the library without it, and a reference that
used library code would be checked against itself. The same rules hold for what the CMake targets
link: fa_device, fa_library, fa_reference, the steps (fa_stepNN, the mutants) and fa2_capi must
not link a library above them (fa_harness above all).

Every violation is printed as file:line: what it includes (or links) and the rule it breaks.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

SCANNED = ("include", "device", "library", "kernels", "reference", "harness", "steps", "tools", "tests", "capi")
SOURCE_EXT = (".h", ".hpp", ".cuh", ".cpp", ".cc", ".cu")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')

ALL = {"include/fa", "device", "library", "kernels", "reference", "harness", "steps", "capi", "tools", "tests"}
ALLOWED = {
    "include/fa": {"include/fa"},
    "device": {"include/fa", "device"},
    "library": {"include/fa", "device", "library"},
    "kernels": {"include/fa", "device", "library", "kernels"},
    "reference": {"include/fa", "device", "reference"},
    "harness": {"include/fa", "device", "library", "reference", "harness"},
    "steps": {"include/fa", "device", "library"},  # plus its own folder, see allowed()
    "capi": {"include/fa", "library", "kernels", "capi"},
    "tools": ALL - {"tests"},
    "tests": ALL - {"tools"},
}

# The CMake targets of each layer, and the project libraries each may link.
TARGET_LAYERS = [
    (re.compile(r"^fa_device$"), "device"),
    (re.compile(r"^fa_library$"), "library"),
    (re.compile(r"^fa_reference$"), "reference"),
    (re.compile(r"^fa_step(\d\d|\$\{nn\})$"), "steps"),
    (re.compile(r"^fa_(mutant|experiment|\$\{kind\})_obj_"), "steps"),  # patched copies of a step
    (re.compile(r"^fa2_capi$"), "capi"),
    (re.compile(r"^fa_kernel_(\w+|\$\{name\})$"), "kernels"),
]
LIBRARY_LAYERS = {"fa_device": "device", "fa_library": "library", "fa_reference": "reference", "fa_kernel_mma": "kernels",
                  "fa_kernel_hopper": "kernels",
                  "fa_harness": "harness", "fa_gpu_suite": "tests"}


def layer_of(rel):
    """(layer, unit) of a repository-relative path; unit tells two steps apart. None outside them."""
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) > 1 and parts[1] == "fa":
        return "include/fa", None
    if parts[0] == "steps" and len(parts) > 2:
        if parts[2] == "tests":
            return "tests", None
        return "steps", parts[1]
    if parts[0] in ALL:
        return parts[0], None
    return None, None


def resolve(root, including, name):
    """The repository-relative path an include names: next to the including file, else from the
    root or include/ (the two include directories of the build). A header that does not exist
    (yet) is placed by its first path component."""
    here = os.path.dirname(including)
    for base in (here, "", "include"):
        cand = os.path.normpath(os.path.join(base, name)).replace(os.sep, "/")
        if not cand.startswith("..") and os.path.isfile(os.path.join(root, cand)):
            return cand
    if name.startswith("fa/"):
        return "include/" + name
    return name


def allowed(layer, unit, target_layer, target_unit):
    if target_layer in ALLOWED[layer]:
        return True
    return layer == "steps" and target_layer == "steps" and unit == target_unit


def rule(layer):
    if layer == "steps":
        return "a step may include only include/fa, device, library and its own folder"
    return f"{layer} may include only " + ", ".join(sorted(ALLOWED[layer]))


def check_includes(root):
    errors = []
    for top in SCANNED:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fn in sorted(filenames):
                if not fn.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                layer, unit = layer_of(rel)
                if layer is None:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE_RE.match(line)
                        if not m:
                            continue
                        target = resolve(root, rel, m.group(1))
                        tlayer, tunit = layer_of(target)
                        if tlayer is None:
                            errors.append(f'{rel}:{n}: includes "{m.group(1)}", which is in no layer '
                                          f"(include it by its path from the repository root)")
                        elif not allowed(layer, unit, tlayer, tunit):
                            errors.append(f'{rel}:{n}: includes "{m.group(1)}" ({tlayer}): {rule(layer)}')
    return errors


def cmake_files(root):
    files = [os.path.join(root, "CMakeLists.txt")]
    for top in ("cmake", "tests", "steps"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            files += [os.path.join(dirpath, f) for f in sorted(filenames)
                      if f == "CMakeLists.txt" or f.endswith(".cmake")]
    return [f for f in files if os.path.isfile(f)]


def check_links(root):
    errors = []
    for path in cmake_files(root):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        text = open(path, encoding="utf-8", errors="replace").read()
        code = re.sub(r"#[^\n]*", "", text)  # comments out, line numbers kept
        # Simple variables (set(obj fa_mutant_obj_${nn}_${bug})), so that ${obj} names its target.
        variables = {m.group(1): m.group(2) for m in re.finditer(r"\bset\(\s*(\w+)\s+([^\s)]+)\s*\)", code)}
        for m in re.finditer(r"\btarget_link_libraries\(\s*([^\s)]+)([^)]*)\)", code):
            target = m.group(1)
            v = re.fullmatch(r"\$\{(\w+)\}", target)
            if v and v.group(1) in variables:
                target = variables[v.group(1)]
            layer = next((lay for pat, lay in TARGET_LAYERS if pat.search(target)), None)
            if layer is None:
                continue
            line = code.count("\n", 0, m.start()) + 1
            for lib in m.group(2).split():
                lib_layer = LIBRARY_LAYERS.get(lib)
                if lib_layer and lib_layer not in ALLOWED[layer]:
                    errors.append(f"{rel}:{line}: {m.group(1)} links {lib} ({lib_layer}): "
                                  f"{layer.replace('steps', 'a step')} may link only the layers "
                                  f"{', '.join(sorted(ALLOWED[layer]))}")
    return errors


def main_check(root):
    errors = check_includes(root) + check_links(root)
    for e in errors:
        print(e)
    print(f"layers: {len(errors)} violation(s)")
    return 1 if errors else 0


# ---- the checker's own test ------------------------------------------------------------------
GOOD_TREE = {
    "include/fa/params.h": "#pragma once\n",
    "include/fa/registry.h": '#include "fa/params.h"\n',
    "device/mask.h": '#include "fa/params.h"\n',
    "device/ptx/mma.h": '#include "device/mask.h"\n',
    "library/registry.cpp": '#include "fa/registry.h"\n#include "device/mask.h"\n#include "library/tuner.h"\n',
    "library/tuner.h": "#pragma once\n",
    "kernels/mask.h": '#include "device/mask.h"\n#include "library/tuner.h"\n',
    "reference/cpu_reference.cpp": '#include "device/mask.h"\n#include "reference/cpu_reference.h"\n',
    "reference/cpu_reference.h": '#include "fa/params.h"\n',
    "harness/check.cpp": '#include "reference/cpu_reference.h"\n#include "library/tuner.h"\n',
    "steps/03_grid/attention.cu": '#include "device/ptx/mma.h"\n#include "library/tuner.h"\n#include "kernel.h"\n',
    "steps/03_grid/kernel.h": '#include "device/mask.h"\n',
    "steps/04_next/kernel.h": '#include "device/mask.h"\n',
    "steps/03_grid/tests/grid_test.cpp": '#include "harness/check.h"\n#include "tests/gpu/suite.h"\n',
    "tests/gpu/suite.h": '#include "harness/check.h"\n',
    "tools/fa2.cpp": '#include "harness/check.h"\n#include "tools/commands.h"\n',
    "tools/commands.h": "#pragma once\n",
    "capi/c_api.cpp": '#include "fa/registry.h"\n#include "library/tuner.h"\n',
    "CMakeLists.txt": ("add_library(fa_library STATIC library/registry.cpp)\n"
                       "target_link_libraries(fa_library PUBLIC fa_device)\n"
                       "target_link_libraries(fa2_capi PRIVATE fa_library ${FA_STEP_TARGETS})\n"
                       "target_link_libraries(fa2 PRIVATE fa_harness)\n"),
    "cmake/steps.cmake": ("set(obj fa_mutant_obj_${nn}_${bug})\n"
                          "target_link_libraries(fa_step${nn} PUBLIC fa_library)\n"
                          "target_link_libraries(${obj} PUBLIC fa_library)\n"),
}
# Each breakage: (file, content added to it, text the report must contain).
BREAKAGES = [
    ("include/fa/params.h", '#include "harness/check.h"\n', 'include/fa/params.h:2: includes "harness/check.h"'),
    ("device/mask.h", '#include "library/tuner.h"\n', "device/mask.h:2"),
    ("library/registry.cpp", '#include "harness/check.h"\n', "library/registry.cpp:4"),
    ("reference/cpu_reference.cpp", '#include "library/tuner.h"\n', "reference/cpu_reference.cpp:3"),
    ("steps/03_grid/attention.cu", '#include "harness/check.h"\n', "steps/03_grid/attention.cu:4"),
    ("steps/03_grid/attention.cu", '#include "reference/cpu_reference.h"\n', "a step may include only"),
    ("steps/03_grid/attention.cu", '#include "tests/gpu/suite.h"\n', "(tests)"),
    ("steps/03_grid/attention.cu", '#include "../04_next/kernel.h"\n', '"../04_next/kernel.h" (steps)'),
    ("capi/c_api.cpp", '#include "harness/check.h"\n', "capi/c_api.cpp:3"),
    ("steps/03_grid/attention.cu", '#include "kernels/mask.h"\n', '"kernels/mask.h" (kernels)'),
    ("kernels/mask.h", '#include "reference/cpu_reference.h"\n', "kernels/mask.h:3"),
    ("device/mask.h", '#include "kernels/mask.h"\n', "device/mask.h:2"),
    ("tests/gpu/suite.h", '#include "tools/commands.h"\n', "tests may include only"),
    ("tools/fa2.cpp", '#include "tests/gpu/suite.h"\n', "tools/fa2.cpp:3"),
    ("tools/fa2.cpp", '#include "commandz.h"\n', "in no layer"),
    ("CMakeLists.txt", "target_link_libraries(fa2_capi PRIVATE fa_harness)\n", "fa2_capi links fa_harness"),
    ("CMakeLists.txt", "target_link_libraries(fa_library\n  PUBLIC fa_device fa_harness)\n",
     "CMakeLists.txt:5: fa_library links fa_harness"),
    ("cmake/steps.cmake", "target_link_libraries(fa_step${nn} PUBLIC fa_harness)\n", "fa_step${nn} links fa_harness"),
    ("cmake/steps.cmake", "target_link_libraries(${obj} PUBLIC fa_harness)\n", "${obj} links fa_harness"),
    ("cmake/steps.cmake", "target_link_libraries(fa_reference PUBLIC fa_library)\n", "fa_reference links fa_library"),
]


def selftest():
    me = os.path.abspath(__file__)

    def run_on(tree):
        with tempfile.TemporaryDirectory(prefix="layers_selftest_") as d:
            for rel, text in tree.items():
                os.makedirs(os.path.dirname(os.path.join(d, rel)) or d, exist_ok=True)
                with open(os.path.join(d, rel), "w") as f:
                    f.write(text)
            p = subprocess.run([sys.executable, me, "--root", d], capture_output=True, text=True)
            return p.returncode, p.stdout + p.stderr

    status = 0
    rc, out = run_on(GOOD_TREE)
    if rc != 0:
        print(f"SELFTEST FAIL: a tree that keeps the rules is rejected (exit {rc}):\n{out}")
        status = 1
    else:
        print("selftest ok: a tree that keeps the rules passes")
    for rel, extra, expected in BREAKAGES:
        tree = dict(GOOD_TREE)
        tree[rel] = tree[rel] + extra
        rc, out = run_on(tree)
        if rc == 0 or expected not in out:
            print(f"SELFTEST FAIL: adding {extra.strip()!r} to {rel}: exit {rc}, expected a report with "
                  f"{expected!r}:\n{out}")
            status = 1
        else:
            print(f"selftest ok: {out.splitlines()[0]}")
    return status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--selftest", action="store_true", help="check the checker on made-up trees")
    args = ap.parse_args()
    return selftest() if args.selftest else main_check(args.root)


if __name__ == "__main__":
    sys.exit(main())
