#!/usr/bin/env bash
# scripts/sanitize_configs.sh [--dry-run] [BUILD]   compute-sanitizer on every kernel configuration
# the library's choice (FA_STEP_AUTO) can run: each configuration of each step or production kernel
# in FA_SANITIZE_STEPS, at D = 64 and 128 (FA_SANITIZE_DIMS), on one small ragged shape (B=1 H=2 H_kv=1 N_q=77 N_kv=131,
# causal bottom-right: masked and ragged tiles, GQA), under each tool in FA_SANITIZE_TOOLS.
#   FA_SANITIZE_STEPS  default "100 101", the production kernels: 101 (Hopper) on an H100/H200, 100
#                      (mma.sync) on other GPUs and wherever 101 refuses the input (a broadcast K
#                      or V, strides TMA cannot express); no step is chosen past them
#   FA_SANITIZE_TOOLS  default "memcheck racecheck synccheck"
#   FA_SANITIZE_ARGS   the shape, as fa2 run options (default above)
#   FA_SANITIZE_DIMS   the head dims (default "64 128"; kernel 100 built with FA_HEAD_DIMS=all has
#                      32, 96, 192 and 256 too)
# The GPU report's sanitizer pass covers only the configuration its one shape tunes to; this covers
# them all. Logs go to BUILD/sanitize/; the last line says how many runs were clean. Exit 0 when all
# were, 1 when any was not, 77 (skipped) without a GPU or compute-sanitizer. --dry-run prints the
# runs without a GPU.
set -uo pipefail
dry=0
[ "${1:-}" = "--dry-run" ] && { dry=1; shift; }
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
fa2=$build/fa2
[ -x "$fa2" ] || { echo "sanitize_configs: no $fa2 (build first: scripts/test.sh)"; exit 2; }
steps=${FA_SANITIZE_STEPS:-100 101}
tools=${FA_SANITIZE_TOOLS:-memcheck racecheck synccheck}
shape=${FA_SANITIZE_ARGS:---b 1 --h 2 --hkv 1 --nq 77 --nkv 131 --causal --bottom-right}
if [ $dry = 0 ]; then
  command -v compute-sanitizer >/dev/null || { echo "sanitize_configs: compute-sanitizer not found"; exit 77; }
  nvidia-smi -L >/dev/null 2>&1 || { echo "sanitize_configs: no GPU"; exit 77; }
fi
logs=$build/sanitize
mkdir -p "$logs"
runs=0 clean=0 skipped=0
for step in $steps; do
  for d in ${FA_SANITIZE_DIMS:-64 128}; do
    mapfile -t configs < <("$fa2" configs --step "$step" --d "$d" 2>/dev/null)
    [ ${#configs[@]} -gt 0 ] || { echo "step $step D=$d: no configurations (not registered in this fa2?)"; continue; }
    for cfg in "${configs[@]}"; do
      for tool in $tools; do
        label="step $step D=$d $cfg $tool"
        # shellcheck disable=SC2086
        cmd=("$fa2" run --step "$step" --config "$cfg" --d "$d" $shape --iters 1 --warmup 0)
        if [ $dry = 1 ]; then
          echo "$label"
          continue
        fi
        log="$logs/step${step}_d${d}_$(echo "$cfg" | tr ' =' '_-')_$tool.log"
        compute-sanitizer --tool "$tool" --error-exitcode 99 "${cmd[@]}" >"$log" 2>&1
        rc=$?
        runs=$((runs + 1))
        case $rc in
          0) clean=$((clean + 1)); echo "clean   $label" ;;
          77) skipped=$((skipped + 1)); echo "SKIPPED $label (this GPU cannot run it)" ;;
          *) echo "FAILED  $label (exit $rc): $log"; tail -n 5 "$log" ;;
        esac
      done
    done
  done
done
[ $dry = 1 ] && exit 0
echo "sanitize_configs: $clean of $runs runs clean, $skipped skipped, $((runs - clean - skipped)) failed"
[ $((runs - clean - skipped)) -eq 0 ] || exit 1
[ $runs -gt $skipped ] || exit 77
exit 0
