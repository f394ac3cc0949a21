#!/usr/bin/env bash
# tests/compat_cuda12_4.sh HEADERS CXX — the library's host code (library/, capi/) compiles against
# the CUDA 12.4 runtime headers in HEADERS (scripts/install_deps.sh fetches them), the oldest toolkit
# the README promises. A call that appeared later (cudaGetDriverEntryPointByVersion, CUDA 12.5) fails
# here, whichever toolkit builds the course. Exit 77 (skipped) when the headers are missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
headers=$1 cxx=$2
if [ ! -f "$headers/cuda_runtime_api.h" ]; then
  echo "compat.cuda12_4: no CUDA 12.4 headers in $headers (scripts/install_deps.sh fetches them)"
  exit 77
fi
grep -q "define CUDART_VERSION  *12040" "$headers/cuda_runtime_api.h" || { echo "not the 12.4 headers: $headers"; exit 1; }
status=0
for f in "$root"/library/*.cpp "$root"/capi/*.cpp; do
  if ! "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Werror -isystem "$headers" -I"$root/include" -I"$root" "$f"; then
    echo "does not compile against CUDA 12.4: ${f#"$root"/}"
    status=1
  fi
done
[ $status -eq 0 ] && echo "compat.cuda12_4: library/ and capi/ compile against CUDA 12.4's headers"
exit $status
