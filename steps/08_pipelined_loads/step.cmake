# The K/V tiles now arrive by LDGSTS (cp.async) while the previous tile is being computed: the
# instruction steps 04-07 are forbidden to use is required here, beside HMMA and LDSM. The tuner
# tests of step 06 (every config checked, with LSE) and the LSE tests of step 07 run here too.
# Cases: a long row (many tiles in flight), a K/V sequence shorter than one tile (nothing to
# prefetch), and causal bottom-right cross-attention.
fa_step(08 pipelined_loads BASE 07
  STATIC REQUIRE HMMA LDSM LDGSTS HMMA_PER_KV_TILE 64 KERNEL attention_kernel
  CASES "long_d128=--b 1 --h 4 --n 8192 --d 128"
        "kv_shorter_than_tile=--b 1 --h 2 --nq 333 --nkv 17 --d 64 --causal --bottom-right"
        "causal_gqa=--b 2 --h 4 --hkv 2 --nq 1013 --nkv 1531 --d 64 --causal --bottom-right"
  TESTS_FROM 06 07)
