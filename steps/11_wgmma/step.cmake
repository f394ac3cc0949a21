# Built for sm_90a alone (ARCH): wgmma exists nowhere else. The static check wants HGMMA and no
# HMMA (nothing left on mma.sync) and no LDSM (wgmma reads shared memory itself); the cp.async
# copies (LDGSTS) of Part II; two proxy fences per kernel (after Q lands, and after each K/V tile
# lands); and at most two WARPGROUP.ARRIVE per kernel, one per product: more means the compiler
# serialised the wgmmas (it does so when the code touches accumulators in flight). Cases: a long
# row at D = 128 (the 128 K/V tiles of the lazy rescale), N_kv of one ragged tile, and causal
# bottom-right cross-attention under GQA.
fa_step(11 wgmma BASE 10 ARCH 90a
  STATIC REQUIRE HGMMA LDGSTS FORBID HMMA LDSM MIN_COUNT FENCE.VIEW.ASYNC.S:2 MAX_COUNT WARPGROUP.ARRIVE:2
         KERNEL attention_kernel
  CASES "long_d128=--b 1 --h 4 --n 8192 --d 128"
        "one_ragged_tile=--b 2 --h 3 --nq 300 --nkv 17 --d 64"
        "causal_gqa=--b 2 --h 4 --hkv 2 --nq 1531 --nkv 1013 --d 128 --causal --bottom-right"
  TESTS_FROM 06 07 08 10)
