#!/usr/bin/env bash
# Part VI's tables from one build and one commit: every head dim forward and backward beside SDPA's
# cuDNN (compare.py), the decode kernel at every head dim beside SDPA (decode_compare.py), fp16
# against bf16 alternated in one run (dtype_pair.py), and the variants (variants.py), all into one
# results folder, each report naming the commit. On a GPU machine, with a build configured
# -DFA_HEAD_DIMS=all -DFA_DTYPES="bf16;fp16" (checked: a table the build cannot fill is refused).
#   scripts/part6_tables.sh [results-dir]            (default docs/results)
#   scripts/part6_tables.sh --dry-run [results-dir]  the commands, nothing run (no GPU needed)
# Environment: BUILD_DIR (default build), FA_COMMIT (default: git rev-parse), PARTS (default
# "head_dims decode dtype variants": a machine that limits how long one command runs takes them one
# call at a time, e.g. PARTS=head_dims, then PARTS="decode dtype", then PARTS=variants), DIMS (default
# "32 64 96 128 192 256": fewer head dims a call, each call's reports named after its first head dim).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dry=0
if [ "${1:-}" = "--dry-run" ]; then
  dry=1
  shift
fi
results=${1:-docs/results}
build=${BUILD_DIR:-build}
commit=${FA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
parts=${PARTS:-head_dims decode dtype variants}
dims=${DIMS:-32 64 96 128 192 256}
first=${dims%% *}

run() {
  echo "+ $*"
  [ "$dry" = 1 ] || "$@"
}

if [ "$dry" = 0 ]; then
  cache="$build/CMakeCache.txt"
  [ -f "$cache" ] || { echo "part6_tables: no build in $build (BUILD_DIR)"; exit 1; }
  built_dims=$(sed -n 's/^FA_HEAD_DIMS:[A-Z]*=//p' "$cache")
  built_types=$(sed -n 's/^FA_DTYPES:[A-Z]*=//p' "$cache")
  if [ "$built_dims" != all ]; then
    for d in $dims; do
      [[ ";$built_dims;" == *";$d;"* ]] || { echo "part6_tables: $build lacks head dim $d: configure it with -DFA_HEAD_DIMS=all"; exit 1; }
    done
  fi
  if [[ " $parts " == *" dtype "* ]] && [ "$built_types" != all ] && [[ ";$built_types;" != *";fp16;"* ]]; then
    echo "part6_tables: $build has no fp16 kernels: configure it with -DFA_DTYPES=\"bf16;fp16\" (or leave dtype out of PARTS)"
    exit 1
  fi
  mkdir -p "$results"
fi
# compare.py's --name is the whole stem: the GPU in it, as the other scripts put theirs.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -cs 'A-Za-z0-9' '_' | sed 's/_$//' || true)
gpu=${gpu:-GPU}

for part in $parts; do
  case $part in
    head_dims)
      run python3 scripts/compare.py --fa2 "$build/fa2" --steps 100,101 --d "${dims// /,}" --n 4096,16384 \
        --direction fwd,bwd --skip-providers sdpa_efficient,triton_fa2 --no-readme --name "head_dims$([ "$dims" = "32 64 96 128 192 256" ] || echo "_from_d$first")_$gpu" \
        --commit "$commit" --out "$results"
      ;;
    decode)
      for d in $dims; do
        run python3 scripts/decode_compare.py --fa2 "$build/fa2" --steps 101 --d "$d" --commit "$commit" \
          --out "$results" --name "decode_d$d"
      done
      ;;
    dtype)
      run python3 scripts/dtype_pair.py --fa2 "$build/fa2" --steps 100,101 --d 64,128 --n 4096,16384 --rounds 3 \
        --direction fwd,bwd --commit "$commit" --out "$results"
      ;;
    variants)
      run python3 scripts/variants.py --fa2 "$build/fa2" --commit "$commit" --out "$results"
      ;;
    *)
      echo "part6_tables: unknown part '$part' (head_dims, decode, dtype, variants)"
      exit 2
      ;;
  esac
done
