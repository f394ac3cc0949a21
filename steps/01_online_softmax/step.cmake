# CUDA cores, registers only: the running max/sum/output arrays are indexed by unrolled loops, so
# the static check's "no local memory" is the rule that matters here.
fa_step(01 online_softmax BASE 00
  CASES "ragged=--b 1 --h 3 --nq 1013 --nkv 1531 --d 64"
        "short_rows=--b 2 --h 3 --nq 17 --nkv 17 --d 128"
        "gqa=--b 2 --h 8 --hkv 2 --n 1024 --d 64")
