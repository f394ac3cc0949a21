# Static kernel checks: read the compiled step objects with cuobjdump (no GPU needed) and assert
# on resource use and instructions. One line per step: fa_static_check(NN [REQUIRE HMMA ...]
# [KERNEL <regex of kernels the REQUIRE list applies to>]).
find_program(FA_CUOBJDUMP cuobjdump
  HINTS ${CUDAToolkit_BIN_DIR} ${CMAKE_SOURCE_DIR}/.deps/cuobjdump/nvidia/cu13/bin
  DOC "cuobjdump (CUDA toolkit, or scripts/install_deps.sh installs it into .deps/)")
if(NOT FA_CUOBJDUMP)
  message(WARNING "cuobjdump not found: the static tests will fail until scripts/install_deps.sh has run")
  set(FA_CUOBJDUMP cuobjdump-not-found)
endif()

add_executable(fa_sass_check ${CMAKE_SOURCE_DIR}/tests/static/sass_check.cpp)
target_link_libraries(fa_sass_check PRIVATE GTest::gtest)

# fa_sass_check_command(<out-var> <objects target> [REQUIRE ...] [MIN_COUNT <INS:N> ...] [KERNEL regex])
function(fa_sass_check_command out target)
  cmake_parse_arguments(A "" "KERNEL" "REQUIRE;MIN_COUNT" ${ARGN})
  set(cmd $<TARGET_FILE:fa_sass_check> --object=$<TARGET_OBJECTS:${target}> --cuobjdump=${FA_CUOBJDUMP})
  foreach(r IN LISTS A_REQUIRE)
    list(APPEND cmd --require=${r})
  endforeach()
  foreach(r IN LISTS A_MIN_COUNT)
    list(APPEND cmd --min-count=${r})
  endforeach()
  if(A_KERNEL)
    list(APPEND cmd --kernel=${A_KERNEL})
  endif()
  set(${out} ${cmd} PARENT_SCOPE)
endfunction()

function(fa_static_check nn)
  fa_sass_check_command(cmd fa_step${nn} ${ARGN})
  add_test(NAME static.step${nn} COMMAND ${cmd})
  set_tests_properties(static.step${nn} PROPERTIES LABELS "static;step${nn}")
  set_property(GLOBAL PROPERTY FA_STATIC_ARGS_${nn} "${ARGN}")
endfunction()

fa_static_check(00)
# CUDA-core steps: no local memory, no spills (register arrays indexed only by unrolled loops).
fa_static_check(01)
fa_static_check(02)
fa_static_check(03)
# Tensor-core steps: HMMA (mma.sync), LDSM (ldmatrix) and LDGSTS (cp.async) in the attention
# kernels, no local memory anywhere. 64 HMMA per kernel is one 64-key tile of the smallest
# config at D = 64 with BOTH matmuls on tensor cores (32 for Q·Kᵀ + 32 for P·V): a kernel that
# does P·V on CUDA cores (seed bug #6) has only half.
fa_static_check(04 REQUIRE HMMA LDSM LDGSTS MIN_COUNT HMMA:64 KERNEL attention_kernel)
fa_static_check(05 REQUIRE HMMA LDSM LDGSTS MIN_COUNT HMMA:64 KERNEL attention_kernel)
fa_static_check(06 REQUIRE HMMA LDSM LDGSTS MIN_COUNT HMMA:64 KERNEL attention_kernel)
fa_static_check(07 REQUIRE HMMA LDSM LDGSTS MIN_COUNT HMMA:64 KERNEL attention_kernel)
