# Step 25's backward with each block walking its Q tiles from a start of its own (the walk itself
# is checked on the CPU: tests/cpu/q_tile_walk_test.cpp). It runs step 17's tests (both modes) and
# step 18's repeatability test, and step 24's SASS rules hold for its main kernel.
fa_step(27 backward_shifted_walk BASE 25 ARCH 90a
  STATIC REQUIRE HGMMA LDGSTS REDG.E.ADD.F32x4 FORBID HMMA LDSM REDG.E.ADD.F32 REDG.E.ADD.F32x2
         KERNEL backward_kernel
  TESTS_FROM 06 07 17 18)
