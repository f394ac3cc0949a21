# Step 36's backward with Q tiles of 128 queries at D = 64: each consumer computes its own 64
# queries' dQ over all 128 keys, no partial products summed. It runs step 17's tests (both modes),
# step 18's repeatability test and step 06's autotune tests unchanged.
fa_step(37 backward_wide_q_tiles BASE 36 ARCH 90a
  STATIC REQUIRE HGMMA UTMALDG UTMAREDG SYNCS USETMAXREG FORBID HMMA LDSM LDGSTS REDG ATOMG
         KERNEL backward_kernel
  TESTS_FROM 06 07 17 18)
