#!/usr/bin/env bash
# tests/python/run.sh capi|cp_plan|torch|context_parallel LIB — the Python package's tests (pytest)
# against the built library LIB (libfa2_capi.so), from the source tree. Exit 77, which ctest reports
# as skipped (never as passed), when pytest is missing, for `torch` when PyTorch or a CUDA GPU is,
# and for `context_parallel` when PyTorch is (its GPU cases then skip themselves, with the reason).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
which=$1 lib=$2
export FA_COURSE_LIB=$lib
export PYTHONPATH="$root/python:$root/.deps/python${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import pytest" 2>/dev/null || { echo "python.$which: pytest not found (scripts/install_deps.sh installs it)"; exit 77; }
if [ "$which" = torch ]; then
  python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null ||
    { echo "python.torch: no PyTorch with a CUDA GPU here"; exit 77; }
fi
if [ "$which" = context_parallel ]; then
  python3 -c "import torch" 2>/dev/null || { echo "python.context_parallel: no PyTorch here"; exit 77; }
fi
cd "$root" && exec python3 -m pytest -q -rs -p no:cacheprovider "tests/python/test_$which.py"
