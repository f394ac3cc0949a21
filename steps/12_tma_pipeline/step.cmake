# Built for sm_90a alone (ARCH), like step 11. The static check wants the copy engine (UTMALDG)
# and mbarrier waits (SYNCS), and no cp.async (LDGSTS) left; HGMMA and no HMMA or LDSM as in
# step 11; at most two WARPGROUP.ARRIVE per kernel (the wgmmas not serialised). Cases: step 11's,
# plus the (B, N, H, D) layout at a ragged N, whose rows the tensor map steps by H·D.
fa_step(12 tma_pipeline BASE 11 ARCH 90a
  STATIC REQUIRE HGMMA UTMALDG SYNCS FORBID HMMA LDSM LDGSTS MAX_COUNT WARPGROUP.ARRIVE:2
         KERNEL attention_kernel
  CASES "long_d128=--b 1 --h 4 --n 8192 --d 128"
        "one_ragged_tile=--b 2 --h 3 --nq 300 --nkv 17 --d 64"
        "causal_gqa=--b 2 --h 4 --hkv 2 --nq 1531 --nkv 1013 --d 128 --causal --bottom-right"
        "bnhd_ragged=--b 2 --h 5 --hkv 1 --nq 333 --nkv 1001 --d 64 --bnhd --causal"
  TESTS_FROM 06 07 08 10)
