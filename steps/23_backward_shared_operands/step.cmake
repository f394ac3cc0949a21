# Step 22's backward with the warps tiling the scores in (32, 32) or (32, 16) blocks, Pᵀ and dSᵀ
# through shared memory. It runs step 17's tests (both modes) and step 18's repeatability test;
# its new operations (store_tile_rows, load_a_trans) have their own tests (tests/) against the
# CPU model of the fragment layout. Step 21's SASS rules hold: vector dQ atomics on sm_90.
fa_step(23 backward_shared_operands BASE 22
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 17 18)
fa_step_static_check(23 vector_atomics ARCH sm_90a? MIN_COUNT REDG.E.ADD.F32x2:8 FORBID REDG.E.ADD.F32
  KERNEL backward_kernel)
