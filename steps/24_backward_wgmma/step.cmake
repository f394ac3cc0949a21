# Step 23's backward with its products as wgmma (two warpgroups, 64 keys each), built for sm_90a
# alone. It runs step 17's tests (both modes) and step 18's repeatability test; its new product,
# mma_at_b_async (dQ = dS·K from dSᵀ), is tested with the other wgmma operations
# (tests/hopper/wgmma_test.cu). The backward kernel must be all wgmma: HGMMA and no HMMA, no LDSM
# (wgmma reads shared memory itself); dQ leaves through 16-byte atomics from shared memory
# (REDG.E.ADD.F32x4), no narrower ones; and no local memory (the default rule: 254 registers at
# D = 128, where hoisted wgmma descriptors once spilled 136 bytes).
fa_step(24 backward_wgmma BASE 23 ARCH 90a
  STATIC REQUIRE HGMMA LDGSTS REDG.E.ADD.F32x4 FORBID HMMA LDSM REDG.E.ADD.F32 REDG.E.ADD.F32x2
         KERNEL backward_kernel
  TESTS_FROM 06 07 17 18)
