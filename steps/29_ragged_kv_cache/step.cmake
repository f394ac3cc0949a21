# Step 28's packed split-KV kernel with a length per sequence (Part V): a batch of KV caches of
# different lengths in one call. The shared suite runs it without lengths; steps 27 and 28's tests
# run it split and packed; its own tests give every sequence its own length, K and V poisoned past
# each.
fa_step(29 ragged_kv_cache BASE 28
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 08 27 28)
