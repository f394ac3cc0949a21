# Step 33's backward warp-specialised: a producer warp loads every work item (Q and dO through the
# copy engine, the LSE and D rows by its lanes) behind full/empty mbarriers, two consumer warpgroups
# compute step 33's products, dSᵀ in two tiles so that one barrier per item separates the
# consumers. It runs step 17's tests (both modes), step 18's repeatability test and step 06's
# autotune tests unchanged.
fa_step(34 backward_warp_specialized BASE 33 ARCH 90a
  STATIC REQUIRE HGMMA UTMALDG SYNCS USETMAXREG REDG.E.ADD.F32x4 FORBID HMMA LDSM LDGSTS REDG.E.ADD.F32 REDG.E.ADD.F32x2
         KERNEL backward_kernel
  TESTS_FROM 06 07 17 18)
