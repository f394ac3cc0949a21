#!/usr/bin/env bash
# scripts/format.sh         reformat every C++/CUDA source in place
# scripts/format.sh --check exit non-zero (and list the files) if any source is not formatted
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format: clang-format not found (scripts/install_deps.sh --system installs it)"; exit 1; }
mapfile -t files < <(git ls-files '*.h' '*.cuh' '*.cpp' '*.cu' 2>/dev/null || find include common reference steps tests tools capi -name '*.[ch]*')
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then echo "not formatted: $f"; bad=1; fi
  done
  [ $bad -eq 0 ] && echo "format: all ${#files[@]} files formatted"
  exit $bad
fi
clang-format -i "${files[@]}"
