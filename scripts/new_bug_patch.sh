#!/usr/bin/env bash
# scripts/new_bug_patch.sh NN bug-name "Test filter" "one-line description" catalog-id
# Starts a bug-catalog patch: copies steps/NN_*/attention.cu to a scratch folder, opens $EDITOR
# on the copy (or waits for you to edit it), and writes steps/NN_name/bugs/bug-name.patch with the
# header the build reads (Bug/Catalog/Test) followed by the unified diff. The build names the
# mutant bug.NN-bug-name (tests/bugs/mutants.cmake).
set -euo pipefail
[ $# -eq 5 ] || { echo "usage: $0 NN bug-name 'Test filter' 'description' catalog-id" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
nn=$1 bug=$2 filter=$3 desc=$4 cat_id=$5
dir=$(cd "$root" && ls -d steps/"$nn"_* | head -1)
tmp=$(mktemp -d)
mkdir -p "$tmp/a/$dir" "$tmp/b/$dir"
cp "$root/$dir/attention.cu" "$tmp/a/$dir/"
cp "$root/$dir/attention.cu" "$tmp/b/$dir/"
if [ -n "${FA_EDIT_CMD:-}" ]; then
  (cd "$tmp/b/$dir" && eval "$FA_EDIT_CMD")   # non-interactive edit, e.g. a sed command on attention.cu
else
  "${EDITOR:-vi}" "$tmp/b/$dir/attention.cu"
fi
mkdir -p "$root/$dir/bugs"
out="$root/$dir/bugs/$bug.patch"
{
  printf 'Bug: %s\nCatalog: %s\nTest: %s\n\n' "$desc" "$cat_id" "$filter"
  (cd "$tmp" && diff -u "a/$dir/attention.cu" "b/$dir/attention.cu" | sed -E 's/^(---|\+\+\+) ([^\t]+)\t.*/\1 \2/') || true
} >"$out"
grep -q '^@@' "$out" || { echo "no change made; removing $out" >&2; rm "$out"; exit 1; }
echo "wrote $out"
