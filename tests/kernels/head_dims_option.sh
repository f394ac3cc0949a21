#!/usr/bin/env bash
# tests/kernels/head_dims_option.sh SRC NVCC CUOBJDUMP
# FA_HEAD_DIMS chooses what the production kernels are compiled for:
#  1. a head dim without a kernel stops the configure, naming the supported ones (CMake wraps the
#     message's lines: they are joined first);
#  2. the Hopper kernel compiled for D = 128 alone (FA_KERNEL_HEAD_DIM_MASK, as kernels.cmake
#     passes it) holds D = 128 kernels and no D = 64 one.
set -uo pipefail
src=$1 nvcc=$2 cuobjdump=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

out=$(cmake -S "$src" -B "$tmp/cfg" -G Ninja -DFA_BUILD_TESTS=OFF -DFA_HEAD_DIMS="64;80" 2>&1)
if [ $? -eq 0 ]; then
  echo "FAIL: configure with FA_HEAD_DIMS=64;80 succeeded"; fail=1
elif ! tr -s ' \n' '  ' <<<"$out" | grep -q "FA_HEAD_DIMS: head dim 80 has no production kernel yet (supported: 32 64 96 128 192 256)"; then
  echo "FAIL: configure refused FA_HEAD_DIMS=64;80 without naming the supported head dims:"; tail -5 <<<"$out"; fail=1
else
  echo "ok: FA_HEAD_DIMS=64;80 refused, the supported head dims named"
fi

"$nvcc" -std=c++20 -O3 -arch=sm_90a -diag-suppress=177 -I"$src" -I"$src/include" -DFA_BUILD_ID='"head_dims_option"' \
  "-DFA_KERNEL_HEAD_DIM_MASK=$(printf '0x%xull' $((1 << (128 / 8))))" -c "$src/kernels/fwd_hopper.cu" -o "$tmp/k.o" || {
  echo "FAIL: kernels/fwd_hopper.cu does not compile for D = 128 alone"; exit 1; }
kernels=$("$cuobjdump" -sass "$tmp/k.o" | grep -o 'attention_kernelILi[0-9]*E' | sort | uniq -c)
echo "$kernels"
grep -q 'attention_kernelILi128E' <<<"$kernels" || { echo "FAIL: no D = 128 kernel"; fail=1; }
grep -q 'attention_kernelILi64E' <<<"$kernels" && { echo "FAIL: a D = 64 kernel was compiled"; fail=1; }
[ $fail = 0 ] && echo "ok: D = 128 kernels only"
exit $fail
