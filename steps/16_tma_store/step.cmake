# Built for sm_90a alone (ARCH). Static rules on every kernel: step 15's, plus UTMASTG (O leaves
# through the copy engine, not through per-thread global stores). On the kernels whose O goes
# through shared memory (Config<..., O_VIA_SMEM = true>, "Lb1E" in the mangled name), a second
# check: two FENCE.VIEW.ASYNC.S each (the barrier initialisation's, and the O tile's before the
# copy engine reads it); the one D = 128 configuration that keeps step 15's store has one.
# Cases: step 12's.
fa_step(16 tma_store BASE 15 ARCH 90a
  STATIC REQUIRE HGMMA UTMALDG UTMASTG SYNCS USETMAXREG FORBID HMMA LDSM LDGSTS MAX_COUNT WARPGROUP.ARRIVE:4
         KERNEL attention_kernel
  CASES_FROM 12
  TESTS_FROM 06 07 08 10)
fa_step_static_check(16 o_tile MIN_COUNT FENCE.VIEW.ASYNC.S:2 KERNEL "attention_kernel.*Lb1E")
