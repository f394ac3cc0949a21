# The baseline: no instruction rules, but no local memory either (the static check always asks).
# Cases: the full S buffer at a ragged GQA shape, and D = 128.
fa_step(00 naive
  CASES "ragged_gqa=--b 2 --h 4 --hkv 2 --nq 1013 --nkv 1531 --d 64"
        "d128=--b 1 --h 2 --n 2048 --d 128"
        "one_query=--b 3 --h 2 --nq 1 --nkv 777 --d 64")
