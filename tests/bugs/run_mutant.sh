#!/usr/bin/env bash
# run_mutant.sh NAME PATCH FILTER COMMAND...: runs a GoogleTest program built with the bug of
# PATCH injected, on the tests matching FILTER, and says whether the regression test caught it.
#
#   KILLED    (exit 0)  at least one selected test failed by its assertion and nothing crashed
#   SURVIVED  (exit 1)  every selected test that ran passed: the regression test misses the bug
#   CRASHED   (exit 1)  the program died (a signal, an abort), hit a CUDA fault, or a test failed
#                       only by an exception: whatever stopped it, it was not the regression test's
#                       assertion, so it is not a kill. A patch whose header has `Symptom: fault`
#                       expects exactly that, and then a crash is its kill.
#   HUNG      (exit 1)  the program did not finish within FA_MUTANT_TIMEOUT_S seconds (default
#                       300) and was killed. A patch whose header has `Symptom: hang` expects
#                       exactly that (a wait for an mbarrier phase that never completes), and is
#                       then given 30 seconds: its hang is its kill, reported as such.
#   NOT RUN   (exit 77) every selected test was skipped (no GPU), or the program ran none and exited
#                       77 (a SASS check for an architecture the build has no code for): ctest
#                       reports the case skipped
#   ERROR     (exit 1)  the filter selects no test
#
# The last line is `MUTANT <name>: <verdict> — <first failure line>`.
set -u
if [ $# -lt 4 ]; then
  echo "usage: $0 NAME PATCH FILTER COMMAND..." >&2
  exit 2
fi
name=$1 patch=$2 filter=$3
shift 3

expects_fault=0 expects_hang=0
if sed '/^--- /q' "$patch" | grep -Eq '^Symptom:[[:space:]]*fault[[:space:]]*$'; then
  expects_fault=1
fi
if sed '/^--- /q' "$patch" | grep -Eq '^Symptom:[[:space:]]*hang[[:space:]]*$'; then
  expects_hang=1
fi
limit=${FA_MUTANT_TIMEOUT_S:-300}
[ $expects_hang = 1 ] && limit=${FA_MUTANT_HANG_S:-30}

out=$(timeout --signal=KILL "$limit" "$@" --gtest_filter="$filter" 2>&1)
rc=$?
if [ "$rc" -eq 137 ]; then  # timeout's SIGKILL: the program was still running at the limit
  printf '%s\n' "$out" | tail -n 40
  echo
  if [ $expects_hang = 1 ]; then
    echo "MUTANT $name: KILLED — it hung (killed after ${limit} s), as the patch header's 'Symptom: hang' predicts"
    exit 0
  fi
  echo "MUTANT $name: HUNG — killed after ${limit} s: not caught by an assertion"
  exit 1
fi
printf '%s\n' "$out" | tail -n 40
echo

# One pass over the GoogleTest output. Per test block ([ RUN ] ... its result line): did it fail,
# and was the failure an assertion (a "Failure" followed by a message) or an exception?
summary=$(printf '%s\n' "$out" | awk '
  function clean(s) { sub(/[ \t\r]+$/, "", s); sub(/^[ \t]+/, "", s); return s }
  BEGIN { ran = 0; passed = 0; failed = 0; asserted = 0; skipped = 0; crash = ""; first = ""; skip_why = ""; test = "" }
  /terminate called|CUDA error|Segmentation fault|illegal memory access|unspecified launch failure|misaligned address|device-side assert|illegal instruction/ {
    if (crash == "") crash = (test != "" ? test ": " : "") clean($0)
  }
  /^\[ RUN      \] / {
    ran++; test = substr($0, 14); in_failure = 0; msg = ""; fail_msg = ""; first_line = ""; exc = 0; want_skip = 0
    next
  }
  /^\[       OK \] .* \([0-9]+ ms\)$/ { passed++; next }
  /^\[  SKIPPED \] .* \([0-9]+ ms\)$/ { skipped++; next }
  /^\[  FAILED  \] .* \([0-9]+ ms\)$/ {
    failed++
    if (in_failure && !exc) {
      asserted++
      if (first == "") first = test ": " (fail_msg != "" ? fail_msg : (msg != "" ? msg : first_line))
    }
    next
  }
  /: Failure$/ { in_failure = 1; next }
  /: Skipped$/ { want_skip = 1; next }
  {
    raw = $0; sub(/[ \t\r]+$/, "", raw)
    line = clean($0)
    if (want_skip) { if (skip_why == "" && line != "") skip_why = line; want_skip = 0 }
    if (!in_failure) next
    if (line ~ /^(C\+\+ exception|Unknown C\+\+ exception)/) { exc = 1; if (crash == "") crash = test ": " line; next }
    if (line ~ /FAIL:/ && fail_msg == "") fail_msg = line
    if (msg != "" || line == "") next
    if (first_line == "") first_line = line
    # gtest boilerplate around the message: "Value of: x", "  Actual: y", "Expected: z",
    # "Which is: w", and the bare operand lines of EXPECT_EQ.
    if (line ~ /^(Value of:|Expected|Actual:|Which is:)/) next
    if (raw ~ /^  [^ ]+$/) next
    msg = line
  }
  END {
    printf "ran=%d\npassed=%d\nfailed=%d\nasserted=%d\nskipped=%d\n", ran, passed, failed, asserted, skipped
    printf "first=%s\ncrash=%s\nskip_why=%s\n", first, crash, skip_why
  }')
field() { printf '%s\n' "$summary" | sed -n "s/^$1=//p"; }
ran=$(field ran) failed=$(field failed) asserted=$(field asserted) skipped=$(field skipped)
first=$(field first) crash=$(field crash) skip_why=$(field skip_why)

verdict() {  # verdict WORD EXIT MESSAGE
  echo "MUTANT $name: $1 — $3"
  exit "$2"
}

crashed=0
if [ "$rc" -ge 128 ]; then
  crashed=1
  [ -n "$crash" ] || crash="the program was killed by signal $((rc - 128)) (exit $rc)"
elif [ -n "$crash" ]; then
  crashed=1
fi
if [ $crashed = 1 ]; then
  if [ $expects_fault = 1 ]; then
    verdict KILLED 0 "it faulted, as the patch header's 'Symptom: fault' predicts: $crash"
  fi
  verdict CRASHED 1 "not caught by an assertion: $crash"
fi
if [ "$asserted" -gt 0 ]; then
  verdict KILLED 0 "$first"
fi
# A program that ran no test and exited 77 said it could not check anything here (a SASS check
# whose architecture this build has no code for).
if [ "$rc" -eq 77 ] && [ "$ran" -eq 0 ]; then
  verdict "NOT RUN" 77 "$(printf '%s\n' "$out" | tail -n 1)"
fi
if [ "$failed" -gt 0 ] || [ "$rc" -ne 0 ]; then
  verdict CRASHED 1 "exit $rc with $failed failed test(s) and no failed assertion"
fi
if [ "$ran" -eq 0 ]; then
  verdict ERROR 1 "the filter '$filter' selects no test"
fi
if [ "$skipped" -eq "$ran" ]; then
  verdict "NOT RUN" 77 "all $ran selected test(s) skipped${skip_why:+: $skip_why}"
fi
verdict SURVIVED 1 "every selected test that ran passed ($((ran - skipped)) of $ran); the regression test does not catch the bug"
