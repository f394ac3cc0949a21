# Built for sm_90a alone (ARCH). Static rules: step 12's (UTMALDG, SYNCS, HGMMA; no LDGSTS, HMMA,
# LDSM; wgmmas not serialised), plus USETMAXREG: ptxas honoured setmaxnreg (when it ignores it,
# warning C7508, the instruction is absent and every warp keeps the entry cap). The no-spill
# rule matters most here: each role is compiled to its setmaxnreg budget. Cases: step 12's.
fa_step(15 intra_wg_overlap BASE 14 ARCH 90a
  STATIC REQUIRE HGMMA UTMALDG SYNCS USETMAXREG FORBID HMMA LDSM LDGSTS MAX_COUNT WARPGROUP.ARRIVE:4
         KERNEL attention_kernel
  CASES "long_d128=--b 1 --h 4 --n 8192 --d 128"
        "one_ragged_tile=--b 2 --h 3 --nq 300 --nkv 17 --d 64"
        "causal_gqa=--b 2 --h 4 --hkv 2 --nq 1531 --nkv 1013 --d 128 --causal --bottom-right"
        "bnhd_ragged=--b 2 --h 5 --hkv 1 --nq 333 --nkv 1001 --d 64 --bnhd --causal"
  TESTS_FROM 06 07 08 10)
