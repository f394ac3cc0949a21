# The bug catalog's mechanism. tests/bugs/<NN>-<bug>.patch is applied at build time to a copy of
# steps/NN_*/attention.cu (a patch that no longer applies breaks the build), the copy is built
# into its own test executable, and the ctest case bug.<NN>-<bug> passes only if the named
# regression test FAILS on that build ("the mutant is killed").
#
#   fa_add_mutant(<NN> <bug> FILTER <gtest filter>)   run the step's GPU tests matching FILTER
#   fa_add_mutant(<NN> <bug> STATIC [REQUIRE ...])    run the step's static checks on the mutant

function(fa_add_mutant nn bug)
  cmake_parse_arguments(A "STATIC" "FILTER;KERNEL" "REQUIRE;MIN_COUNT;ARGS" ${ARGN})
  set(patch ${CMAKE_SOURCE_DIR}/tests/bugs/${nn}-${bug}.patch)
  if(NOT EXISTS ${patch})
    message(FATAL_ERROR "missing patch ${patch}")
  endif()
  fa_step_dir(${nn} dir)
  file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${dir})
  set(root ${CMAKE_BINARY_DIR}/mutants/${nn}-${bug})
  set(src ${root}/${rel}/attention.cu)
  add_custom_command(OUTPUT ${src}
    COMMAND ${CMAKE_COMMAND} -DSRC=${dir}/attention.cu -DPATCH=${patch} -DROOT=${root} -DREL=${rel}
            -P ${CMAKE_SOURCE_DIR}/cmake/apply_patch.cmake
    DEPENDS ${dir}/attention.cu ${patch} ${CMAKE_SOURCE_DIR}/cmake/apply_patch.cmake
    COMMENT "Injecting bug ${nn}-${bug}")
  set(obj fa_mutant_obj_${nn}_${bug})
  add_library(${obj} OBJECT ${src})
  target_link_libraries(${obj} PUBLIC fa_library)
  set(name bug.${nn}-${bug})
  if(A_STATIC)
    set(args)
    if(A_REQUIRE)
      list(APPEND args REQUIRE ${A_REQUIRE})
    endif()
    if(A_MIN_COUNT)
      list(APPEND args MIN_COUNT ${A_MIN_COUNT})
    endif()
    if(A_KERNEL)
      list(APPEND args KERNEL ${A_KERNEL})
    endif()
    fa_sass_check_command(cmd ${obj} ${args})
    add_test(NAME ${name} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/bugs/run_mutant.sh "*" ${cmd})
    set_tests_properties(${name} PROPERTIES LABELS "bug;static;step${nn}")
  else()
    set(exe fa_mutant_${nn}_${bug})
    fa_step_test_executable(${exe} ${obj} ${nn})
    add_test(NAME ${name} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/bugs/run_mutant.sh "${A_FILTER}" $<TARGET_FILE:${exe}>
             ${A_ARGS})
    set_tests_properties(${name} PROPERTIES LABELS "bug;gpu;step${nn}" SKIP_RETURN_CODE 77)
    if(A_ARGS MATCHES "--fa_large")
      set_tests_properties(${name} PROPERTIES RESOURCE_LOCK gpu_memory)
    endif()
  endif()
endfunction()

# ---- the catalog: every tests/bugs/NN-<bug>.patch is a mutant ------------------------------
# A patch starts with a header (ignored by `patch`) that names the regression test it must fail:
#   Test: <gtest filter>              e.g.  Test: LargeLogits.*
#   Args: <extra arguments>           optional, e.g. Args: --fa_large (the >2^31-element suite)
#   Static: [REQUIRE <ins>...] [KERNEL <regex>]   for a static (SASS) check instead
# docs/bug_catalog.md describes each entry; tests/cpu/catalog_test.cpp keeps the two in sync.
file(GLOB FA_BUG_PATCHES ${CMAKE_SOURCE_DIR}/tests/bugs/*.patch)
foreach(patch IN LISTS FA_BUG_PATCHES)
  get_filename_component(stem ${patch} NAME_WE)
  string(SUBSTRING ${stem} 0 2 nn)
  string(SUBSTRING ${stem} 3 -1 bug)
  file(STRINGS ${patch} header REGEX "^(Test|Static):")
  file(STRINGS ${patch} extra REGEX "^Args:")
  set(mutant_args)
  if(extra MATCHES "^Args: *(.+)$")
    separate_arguments(mutant_args UNIX_COMMAND "${CMAKE_MATCH_1}")
  endif()
  if(header MATCHES "^Test: *(.+)$")
    fa_add_mutant(${nn} ${bug} FILTER "${CMAKE_MATCH_1}" ARGS ${mutant_args})
  elseif(header MATCHES "^Static:(.*)$")
    separate_arguments(static_args UNIX_COMMAND "${CMAKE_MATCH_1}")
    fa_add_mutant(${nn} ${bug} STATIC ${static_args})
  else()
    message(FATAL_ERROR "${patch}: the header needs a 'Test: <filter>' or 'Static: ...' line")
  endif()
endforeach()

# docs/bug_catalog.md, the patches and the named tests agree (no GPU needed).
find_package(Python3 COMPONENTS Interpreter REQUIRED)
add_test(NAME catalog COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/catalog_check.py
         --repo ${CMAKE_SOURCE_DIR} --build ${CMAKE_BINARY_DIR})
set_tests_properties(catalog PROPERTIES LABELS "cpu")
