# Step 25's backward on an instruction diet: the same kernels, the same products and the same
# structure, with fewer instructions in the main loop. The wgmma descriptors are built once per
# product and advanced by addition (device/warpgroup_tile.h's by_addition forms), the warp index is
# made warp-uniform so that the K and V descriptors live in uniform registers, the LSE and D rows
# are copied in one shot instead of a loop, and the dQ atomics' addresses are computed where they
# are used (the registers the descriptors freed would otherwise go to hoisted addresses and spill).
# It runs step 17's tests (both modes) and step 18's repeatability test; the wgmma unit tests run
# both descriptor forms (hopper.Wgmma.ByAddition*), and a CPU test proves the descriptor identity.
fa_step(33 backward_instruction_diet BASE 25 ARCH 90a
  STATIC REQUIRE HGMMA LDGSTS REDG.E.ADD.F32x4 FORBID HMMA LDSM REDG.E.ADD.F32 REDG.E.ADD.F32x2
         KERNEL backward_kernel
  TESTS_FROM 06 07 17 18)

# The lesson's claim as checks that can fail: the main loop's instructions per thread, read from
# the SASS by scripts/sass_loop.py, under a bound that step 25's kernel exceeds (1,336 at D = 128,
# 1,046 at D = 64; step 33: 1,045 and 773 with CUDA 13.0). static.step33.loop_bound_fails_on_step25
# runs the D = 128 check on step 25's kernel and passes only if the check reports the excess.
if(FA_BUILD_TESTS)
  foreach(d 128 64)
    if(d EQUAL 128)
      set(bound 1100)
    else()
      set(bound 820)
    endif()
    add_test(NAME static.step33.loop_d${d}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/scripts/sass_loop.py $<TARGET_OBJECTS:fa_step33>
                     "backward_kernelILi${d}E.*Lb0E" --max-body ${bound} --cuobjdump ${FA_CUOBJDUMP})
    set_tests_properties(static.step33.loop_d${d} PROPERTIES LABELS "static;step33")
  endforeach()
  add_test(NAME static.step33.loop_bound_fails_on_step25
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/scripts/sass_loop.py $<TARGET_OBJECTS:fa_step25>
                   "backward_kernelILi128E.*Lb0E" --max-body 1100 --cuobjdump ${FA_CUOBJDUMP})
  set_tests_properties(static.step33.loop_bound_fails_on_step25 PROPERTIES LABELS "static;step33"
                       PASS_REGULAR_EXPRESSION "FAIL: the loop body holds [0-9]+ instructions, more than 1100")
endif()
