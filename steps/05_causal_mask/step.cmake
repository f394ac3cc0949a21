# The static rules of step 04 (the mask adds no instruction class).
# Cases: bottom-right alignment with N_q < N_kv, and with N_q > N_kv, where the first N_q - N_kv
# rows see no key (O = 0); a long top-left causal row at D = 128.
fa_step(05 causal_mask BASE 04
  STATIC REQUIRE HMMA LDSM FORBID LDGSTS HMMA_PER_KV_TILE 64 KERNEL attention_kernel
  CASES "causal_bottom_right=--b 1 --h 4 --nq 1013 --nkv 1531 --d 64 --causal --bottom-right"
        "fully_masked_rows=--b 2 --h 2 --hkv 1 --nq 1531 --nkv 1013 --d 128 --causal --bottom-right"
        "causal_long=--b 1 --h 2 --n 8192 --d 128 --causal")
