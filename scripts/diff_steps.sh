#!/usr/bin/env bash
# scripts/diff_steps.sh A B — what step B teaches over step A: the two steps' attention.cu and
# README.md as unified diffs. Example: scripts/diff_steps.sh 02 03
# Whitespace-only changes (re-indentation when a loop is added) are hidden; set DIFF_EXACT=1 to
# see them too.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 <step A> <step B>   e.g. $0 02 03" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
find_step() {
  local n
  n=$(printf '%02d' "$((10#$1))")
  local dirs=("$root"/steps/"$n"_*)
  if [ ! -d "${dirs[0]}" ]; then
    echo "no step $n (folders: $(cd "$root/steps" && ls -d */ | tr -d / | tr '\n' ' '))" >&2
    exit 2
  fi
  echo "${dirs[0]}"
}
a=$(find_step "$1")
b=$(find_step "$2")
color=()
[ -t 1 ] && color=(--color=always)
[ "${DIFF_EXACT:-0}" = 1 ] || color+=(--ignore-all-space)
for f in attention.cu README.md; do
  echo "=== $f: $(basename "$a") -> $(basename "$b")"
  git --no-pager diff --no-index "${color[@]}" "$a/$f" "$b/$f" || true
done
