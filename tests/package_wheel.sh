#!/usr/bin/env bash
# tests/package_wheel.sh WORKDIR [PIP_ARGS...] — the Python package built the way the README installs
# it: `pip wheel` of the source tree (pyproject.toml: FA_BUILD_TESTS=OFF, the library alone), in its
# own build folder under WORKDIR; the wheel installed into a folder; the package imported from
# there, in a clean environment, and asked for its steps (no GPU, no torch needed). PIP_ARGS go to
# `pip wheel` (ctest passes `-C cmake.define.X=Y` settings that shorten the build: the main build has
# already compiled every architecture and head dim; this test is about the package). Exit 77
# (skipped) without scikit-build-core; scripts/install_deps.sh installs it.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$1
shift
export PYTHONPATH="$root/.deps/python${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import scikit_build_core" 2>/dev/null ||
  { echo "package.wheel: scikit-build-core not found (scripts/install_deps.sh installs it)"; exit 77; }
rm -rf "$work/wheel" "$work/site"
mkdir -p "$work/wheel" "$work/site"
echo "package.wheel: pip wheel --no-build-isolation (build folder $work/build)"
python3 -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -w "$work/wheel" \
  -C build-dir="$work/build" "$@" "$root" || { echo "package.wheel: the wheel did not build"; exit 1; }
wheel=$(ls "$work"/wheel/fa_course-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "package.wheel: no fa_course wheel in $work/wheel"; exit 1; }
python3 -m pip install --no-deps --disable-pip-version-check --quiet --target "$work/site" "$wheel" ||
  { echo "package.wheel: the wheel did not install"; exit 1; }
# From a folder outside the source tree, with nothing but the installed package on the path.
cd "$work" && env -u FA_COURSE_LIB PYTHONPATH="$work/site" python3 - "$work/site" <<'PY'
import os, sys
import fa_course
from fa_course import _capi
site = sys.argv[1]
assert fa_course.__file__.startswith(site), f"imported {fa_course.__file__}, not the installed package"
lib = _capi.library_path()
assert lib.startswith(site) and os.path.exists(lib), f"the library is not inside the installed package: {lib}"
numbers = [s.number for s in fa_course.steps()]
assert numbers == sorted(numbers) and len(numbers) >= 17 and numbers[0] == 0, numbers
print(f"package.wheel: fa_course {fa_course.__version__} installed from the wheel, {len(numbers)} steps, library {lib}")
PY
