#!/usr/bin/env bash
# tests/python/run.sh MODE LIB — the Python package's tests (pytest) against the built library LIB
# (libfa2_capi.so), from the source tree. MODE: capi | cp_plan (no torch needed), torch,
# transformers, context_parallel (its CPU part), context_parallel.gpu, context_parallel.nccl.
# Exit 77, which ctest reports as skipped (never as passed), when what MODE runs on is missing:
# pytest; PyTorch; a CUDA GPU (torch, transformers, context_parallel.gpu); two (context_parallel.nccl);
# transformers. A mode that runs never counts tests that skipped inside it as its own pass: the GPU
# modes select only tests marked for that hardware, and those are not skipped where it is present.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
mode=$1 lib=$2
export FA_COURSE_LIB=$lib
export PYTHONPATH="$root/python:$root/.deps/python${PYTHONPATH:+:$PYTHONPATH}"
skip() { echo "python.$mode: $1"; exit 77; }
python3 -c "import pytest" 2>/dev/null || skip "pytest not found (scripts/install_deps.sh installs it)"
case $mode in
  capi | cp_plan) file=$mode select=() ;;
  torch | transformers | context_parallel*)
    python3 -c "import torch" 2>/dev/null || skip "no PyTorch here"
    gpus=$(python3 -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null)
    ;;&
  torch) file=torch select=(); [ "$gpus" -ge 1 ] || skip "no CUDA GPU here" ;;
  transformers)
    file=transformers select=()
    [ "$gpus" -ge 1 ] || skip "no CUDA GPU here"
    python3 -c "import transformers" 2>/dev/null || skip "transformers is not installed"
    ;;
  context_parallel) file=context_parallel select=(-m "not gpu and not multigpu") ;;
  context_parallel.gpu) file=context_parallel select=(-m gpu); [ "$gpus" -ge 1 ] || skip "no CUDA GPU here" ;;
  context_parallel.nccl)
    file=context_parallel select=(-m multigpu)
    [ "$gpus" -ge 2 ] || skip "the NCCL ring needs two GPUs; this machine has $gpus"
    ;;
  *) echo "run.sh: unknown mode $mode"; exit 2 ;;
esac
cd "$root" && exec python3 -m pytest -q -rs -p no:cacheprovider -c tests/python/pytest.ini "${select[@]}" \
  "tests/python/test_$file.py"
