#!/usr/bin/env bash
# On a GPU machine: build, run every test (GPU tests, mutants, static checks), run
# compute-sanitizer on every step at a small ragged shape, run the ladder, and write
# docs/results/<gpu>.md and <gpu>.csv with the commit, GPU name and clocks.
#   scripts/gpu_report.sh [results-dir]        (default docs/results)
# Environment: BUILD_DIR (build), FA_COMMIT (default: git rev-parse), FA_CMAKE_ARGS,
# FA_SKIP_SANITIZER=1 to skip the sanitizer pass, FA_LADDER_ARGS for extra ladder options,
# FA_WITH_COMPARE=1 to also run scripts/compare.py (every step through `fa2 bench` over the default
# sweep, next to PyTorch SDPA, Triton and the GEMM/copy ceilings) into the same results folder:
# compare_<gpu>.{csv,json,md,png}, bench_<gpu>.csv (the fa2 bench rows) and the README block — the
# whole performance picture in one command. A step that fails its check, or a provider that
# disagrees, fails the run. FA_COMPARE_ARGS: extra compare.py arguments, e.g.
# --baseline old=/path/to/old/build/fa2:7 to time an old build's step 07 shape by shape beside them.
# In pieces, on a machine that limits how long one command may run: FA_LOGS_DIR keeps the logs
# between calls, FA_PHASES names the phases a call runs (default: build sanitizer tests ladder
# compare report), FA_CTEST_PART and FA_CTEST_ARGS run a part of the tests (e.g.
# FA_CTEST_PART=a FA_CTEST_ARGS="-E ^step1", then FA_CTEST_PART=b FA_CTEST_ARGS="-R ^step1"; the
# report reads every part's log, and a part that did not finish counts as failed), the sanitizer
# pass resumes where the last call's left off, and FA_DEADLINE (seconds since the epoch) stops it
# starting new runs. A logs folder belongs to one commit: reusing it for another is refused. FA_SANITIZER_STEPS: the steps it covers (default: every step).
# FA_PHASES="variants" (alone or with others; never by default) runs scripts/variants.py, Part VI's
# variant table, into the results folder (FA_VARIANTS_ARGS: e.g. --quick).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
results=${1:-docs/results}
build=${BUILD_DIR:-build}
mkdir -p "$results"
logs=${FA_LOGS_DIR:-$(mktemp -d)}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)  # absolute: ctest writes its XML from inside the build folder
phases=" ${FA_PHASES:-build sanitizer tests ladder compare report} "
has() { [[ $phases == *" $1 "* ]]; }
part=${FA_CTEST_PART:+_$FA_CTEST_PART}
commit=${FA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[ -n "$gpu" ] || { echo "gpu_report: no GPU found (nvidia-smi)"; exit 1; }
slug=$(echo "$gpu" | tr -cs 'A-Za-z0-9' '_' | sed 's/_$//')
if [ -f "$logs/commit" ] && [ "$(cat "$logs/commit")" != "$commit" ]; then
  echo "gpu_report: $logs holds the logs of commit $(cat "$logs/commit"), not $commit: use another FA_LOGS_DIR"
  exit 1
fi
echo "$commit" >"$logs/commit"

if has build; then
  echo "== build ($commit on $gpu)"
  gtest_arg=()
  [ -d .deps/googletest ] && gtest_arg=(-DFA_GTEST_SOURCE_DIR=.deps/googletest)
  # shellcheck disable=SC2086
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${gtest_arg[@]}" ${FA_CMAKE_ARGS:-} >"$logs/configure.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" >"$logs/build.log" 2>&1 || { tail -50 "$logs/configure.log" "$logs/build.log"; exit 1; }
fi

sanitizer_csv="$logs/sanitizer.csv"
[ -s "$sanitizer_csv" ] || echo "step,tool,result,errors" >"$sanitizer_csv"
run_sanitizer() {
  # Every step, every tool, at a small ragged GQA shape (causal too where the step supports it).
  # Runs beside the test suite: both are correctness checks, neither is timed.
  for step in ${FA_SANITIZER_STEPS:-$("$build/fa2" list | cut -c1-2)}; do
    for tool in memcheck racecheck initcheck synccheck; do
      for causal in "" "--causal"; do
        grep -q "^$step,$tool${causal:+ causal}," "$sanitizer_csv" && continue  # done in an earlier call
        [ -n "${FA_DEADLINE:-}" ] && [ "$(date +%s)" -ge "$FA_DEADLINE" ] && return
        log="$logs/san_${step}_${tool}${causal:+_causal}.log"
        # shellcheck disable=SC2086
        compute-sanitizer --tool "$tool" --error-exitcode 99 "$build/fa2" run --step "$step" --b 1 --h 2 --hkv 1 \
          --nq 77 --nkv 131 --d 64 $causal --iters 1 --warmup 0 >"$log" 2>&1
        rc=$?
        # A step without the causal mask refuses the causal run before any GPU work, and a step
        # built for another GPU (the Hopper steps elsewhere) refuses to run: neither is a result.
        if grep -q "does not support\|built for compute capability" "$log"; then continue; fi
        errs=$(grep -oE "(ERROR|RACECHECK) SUMMARY: [0-9]+" "$log" | grep -oE "[0-9]+" | tail -1)
        res=clean
        [ $rc -ne 0 ] && res="FAIL(rc=$rc)"
        echo "$step,$tool${causal:+ causal},$res,${errs:-?}" >>"$sanitizer_csv"
      done
    done
  done
  # The barrier mutants must be caught by racecheck too (their rows read "hazards found"): step
  # 02's tile overwritten while read, and step 08's ring slot refilled before every warp is done.
  # N_kv = 777 spans many K/V tiles, so the next tile's load can overwrite the one being read.
  local name mutant filter
  # The other two pipeline mutants are racechecked too, as a measurement: whether racecheck sees
  # a copy still landing (wait depth) or one landing in the slot being read (ring index).
  for name in 02-missing_barrier 08-missing_reuse_barrier 08-wait_depth 08-ring_off_by_one; do
    mutant="$build/fa_mutant_${name/-/_}"
    filter='Ragged.B3_H2_N1x777_D64'
    [ -x "$mutant" ] || continue
    grep -q "^${name} mutant," "$sanitizer_csv" && continue
    [ -n "${FA_DEADLINE:-}" ] && [ "$(date +%s)" -ge "$FA_DEADLINE" ] && return
    compute-sanitizer --tool racecheck --error-exitcode 99 "$mutant" --gtest_filter="$filter" \
      >"$logs/san_mutant_${name}.log" 2>&1
    rc=$?
    errs=$(grep -oE "RACECHECK SUMMARY: [0-9]+" "$logs/san_mutant_${name}.log" | grep -oE "[0-9]+" | tail -1)
    res="missed (rc=$rc)"
    [ $rc -eq 99 ] && res="hazards found (mutant caught)"
    echo "${name} mutant,racecheck,$res,${errs:-?}" >>"$sanitizer_csv"
  done
}
san_pid=
if has sanitizer && [ "${FA_SKIP_SANITIZER:-0}" != 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer (in the background)"
  run_sanitizer &
  san_pid=$!
fi

# The SM clock while the GPU work runs (not the idle clock before or after it), every 500 ms, for
# the report; stopped once the ladder is done.
nvidia-smi --query-gpu=clocks.sm,utilization.gpu --format=csv,noheader,nounits -lms 500 >>"$logs/clocks.txt" 2>/dev/null &
clock_pid=$!

if has tests; then
  echo "== tests${part:+ (part ${FA_CTEST_PART})}"
  echo 124 >"$logs/ctest$part.rc"  # until ctest returns: a part cut short counts as failed
  # shellcheck disable=SC2086
  (cd "$build" && ctest -j 8 --timeout 900 --output-on-failure --output-junit "$logs/ctest$part.xml" ${FA_CTEST_ARGS:-}) \
    >"$logs/ctest$part.log" 2>&1
  echo $? >"$logs/ctest$part.rc"
  grep -E "tests passed|tests failed" "$logs/ctest$part.log"
fi
[ -n "$san_pid" ] && wait "$san_pid"
echo "== sanitizer: $(grep -c clean "$sanitizer_csv") clean, $(grep -c FAIL "$sanitizer_csv") failed so far"

if has ladder; then
  echo "== ladder"
  # fa2 bench's ladder preset; the report writer turns the CSVs into the report's tables.
  for d in 64 128; do
    # shellcheck disable=SC2086
    "$build/fa2" ladder --csv "$logs/ladder_d$d.csv" --d $d ${FA_LADDER_ARGS:-} 2>"$logs/ladder_d$d.err"
  done
fi

kill "$clock_pid" 2>/dev/null

# Every part's exit code, and the comparison's: the run fails if any of them did (no test run at
# all counts as failed, for the report).
ctest_rc=$(cat "$logs"/ctest*.rc 2>/dev/null | sort -n | tail -1)
ctest_rc=${ctest_rc:-1}
[ -f "$logs/compare.rc" ] && [ "$(cat "$logs/compare.rc")" != 0 ] && ctest_rc=1
if has compare && [ "${FA_WITH_COMPARE:-0}" = 1 ]; then
  echo "== compare.py (fa2 bench shape by shape, SDPA, Triton, ceilings)"
  # shellcheck disable=SC2086
  python3 scripts/compare.py --fa2 "$build/fa2" --out "$results" --commit "$commit" ${FA_COMPARE_ARGS:-} \
    >"$logs/compare.log" 2>&1
  compare_rc=$?
  echo $compare_rc >"$logs/compare.rc"
  tail -5 "$logs/compare.log"
  [ $compare_rc -eq 0 ] || { echo "compare.py failed (exit $compare_rc): a provider disagrees or a step failed"; ctest_rc=1; }
fi

# Part VI's variant table (scripts/variants.py: the score modifications and the window beside the
# plain call and FlexAttention, forward and backward): only as a phase named in FA_PHASES.
if has variants; then
  echo "== variants.py (score modifications, sliding window; FlexAttention, SDPA cuDNN)"
  # shellcheck disable=SC2086
  python3 scripts/variants.py --fa2 "$build/fa2" --out "$results" --commit "$commit" ${FA_VARIANTS_ARGS:-} \
    >"$logs/variants.log" 2>&1
  echo $? >"$logs/variants.rc"
  tail -20 "$logs/variants.log"
fi

if ! has report; then  # a piece: its own work decides its exit code (the build exits above if it fails)
  echo "== logs: $logs (phases:$phases)"
  rc=0
  has tests && rc=$(cat "$logs/ctest$part.rc")
  has compare && [ -f "$logs/compare.rc" ] && [ "$(cat "$logs/compare.rc")" != 0 ] && rc=1
  has variants && [ "$(cat "$logs/variants.rc")" != 0 ] && rc=1
  exit "$rc"
fi
python3 scripts/write_report.py --logs "$logs" --out "$results" --slug "$slug" --gpu "$gpu" --commit "$commit" \
  --ctest-rc "$ctest_rc"
# The raw ctest log and XML stay in $logs (printed below): the report keeps their summary — per-step
# counts, every mutant's verdict and first message, the measurements tests print.
echo "== raw logs: $logs"
echo "== report: $results/$slug.md"
exit $ctest_rc
