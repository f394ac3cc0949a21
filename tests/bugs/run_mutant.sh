#!/usr/bin/env bash
# run_mutant.sh FILTER COMMAND...: runs a GoogleTest program built with an injected bug.
# Exit 0 = the mutant was killed (a test failed), 1 = it survived (every test passed) or the
# filter matched nothing, 77 = skipped (no GPU: ctest reports the case as skipped).
filter=$1
shift
out=$("$@" --gtest_filter="$filter" 2>&1)
rc=$?
printf '%s\n' "$out" | tail -n 40
if [ $rc -ne 0 ]; then
  echo "KILLED: the injected bug made the regression test fail (exit $rc)"
  exit 0
fi
if printf '%s\n' "$out" | grep -q '\[  SKIPPED \]'; then
  echo "SKIPPED: the regression test could not run here (no GPU)"
  exit 77
fi
if printf '%s\n' "$out" | grep -q '\[  PASSED  \] 0 tests'; then
  echo "ERROR: filter '$filter' matched no test"
  exit 1
fi
echo "SURVIVED: every test passed with the bug injected; the regression test does not catch it"
exit 1
