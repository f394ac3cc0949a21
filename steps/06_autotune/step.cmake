# Every tuned config is an attention_kernel instantiation: the rules of step 04 hold for each.
# Cases: the tuner's first call (it times every config, then runs the fastest) on a causal GQA
# shape and on a non-causal one.
fa_step(06 autotune BASE 05
  STATIC REQUIRE HMMA LDSM FORBID LDGSTS HMMA_PER_KV_TILE 64 KERNEL attention_kernel
  CASES "causal_gqa_d128=--b 2 --h 8 --hkv 2 --nq 1013 --nkv 1531 --d 128 --causal --bottom-right"
        "ragged=--b 1 --h 3 --nq 1531 --nkv 1013 --d 64")
