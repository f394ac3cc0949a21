# Step 10's kernel with flash-attn's sliding window: the K/V tiles of a Q tile are a band
# (kv_tile_span), loaded from its first tile and masked at both ends (WindowMask). The step suite
# adds its window cases to every step that takes a window (tests/gpu/step_suite.cpp: tiles masked
# at both ends, windows narrower and wider than a tile, one side unbounded, with and without
# causal, both alignments, N_q != N_kv, GQA, rows that see no key); step 10's cases run here too.
fa_step(38 sliding_window BASE 10
  STATIC REQUIRE HMMA LDSM LDGSTS HMMA_PER_KV_TILE 64:2 KERNEL attention_kernel
  CASES "window_1k=--b 1 --h 4 --n 8192 --d 128 --causal --window 1024,-1"
        "window_both_sides=--b 2 --h 4 --hkv 2 --nq 1531 --nkv 1013 --d 64 --window 100,50"
  CASES_FROM 10
  TESTS_FROM 06 07 08)
