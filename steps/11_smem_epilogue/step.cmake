# Step 10's instructions and HMMA per K/V tile, and now 16-byte global stores (STG.E.128) for O;
# the tuner, LSE and cp.async tests of steps 06-08 run here too. Cases: N_q ending inside a warp's
# 32 rows (the copy must stop at N_q), O in the BNHD layout (rows H·D elements apart: the copy
# must step by the row stride, not by D), and causal bottom-right cross-attention under GQA.
fa_step(11 smem_epilogue BASE 10
  STATIC REQUIRE HMMA LDSM LDGSTS STG.E.128 HMMA_PER_KV_TILE 64:2 KERNEL attention_kernel
  CASES "nq_inside_a_warp=--b 2 --h 3 --nq 77 --nkv 300 --d 128"
        "bnhd_d64=--b 2 --h 4 --n 1013 --d 64 --bnhd"
        "causal_gqa=--b 2 --h 4 --hkv 2 --nq 1013 --nkv 1531 --d 128 --causal --bottom-right"
  TESTS_FROM 06 07 08)
