#!/usr/bin/env bash
# Installs what the build and the tests need beyond the CUDA toolkit, into .deps/ (never system-wide,
# except through apt when asked with --system). Safe to run repeatedly.
#   cuobjdump  — the static kernel checks read SASS with it. Some CUDA installs (e.g. minimal CI
#                images) ship nvcc without it; then the NVIDIA wheel from PyPI provides it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=$root/.deps

have_cuobjdump() {
  command -v cuobjdump >/dev/null 2>&1 && return 0
  local nvcc_dir
  nvcc_dir=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
  [ -x "$nvcc_dir/cuobjdump" ] && return 0
  [ -x "$deps/cuobjdump/nvidia/cu13/bin/cuobjdump" ] && return 0
  return 1
}

if ! have_cuobjdump; then
  echo "install_deps: cuobjdump not found; installing the nvidia-cuda-cuobjdump and -nvdisasm wheels into .deps/cuobjdump"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$deps/cuobjdump" \
    "nvidia-cuda-cuobjdump==13.2.51" "nvidia-cuda-nvdisasm==13.2.51"
fi
have_cuobjdump && echo "install_deps: cuobjdump ok"

# pytest, for the Python package's tests (tests/python; the ctest cases python.*), into .deps/python
# unless this Python already has it. Offline, those cases report themselves skipped.
if ! python3 -c "import pytest" >/dev/null 2>&1 && ! PYTHONPATH="$deps/python" python3 -c "import pytest" >/dev/null 2>&1; then
  echo "install_deps: pytest not found; installing it into .deps/python"
  python3 -m pip install --quiet --disable-pip-version-check --target "$deps/python" pytest ||
    echo "install_deps: warning: could not install pytest (the python.* tests will be skipped)"
fi

# The CUDA 12.4 runtime headers (the oldest toolkit the course supports), for the `compat.cuda12_4`
# test: the library's host code must compile against them, whatever toolkit builds it here.
if [ ! -f "$deps/cuda12.4/nvidia/cuda_runtime/include/cuda_runtime_api.h" ]; then
  echo "install_deps: fetching the CUDA 12.4 runtime headers into .deps/cuda12.4"
  if python3 -m pip download --quiet --disable-pip-version-check --no-deps --dest "$deps/cuda12.4-wheel" \
      "nvidia-cuda-runtime-cu12==12.4.127"; then
    python3 -c "import sys, zipfile, glob; zipfile.ZipFile(glob.glob(sys.argv[1] + '/*.whl')[0]).extractall(sys.argv[2])" \
      "$deps/cuda12.4-wheel" "$deps/cuda12.4"
  else
    echo "install_deps: warning: could not fetch them (the compat.cuda12_4 test will be skipped)"
  fi
fi

# scikit-build-core, for the `package.wheel` test: the package built as `pip install .` builds it.
if ! python3 -c "import scikit_build_core" >/dev/null 2>&1 &&
  ! PYTHONPATH="$deps/python" python3 -c "import scikit_build_core" >/dev/null 2>&1; then
  echo "install_deps: scikit-build-core not found; installing it into .deps/python"
  python3 -m pip install --quiet --disable-pip-version-check --target "$deps/python" "scikit-build-core>=0.10" ||
    echo "install_deps: warning: could not install scikit-build-core (the package.wheel test will be skipped)"
fi

if [ "${1:-}" = "--system" ]; then
  # Optional tools for the documentation and format checks.
  # Without doxygen the `docs` test is not registered; without clang-format the `format` test fails
  # and says so. An unreachable package mirror is reported, not fatal.
  if ! command -v doxygen >/dev/null 2>&1 || ! command -v clang-format >/dev/null 2>&1; then
    if ! { apt-get update -qq && apt-get install -y -qq doxygen clang-format >/dev/null; }; then
      echo "install_deps: warning: could not install doxygen/clang-format with apt-get"
    fi
  fi
fi
