#!/usr/bin/env bash
# tests/cpu/capi/c_example.sh LIB CUDA_INCLUDE CUDART WORKDIR — docs/examples/training_step.c
# built as a C program (C11, every warning an error) against the C interface's header and
# libfa2_capi.so, the way its comment says, then run: a forward with the LSE and a deterministic
# backward on a GPU; exit 77 (skipped) without one, after the build has been checked.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
# CUDART: the CUDA runtime library CMake found (a full path: some installs have libcudart.so only
# where CMake looked, not in the toolkit's lib folder, so -lcudart alone is not enough).
lib=$1 cuda_include=$2 cudart=$3 work=$4
cuda_libdir=$(dirname "$cudart")
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "c_example: no C compiler ($cc)"; exit 77; }
mkdir -p "$work"
libdir=$(dirname "$lib")
"$cc" -std=c11 -Wall -Wextra -Werror -I"$root/include" -I"$cuda_include" "$root/docs/examples/training_step.c" \
  -L"$libdir" -lfa2_capi "$cudart" -Wl,-rpath,"$libdir" -Wl,-rpath,"$cuda_libdir" \
  -o "$work/training_step"
echo "c_example: built $work/training_step"
exec "$work/training_step"
