# Step 35's backward with the dQ warp's atomics replaced by the copy engine's bulk reduce-add: the
# consumers stage their products in TMA's 128-byte swizzle (two stages), the dQ warp's lane 0 issues
# the reduces. It runs step 17's tests (both modes), step 18's repeatability test and step 06's
# autotune tests unchanged.
fa_step(36 backward_dq_bulk_warp BASE 35 ARCH 90a
  STATIC REQUIRE HGMMA UTMALDG UTMAREDG SYNCS USETMAXREG FORBID HMMA LDSM LDGSTS REDG ATOMG
         KERNEL backward_kernel
  TESTS_FROM 06 07 17 18)
