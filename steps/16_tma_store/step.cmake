# Built for sm_90a alone (ARCH). Static rules, on the kernels whose O leaves through shared memory
# (Config<..., O_VIA_SMEM = true>, "Lb1E" in the mangled name; the one D = 128 configuration that
# keeps step 15's store is step 15's kernel, and is checked for local memory like every kernel):
# step 15's, plus UTMASTG (O leaves through the copy engine, not through per-thread global stores)
# and two FENCE.VIEW.ASYNC.S (the barrier initialisation's, and the O tile's before the copy
# engine reads it). Cases: step 12's.
fa_step(16 tma_store BASE 15 ARCH 90a
  STATIC REQUIRE HGMMA UTMALDG UTMASTG SYNCS USETMAXREG FORBID HMMA LDSM LDGSTS MAX_COUNT WARPGROUP.ARRIVE:4
         MIN_COUNT FENCE.VIEW.ASYNC.S:2
         KERNEL attention_kernel.*Lb1E
  CASES_FROM 12
  TESTS_FROM 06 07 08 10)
