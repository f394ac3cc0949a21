# Step 25's backward with dQ added into its accumulator by the copy engine (a TMA bulk reduce-add)
# instead of the warps' atomics. It runs step 17's tests (both modes) and step 18's repeatability
# test; its new operations (store_rows_f32_swizzled, tma_reduce_add_3d with make_accum_map) have
# their own test (tests/) against a CPU model. The backward kernel must be all wgmma (HGMMA, no
# HMMA, no LDSM), reach dQ through the bulk reduce (UTMAREDG) and carry no atomic at all (REDG and
# ATOMG forbidden), and use no local memory (254 registers at D = 128 with two dQ stages per
# warpgroup; with one, the wait for the copy engine's read sat mid-loop and spilled 28 bytes).
fa_step(26 backward_dq_bulk_reduce BASE 25 ARCH 90a
  STATIC REQUIRE HGMMA LDGSTS UTMAREDG FORBID HMMA LDSM REDG ATOMG
         KERNEL backward_kernel
  TESTS_FROM 06 07 17 18)
# The measurement behind the lesson: fp32 additions per second from every SM, by atomics and by
# the copy engine (reduce_rate.cu; `build/fa_reduce_rate` on an H100/H200).
add_executable(fa_reduce_rate ${CMAKE_CURRENT_LIST_DIR}/reduce_rate.cu)
set_target_properties(fa_reduce_rate PROPERTIES CUDA_ARCHITECTURES 90a)
target_link_libraries(fa_reduce_rate PRIVATE fa_library)
