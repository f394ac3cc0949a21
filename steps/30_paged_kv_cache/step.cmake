# Step 29's kernel reading K and V through a block table (Part V): a pool of pages, each sequence's
# keys wherever its row of the table says. The shared suite runs it unpaged; steps 27-29's tests
# run it split, packed and ragged; its own tests scatter every sequence's keys over shuffled pages
# of sizes 1 to 256, the pool's other pages poisoned.
fa_step(30 paged_kv_cache BASE 29
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 08 27 28 29)
