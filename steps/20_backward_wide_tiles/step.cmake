# Step 19's backward on wider block tiles: 128 keys per block (8 warps), 64 queries per Q tile at
# D = 64 and 32 at D = 128. It runs step 17's tests (both modes) and step 18's repeatability test.
fa_step(20 backward_wide_tiles BASE 19
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 17 18)
