#!/usr/bin/env bash
# The verdicts of run_mutant.sh on made-up test programs that print what GoogleTest prints: a
# mutant counts as killed only by a failed assertion, never by a crash, a fault or a skip.
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

printf 'Bug: made up\nCatalog: none\nTest: *\n\n--- a/x\n+++ b/x\n' >"$tmp/plain.patch"
printf 'Bug: made up\nCatalog: none\nTest: *\nSymptom: fault\n\n--- a/x\n+++ b/x\n' >"$tmp/fault.patch"
printf 'Bug: made up\nCatalog: none\nTest: *\nSymptom: hang\n\n--- a/x\n+++ b/x\n' >"$tmp/hang.patch"

# fake <name> <exit code> <output lines...>: a program that ignores its arguments.
fake() {
  local f="$tmp/$1" rc=$2
  shift 2
  {
    echo '#!/usr/bin/env bash'
    echo "cat <<'OUT'"
    printf '%s\n' "$@"
    echo 'OUT'
    if [ "$rc" = segv ]; then echo 'kill -SEGV $$'; elif [ "$rc" = hang ]; then echo 'sleep 30'; else echo "exit $rc"; fi
  } >"$f"
  chmod +x "$f"
}

# expect <verdict> <exit code> <patch> <program>
expect() {
  local want=$1 want_rc=$2 patch=$3 prog=$4 out rc
  out=$(bash "$here/run_mutant.sh" "bug.$prog" "$tmp/$patch" '*' "$tmp/$prog" 2>&1)
  rc=$?
  local last
  last=$(printf '%s\n' "$out" | tail -n 1)
  if [ "$rc" != "$want_rc" ] || [[ "$last" != "MUTANT bug.$prog: $want —"* ]]; then
    echo "FAIL $prog: expected '$want' (exit $want_rc), got exit $rc: $last"
    status=1
  else
    echo "ok   $prog: $last"
  fi
}

fake assertion 1 \
  '[==========] Running 2 tests from 1 test suite.' \
  '[ RUN      ] Shapes.B2_H3_N17_D64' \
  '/src/tests/gpu/step_suite.cpp:226: Failure' \
  'Value of: r.ok()' '  Actual: false' 'Expected: true' \
  'step 1 on B=2 H=3 N=17 D=64' '  O vs cpu-fp64: FAIL: max|err|=1.74 (first at 3)' \
  '[  FAILED  ] Shapes.B2_H3_N17_D64 (12 ms)' \
  '[ RUN      ] Shapes.B2_H3_N17_D128' \
  '[       OK ] Shapes.B2_H3_N17_D128 (10 ms)' \
  '[  FAILED  ] 1 test, listed below:' '[  FAILED  ] Shapes.B2_H3_N17_D64'
expect KILLED 0 plain.patch assertion

fake bare_assert 1 \
  '[ RUN      ] Sass.NoLocalMemory' \
  '/src/tests/static/sass_check.cpp:120: Failure' \
  'Expected equality of these values:' '  std::stoi(m[2])' '    Which is: 176' '  0' \
  '[  FAILED  ] Sass.NoLocalMemory (3 ms)'
expect KILLED 0 plain.patch bare_assert

fake passed 0 \
  '[ RUN      ] LargeLogits.D64' '[       OK ] LargeLogits.D64 (4 ms)' '[  PASSED  ] 1 test.'
expect SURVIVED 1 plain.patch passed

fake skipped 0 \
  '[ RUN      ] LargeLogits.D64' '/src/tests/gpu/step_suite.cpp:40: Skipped' \
  'no CUDA GPU available (no CUDA-capable device is detected): GPU test skipped' \
  '[  SKIPPED ] LargeLogits.D64 (0 ms)' '[  PASSED  ] 0 tests.' '[  SKIPPED ] 1 test, listed below:' \
  '[  SKIPPED ] LargeLogits.D64'
expect "NOT RUN" 77 plain.patch skipped

fake no_test 0 '[==========] 0 tests from 0 test suites ran. (0 ms total)' '[  PASSED  ] 0 tests.'
expect ERROR 1 plain.patch no_test

fault_lines=(
  '[ RUN      ] GQA.H4_HKV2'
  'unknown file: Failure'
  'C++ exception with description "cudaDeviceSynchronize() failed at check.cpp:48: cudaErrorIllegalAddress (an illegal memory access was encountered)" thrown in the test body.'
  '[  FAILED  ] GQA.H4_HKV2 (20 ms)')
fake fault 1 "${fault_lines[@]}"
cp "$tmp/fault" "$tmp/fault_expected"
expect CRASHED 1 plain.patch fault
expect KILLED 0 fault.patch fault_expected

fake assert_then_fault 1 \
  '[ RUN      ] GQA.A' '/src/x.cpp:1: Failure' 'bad output' '[  FAILED  ] GQA.A (1 ms)' "${fault_lines[@]}"
expect CRASHED 1 plain.patch assert_then_fault

fake segv segv '[ RUN      ] Overflow.Past2To31Elements'
expect CRASHED 1 plain.patch segv

fake abort 134 '[ RUN      ] Shapes.X' "terminate called after throwing an instance of 'std::runtime_error'"
expect CRASHED 1 plain.patch abort

# A program that never finishes: a hang is a kill only where the header predicts it.
fake hang hang '[ RUN      ] Shapes.X'
FA_MUTANT_TIMEOUT_S=2 expect HUNG 1 plain.patch hang
FA_MUTANT_HANG_S=2 expect KILLED 0 hang.patch hang

exit $status
