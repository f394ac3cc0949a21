# Step 20's backward with dQ's atomics two columns at a time. It runs step 17's tests (both modes)
# and step 18's repeatability test. A second SASS check, on sm_90's backward kernels: dQ goes out
# as vector atomics (REDG.E.ADD.F32x2, at least one per fragment pair: 8 per kernel at both head
# dims' 32 columns per warp) and no scalar fp32 atomic is left (REDG.E.ADD.F32, which the vector
# form does not match). A build without sm_90 code reports the check skipped.
fa_step(21 backward_vector_atomics BASE 20
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 17 18)
fa_step_static_check(21 vector_atomics ARCH sm_90a? MIN_COUNT REDG.E.ADD.F32x2:8 FORBID REDG.E.ADD.F32
  KERNEL backward_kernel)
