# Step 09's instructions and HMMA per K/V tile; the tuner, LSE and cp.async tests of steps 06-08
# run here too. Cases: a long row at D = 128 (128 KV tiles, nearly all of them skipping the
# rescale), N_kv of one ragged tile (the first and only tile must rescale from -inf),
# and causal bottom-right cross-attention under GQA, where some rows see no key at all.
fa_step(10 lazy_rescale BASE 09
  STATIC REQUIRE HMMA LDSM LDGSTS HMMA_PER_KV_TILE 64:2 KERNEL attention_kernel
  CASES "long_d128=--b 1 --h 4 --n 8192 --d 128"
        "one_ragged_tile=--b 2 --h 3 --nq 300 --nkv 17 --d 64"
        "causal_gqa=--b 2 --h 4 --hkv 2 --nq 1531 --nkv 1013 --d 128 --causal --bottom-right"
  TESTS_FROM 06 07 08)
