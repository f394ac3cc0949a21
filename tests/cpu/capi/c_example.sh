#!/usr/bin/env bash
# tests/cpu/capi/c_example.sh LIB CUDART WORKDIR CUDA_INCLUDE... — docs/examples/training_step.c
# built as a C program (C11, every warning an error) against the C interface's header and
# libfa2_capi.so, the way its comment says, then run: a forward with the LSE and a deterministic
# backward on a GPU; exit 77 (skipped) without one, after the build has been checked.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
# CUDART: the CUDA runtime library CMake found, a full path. The toolkit's include folders come
# last: there may be more than one.
lib=$1 cudart=$2 work=$3
shift 3
includes=()
for dir in "$@"; do includes+=("-I$dir"); done
cuda_libdir=$(dirname "$cudart")
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "c_example: no C compiler ($cc)"; exit 77; }
mkdir -p "$work"
libdir=$(dirname "$lib")
"$cc" -std=c11 -Wall -Wextra -Werror -I"$root/include" "${includes[@]}" "$root/docs/examples/training_step.c" \
  -L"$libdir" -lfa2_capi "$cudart" -Wl,-rpath,"$libdir" -Wl,-rpath,"$cuda_libdir" \
  -o "$work/training_step"
echo "c_example: built $work/training_step"
exec "$work/training_step"
