# Cases: the grid decode (B > 1, H > 1, one query), the last Q tile's store bound, and the
# (B, N, H, D) layout with GQA at D = 128.
fa_step(03 fa2_grid BASE 02
  CASES "grid_decode=--b 3 --h 2 --nq 1 --nkv 777 --d 64"
        "ragged_store=--b 1 --h 2 --nq 1531 --nkv 1013 --d 64"
        "bnhd_gqa_d128=--b 2 --h 8 --hkv 2 --n 1024 --d 128 --bnhd")
