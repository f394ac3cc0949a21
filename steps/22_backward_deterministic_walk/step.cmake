# Step 21's backward with the deterministic mode walking each block's Q tiles down. It runs step
# 17's tests (both modes) and step 18's repeatability test; the walk and the turnstile model that
# explains it are tested on the CPU (tests/cpu/q_tile_walk_test.cpp). Step 21's SASS rules hold.
fa_step(22 backward_deterministic_walk BASE 21
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 17 18)
fa_step_static_check(22 vector_atomics ARCH sm_90a? MIN_COUNT REDG.E.ADD.F32x2:8 FORBID REDG.E.ADD.F32
  KERNEL backward_kernel)
