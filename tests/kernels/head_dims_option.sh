#!/usr/bin/env bash
# tests/kernels/head_dims_option.sh SRC NVCC CUOBJDUMP
# FA_HEAD_DIMS chooses what the production kernels are compiled for:
#  1. a head dim without a kernel stops the configure, naming the supported ones (CMake wraps the
#     message's lines: they are joined first);
#  2. the Hopper kernel compiled for D = 128 alone (FA_KERNEL_HEAD_DIM_MASK, as kernels.cmake
#     passes it) holds D = 128 kernels and no D = 64 one;
#  3. FA_DTYPES likewise: a type without a kernel stops the configure naming the supported ones, and
#     so does a list without bf16 (the lessons are bf16);
#  4. compiled with both element types (FA_KERNEL_DTYPE_MASK), the same kernel holds bf16 and fp16
#     kernels, each multiplying in its own type.
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

expect_refused() {  # $1: the -D option, $2: what the message must say
  local out
  rm -rf "$tmp/cfg"  # a fresh cache: the last configure's options would be read again
  out=$(cmake -S "$src" -B "$tmp/cfg" -G Ninja -DFA_BUILD_TESTS=OFF "$1" 2>&1)
  if [ $? -eq 0 ]; then
    echo "FAIL: configure with $1 succeeded"; fail=1
  elif ! tr -s ' \n' '  ' <<<"$out" | grep -qF "$2"; then
    echo "FAIL: configure refused $1 without saying: $2"; tail -5 <<<"$out"; fail=1
  else
    echo "ok: $1 refused: $2"
  fi
}
expect_refused "-DFA_DTYPES=bf16;fp32" "FA_DTYPES: element type fp32 has no production kernel yet (supported: bf16 fp16)"
expect_refused "-DFA_DTYPES=fp16" "FA_DTYPES must include bf16"

# D = 128 alone, in both element types (FA_KERNEL_DTYPE_MASK bits 0 and 1, as FA_DTYPES=bf16;fp16
# passes them): the one place a default (bf16) build compiles the fp16 kernels, so that they keep
# compiling where CI runs. Each type's kernels multiply in their own type: no .BF16 wgmma in an fp16
# kernel (it would read fp16 bits as bf16), nothing but .BF16 in a bf16 one.
"$nvcc" -std=c++20 -O3 -arch=sm_90a -diag-suppress=177 -I"$src" -I"$src/include" -DFA_BUILD_ID='"head_dims_option"' \
  "-DFA_KERNEL_HEAD_DIM_MASK=$(printf '0x%xull' $((1 << (128 / 8))))" -DFA_KERNEL_DTYPE_MASK=0x3u \
  -c "$src/kernels/fwd_hopper.cu" -o "$tmp/k.o" || {
  echo "FAIL: kernels/fwd_hopper.cu does not compile for D = 128 alone in bf16 and fp16"; exit 1; }
sass=$("$cuobjdump" -sass "$tmp/k.o")
kernels=$(grep -o 'attention_kernelILi[0-9]*E.*E\(13__nv_bfloat16\|6__half\)' <<<"$sass" |
  sed 's/attention_kernelILi\([0-9]*\)E.*E\(13__nv_bfloat16\|6__half\)$/D=\1 \2/' | sort | uniq -c)
echo "$kernels"
grep -q 'D=128 13__nv_bfloat16' <<<"$kernels" || { echo "FAIL: no bf16 D = 128 kernel"; fail=1; }
grep -q 'D=128 6__half' <<<"$kernels" || { echo "FAIL: no fp16 D = 128 kernel"; fail=1; }
grep -q 'D=64 ' <<<"$kernels" && { echo "FAIL: a D = 64 kernel was compiled"; fail=1; }
[ $fail = 0 ] && echo "ok: D = 128 kernels only, bf16 and fp16"
# Each function's wgmmas, by the type in its name.
wgmma=$(awk '/Function : /{t = /6__half/ ? "fp16" : "bf16"} /HGMMA/{f = /F32\.BF16/ ? "bf16" : "fp16"; print t, f}' <<<"$sass" |
  sort | uniq -c)
echo "$wgmma"
grep -q 'fp16 bf16' <<<"$wgmma" && { echo "FAIL: an fp16 kernel issues a bf16 wgmma"; fail=1; }
grep -q 'bf16 fp16' <<<"$wgmma" && { echo "FAIL: a bf16 kernel issues an fp16 wgmma"; fail=1; }
grep -q 'fp16 fp16' <<<"$wgmma" && grep -q 'bf16 bf16' <<<"$wgmma" || { echo "FAIL: a type without wgmma"; fail=1; }
[ $fail = 0 ] && echo "ok: each type's kernels multiply in their own type"
exit $fail
