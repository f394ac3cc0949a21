# The production kernels (kernels/): each an object library like a step's, with its build id for
# the tuner's cache, its test program (the shared GPU suite plus tests/kernels/) and its static
# check. Not yet in libfa2_capi: the library's choice (FA_STEP_AUTO) takes them once their speed
# against their steps is measured.
function(fa_production_kernel name source)
  cmake_parse_arguments(A "" "SAME_AS_STEP" "STATIC;TESTS" ${ARGN})
  file(GLOB_RECURSE device_files CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/device/* ${CMAKE_SOURCE_DIR}/kernels/*.h)
  list(SORT device_files)
  set(inputs ${CMAKE_SOURCE_DIR}/${source} ${device_files} ${CMAKE_SOURCE_DIR}/library/tuner.h)
  set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${inputs})
  fa_build_id(build_id ${inputs})
  add_library(fa_kernel_${name} OBJECT ${CMAKE_SOURCE_DIR}/${source})
  target_link_libraries(fa_kernel_${name} PUBLIC fa_library)
  target_compile_definitions(fa_kernel_${name} PRIVATE FA_BUILD_ID="${build_id}")
  if(NOT FA_BUILD_TESTS)
    return()
  endif()
  add_executable(fa_test_kernel_${name} ${A_TESTS})
  target_link_libraries(fa_test_kernel_${name} PRIVATE fa_gpu_suite fa_kernel_${name} fa_harness GTest::gtest)
  gtest_discover_tests(fa_test_kernel_${name} TEST_PREFIX "kernels.${name}." DISCOVERY_TIMEOUT 60
                       DISCOVERY_MODE PRE_TEST PROPERTIES LABELS "gpu")
  fa_sass_check_command(cmd fa_kernel_${name} ${A_STATIC})
  add_test(NAME static.kernels.${name} COMMAND ${cmd})
  set_tests_properties(static.kernels.${name} PROPERTIES LABELS "static;kernels")
  # Free abstraction: per configuration, the step's count of each tensor-core, ldmatrix, cp.async
  # and exp2 instruction.
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(A_SAME_AS_STEP AND Python3_Interpreter_FOUND)
    add_test(NAME static.kernels.${name}.same_as_step${A_SAME_AS_STEP}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/static/same_counts.py --cuobjdump ${FA_CUOBJDUMP}
                     --kernel $<TARGET_OBJECTS:fa_kernel_${name}> --step $<TARGET_OBJECTS:fa_step${A_SAME_AS_STEP}>)
    set_tests_properties(static.kernels.${name}.same_as_step${A_SAME_AS_STEP} PROPERTIES LABELS "static;kernels")
  endif()
endfunction()

# Step 10's rules, which the default policies must keep: tensor cores, ldmatrix, cp.async, no
# local memory, and every kernel the HMMAs of one K/V tile.
fa_production_kernel(mma kernels/fwd_mma.cu SAME_AS_STEP 10
  STATIC REQUIRE HMMA LDSM LDGSTS HMMA_PER_KV_TILE 64:2 KERNEL attention_kernel
  TESTS ${CMAKE_SOURCE_DIR}/tests/kernels/kernel_mma_test.cpp)
