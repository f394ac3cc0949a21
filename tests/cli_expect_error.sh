#!/usr/bin/env bash
# cli_expect_error.sh REGEX COMMAND...: passes when COMMAND exits non-zero AND prints REGEX.
# Used to show that bad input to `fa2` gives a clear error (with or without a GPU).
regex=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ $rc -eq 0 ]; then
  echo "expected a non-zero exit code"
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$regex"; then
  echo "expected the output to match: $regex"
  exit 1
fi
exit 0
