#!/usr/bin/env bash
# The course's main job: configure, build, and run the step ladder (every step on one shape,
# checked against the reference and timed). Arguments go to `fa2 ladder`, e.g. --d 128.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${FA_CMAKE_ARGS:-}
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target fa2
"$build/fa2" ladder "$@"
