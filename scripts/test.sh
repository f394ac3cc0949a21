#!/usr/bin/env bash
# The test command: configure, build, run every test. Non-zero on any failure.
#   scripts/test.sh                 release build in build/, all tests
#   scripts/test.sh -L step03       only the tests with a ctest label (cpu, gpu, static, bug, stepNN)
# Environment: BUILD_DIR (default build), FA_PRESET (default release), JOBS (default: all cores),
# extra CMake arguments in FA_CMAKE_ARGS (e.g. -DCMAKE_CUDA_ARCHITECTURES=native).
# Without a GPU the GPU tests are reported as skipped, never as passed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

scripts/install_deps.sh
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${FA_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
cd "$build"
ctest --output-on-failure -j "$jobs" --timeout 1800 "$@"
