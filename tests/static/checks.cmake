# Static kernel checks: read the compiled step objects with cuobjdump (no GPU needed) and assert
# on resource use and instructions. Each step states its own requirements in the STATIC part of
# its steps/NN_name/step.cmake; this file provides the checker and the command that runs it, so
# it is included before the steps.
find_program(FA_CUOBJDUMP cuobjdump
  HINTS ${CUDAToolkit_BIN_DIR} ${CMAKE_SOURCE_DIR}/.deps/cuobjdump/nvidia/cu13/bin
  DOC "cuobjdump (CUDA toolkit, or scripts/install_deps.sh installs it into .deps/)")
if(NOT FA_CUOBJDUMP)
  message(WARNING "cuobjdump not found: the static tests will fail until scripts/install_deps.sh has run")
  set(FA_CUOBJDUMP cuobjdump-not-found)
endif()

add_executable(fa_sass_check ${CMAKE_SOURCE_DIR}/tests/static/sass_check.cpp)
target_link_libraries(fa_sass_check PRIVATE GTest::gtest)

# fa_sass_check_command(<out-var> <objects target> [REQUIRE <ins>...] [FORBID <ins>...]
#                       [MIN_COUNT <INS:N>...] [MAX_COUNT <INS:N>...] [HMMA_PER_KV_TILE <BLOCK_N>]
#                       [KERNEL <regex>] [ARCH <regex>])
# Every kernel is checked for local memory (spills); REQUIRE, FORBID, MIN_COUNT, MAX_COUNT and HMMA_PER_KV_TILE
# (each kernel has the 2·(D/16)·(BLOCK_N/8) HMMA of one K/V tile; BLOCK_N for kernels whose name
# has no Config) apply to the kernels whose name matches KERNEL (all of them by default), of the
# architectures matching ARCH (sm_90: rules for an instruction only sm_90 has; all by default).
function(fa_sass_check_command out target)
  cmake_parse_arguments(A "" "KERNEL;ARCH;HMMA_PER_KV_TILE" "REQUIRE;FORBID;MIN_COUNT;MAX_COUNT" ${ARGN})
  if(A_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "static check of ${target}: unexpected arguments '${A_UNPARSED_ARGUMENTS}'")
  endif()
  set(cmd $<TARGET_FILE:fa_sass_check> --object=$<TARGET_OBJECTS:${target}> --cuobjdump=${FA_CUOBJDUMP})
  foreach(r IN LISTS A_REQUIRE)
    list(APPEND cmd --require=${r})
  endforeach()
  foreach(r IN LISTS A_FORBID)
    list(APPEND cmd --forbid=${r})
  endforeach()
  foreach(r IN LISTS A_MIN_COUNT)
    list(APPEND cmd --min-count=${r})
  endforeach()
  foreach(r IN LISTS A_MAX_COUNT)
    list(APPEND cmd --max-count=${r})
  endforeach()
  if(A_HMMA_PER_KV_TILE)
    list(APPEND cmd --hmma-per-kv-tile=${A_HMMA_PER_KV_TILE})
  endif()
  if(A_KERNEL)
    list(APPEND cmd --kernel=${A_KERNEL})
  endif()
  if(A_ARCH)
    list(APPEND cmd --arch=${A_ARCH})
  endif()
  set(${out} ${cmd} PARENT_SCOPE)
endfunction()

# fa_static_check(<NN> [REQUIRE ...] [FORBID ...] [MIN_COUNT ...] [HMMA_PER_KV_TILE n] [KERNEL regex]): the ctest case
# static.stepNN on the step's objects (called by fa_step).
function(fa_static_check nn)
  fa_sass_check_command(cmd fa_step${nn} ${ARGN})
  add_test(NAME static.step${nn} COMMAND ${cmd})
  set_tests_properties(static.step${nn} PROPERTIES LABELS "static;step${nn}")
endfunction()
