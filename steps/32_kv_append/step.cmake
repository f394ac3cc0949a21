# Step 31's kernel with the new tokens' keys and values appended to the cache in the same call (Part
# V, flash_attn_with_kvcache's k and v): an append kernel writes them at each sequence's length,
# contiguous or through the block table, before the attention kernel reads them. Steps 27-31's tests
# run it without an append; its own append to contiguous and paged caches, against the reference on
# the grown cache, with every byte of the caches it must not write checked unchanged.
fa_step(32 kv_append BASE 31
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 08 27 28 29 30 31)
