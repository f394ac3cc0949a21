#!/usr/bin/env bash
# scripts/diff_steps.sh NN     what step NN teaches: its attention.cu against the one of the step it
#                              grew from (BASE in steps/NN_name/step.cmake). Example: scripts/diff_steps.sh 04
# scripts/diff_steps.sh A B    step B's attention.cu against step A's, for any two steps.
# Only the kernels are diffed, followed by the device-layer building blocks (device/) the newer
# step starts or stops using (scripts/device_symbols.py). The two lessons are different texts, written to be read side by
# side rather than as a diff, so their paths are printed instead. Whitespace-only changes
# (re-indentation when a loop is added) are hidden; set DIFF_EXACT=1 to see them too. The last
# line counts the changed lines.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 <step>            e.g. $0 04     (against its base)" >&2
  echo "       $0 <step A> <step B> e.g. $0 02 03" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
find_step() {
  local n
  n=$(printf '%02d' "$((10#$1))")
  local dirs=(steps/"$n"_*)
  if [ ! -d "${dirs[0]}" ]; then
    echo "no step $n (folders: $(cd steps && ls -d */ | tr -d / | tr '\n' ' '))" >&2
    exit 2
  fi
  echo "${dirs[0]}"
}
if [ $# -eq 2 ]; then
  a=$(find_step "$1")
  b=$(find_step "$2")
else
  b=$(find_step "$1")
  base=$(sed 's/#.*//' "$b/step.cmake" 2>/dev/null | grep -oE '\bBASE[[:space:]]+[0-9]{2}\b' | grep -oE '[0-9]{2}$' || true)
  if [ -z "$base" ]; then
    echo "$(basename "$b") has no BASE in its step.cmake (it is a first step): name two steps, $0 A B" >&2
    exit 2
  fi
  a=$(find_step "$base")
fi
opts=()
[ "${DIFF_EXACT:-0}" = 1 ] || opts+=(--ignore-all-space)
color=()
[ -t 1 ] && color=(--color=always)
echo "=== attention.cu: $(basename "$a") -> $(basename "$b")"
git --no-pager diff --no-index "${color[@]}" "${opts[@]}" "$a/attention.cu" "$b/attention.cu" || true
python3 scripts/device_symbols.py "$a/attention.cu" "$b/attention.cu" || true
echo "=== the lessons, to read side by side:"
echo "  $a/README.md"
echo "  $b/README.md"
added=0 removed=0
read -r added removed _ < <(git --no-pager diff --no-index --numstat "${opts[@]}" "$a/attention.cu" "$b/attention.cu" || true) || true
echo "=== $(basename "$a") -> $(basename "$b"): ${added:-0} lines added, ${removed:-0} removed in attention.cu${opts:+ (whitespace ignored)}"
