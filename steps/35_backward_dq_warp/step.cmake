# Step 34's backward with its dQ additions moved to a warp of their own (the producer warpgroup's
# second warp): the consumers stage their products and arrive on an mbarrier, the dQ warp adds them
# with 16-byte atomics and hands the stage back on another. It runs step 17's tests (both modes),
# step 18's repeatability test and step 06's autotune tests unchanged.
fa_step(35 backward_dq_warp BASE 34 ARCH 90a
  STATIC REQUIRE HGMMA UTMALDG SYNCS USETMAXREG REDG.E.ADD.F32x4 FORBID HMMA LDSM LDGSTS REDG.E.ADD.F32 REDG.E.ADD.F32x2
         KERNEL backward_kernel
  TESTS_FROM 06 07 17 18)
