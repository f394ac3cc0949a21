# Cases: a last K/V tile with one real key, a partial last Q tile, and D = 128 under GQA.
fa_step(02 tiled_fa1 BASE 01
  CASES "one_key=--b 1 --h 1 --nq 333 --nkv 1 --d 64"
        "ragged_tiles=--b 1 --h 2 --nq 1531 --nkv 1013 --d 64"
        "gqa_d128=--b 2 --h 4 --hkv 2 --n 1024 --d 128")
