# The rules of step 04. The tuner tests of step 06 run here too (every config, with LSE). fa2 run checks the LSE against the reference too (the step writes it).
# Cases: causal bottom-right under MQA, rows with no visible key (LSE = -inf), and N = 8192.
fa_step(07 lse_store BASE 06
  STATIC REQUIRE HMMA LDSM FORBID LDGSTS HMMA_PER_KV_TILE 64 KERNEL attention_kernel
  CASES "lse_causal_mqa=--b 1 --h 4 --hkv 1 --nq 1013 --nkv 1531 --d 64 --causal --bottom-right"
        "lse_fully_masked_rows=--b 1 --h 2 --nq 1531 --nkv 1013 --d 128 --causal --bottom-right"
        "lse_long=--b 1 --h 2 --n 8192 --d 64"
  TESTS_FROM 06)
