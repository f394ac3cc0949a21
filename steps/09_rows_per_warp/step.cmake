# The instructions of step 08, and twice its HMMA per K/V tile: every warp owns two 16-row tiles,
# so each kernel has at least 2·2·(D/16)·(BLOCK_N/8) HMMA (one K/V tile, both matmuls, both row
# tiles). The tuner tests of step 06, the LSE tests of step 07 and the cp.async tests of step 08
# run here too. Cases: a long causal row at D = 128 (both row tiles of a warp straddle the
# diagonal), N_q below one warp's 32 rows, and causal bottom-right cross-attention under GQA.
fa_step(09 rows_per_warp BASE 08
  STATIC REQUIRE HMMA LDSM LDGSTS HMMA_PER_KV_TILE 64:2 KERNEL attention_kernel
  CASES "causal_long_d128=--b 1 --h 4 --n 8192 --d 128 --causal"
        "nq_below_a_warp=--b 2 --h 2 --nq 19 --nkv 333 --d 64 --causal --bottom-right"
        "causal_gqa=--b 2 --h 4 --hkv 2 --nq 1013 --nkv 1531 --d 128 --causal --bottom-right"
  TESTS_FROM 06 07 08)
