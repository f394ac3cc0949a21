# Step 24's backward with its two streaming kernels (the preprocess, which now also zeroes dQ's
# accumulator, and the convert) rewritten as a quad per row with 16-byte accesses. It runs step
# 17's tests (both modes; the workspace they pass is poisoned, so a row of dQ's accumulator the
# preprocess failed to zero shows) and step 18's repeatability test. The main kernel is step 24's,
# under step 24's SASS rules.
fa_step(25 backward_streaming_kernels BASE 24 ARCH 90a
  STATIC REQUIRE HGMMA LDGSTS REDG.E.ADD.F32x4 FORBID HMMA LDSM REDG.E.ADD.F32 REDG.E.ADD.F32x2
         KERNEL backward_kernel
  TESTS_FROM 06 07 17 18)
