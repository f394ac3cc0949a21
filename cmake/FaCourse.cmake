# Helpers that make adding a step, a static check or a mutant one line of CMake.

set(FA_GTEST_SOURCE_DIR "" CACHE PATH "GoogleTest source folder, for machines without internet")
set(FA_STEPS_DIR ${CMAKE_SOURCE_DIR}/steps)

# GoogleTest: the installed package, else a source folder, else download it.
macro(fa_find_gtest)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    if(FA_GTEST_SOURCE_DIR)
      set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
      set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
      add_subdirectory(${FA_GTEST_SOURCE_DIR} ${CMAKE_BINARY_DIR}/_deps/googletest EXCLUDE_FROM_ALL)
    else()
      include(FetchContent)
      FetchContent_Declare(googletest URL https://github.com/google/googletest/archive/refs/tags/v1.14.0.tar.gz)
      set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
      FetchContent_MakeAvailable(googletest)
    endif()
    if(NOT TARGET GTest::gtest)
      add_library(GTest::gtest ALIAS gtest)
    endif()
  endif()
  include(GoogleTest)
endmacro()

# fa_step_dir(<NN> <out-var>): the folder steps/NN_* of step NN.
function(fa_step_dir nn out)
  file(GLOB dirs LIST_DIRECTORIES true ${FA_STEPS_DIR}/${nn}_*)
  list(LENGTH dirs n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "expected exactly one folder steps/${nn}_*, found: ${dirs}")
  endif()
  set(${out} ${dirs} PARENT_SCOPE)
endfunction()

# fa_build_id(<out-var> <file>...): 16 hex digits of a SHA-256 over the contents of the files and
# the compiler setup (architectures, build type, nvcc version). A step's tuning cache is keyed by
# this id, so it must change whenever the compiled kernel can change, and only then: a timestamp
# would change on every rebuild of the same source and stay put across a copy of the build.
function(fa_build_id out)
  set(text "arch=${CMAKE_CUDA_ARCHITECTURES}\ntype=${CMAKE_BUILD_TYPE}\nnvcc=${CMAKE_CUDA_COMPILER_VERSION}\n")
  foreach(f IN LISTS ARGN)
    file(SHA256 ${f} h)
    file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${f})
    string(APPEND text "${rel} ${h}\n")
  endforeach()
  string(SHA256 id "${text}")
  string(SUBSTRING ${id} 0 16 id)
  set(${out} ${id} PARENT_SCOPE)
endfunction()

# fa_step_id_inputs(<out-var> <step folder>): the files a step's compiled kernel depends on (its
# attention.cu, every building block under device/, the tuner's interface). Each is added to the
# configure dependencies, so an edit reconfigures and the build id follows it.
function(fa_step_id_inputs out dir)
  file(GLOB_RECURSE device_files CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/device/*)
  list(SORT device_files)
  set(files ${dir}/attention.cu ${device_files} ${CMAKE_SOURCE_DIR}/library/tuner.h)
  set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${files})
  set(${out} ${files} PARENT_SCOPE)
endfunction()

# fa_step_tests_objects(<out-var> <nn>): steps/NN_name/tests/*.cpp and *.cu compiled once, as the
# object library fa_step_tests_NN, or "" when the step has no tests of its own. Every test program
# that runs them links these objects: the step's own, the later steps' that name NN in TESTS_FROM,
# and every mutant's and experiment's of those steps. A test source does not depend on the step
# it tests (the_step() is the one step registered in the program it is linked into), so one
# compile serves them all; compiled per program, as before, they were more than half of CI's
# build time.
function(fa_step_tests_objects out nn)
  set(lib fa_step_tests_${nn})
  if(NOT TARGET ${lib})
    fa_step_dir(${nn} dir)
    file(GLOB srcs CONFIGURE_DEPENDS ${dir}/tests/*.cpp ${dir}/tests/*.cu)
    if(NOT srcs)
      set(${out} "" PARENT_SCOPE)
      return()
    endif()
    add_library(${lib} OBJECT ${srcs})
    target_link_libraries(${lib} PRIVATE fa_gpu_suite fa_harness GTest::gtest)
  endif()
  set(${out} ${lib} PARENT_SCOPE)
endfunction()

# fa_step_test_executable(<target> <step objects target> <nn>): the shared GPU suite plus the
# step's own tests (steps/NN_name/tests/*.cpp and *.cu) linked against exactly one step.
# Tests of the steps named by the step's TESTS_FROM come along: a step keeps the features of the
# steps before it, so it runs their tests too (the tuner's tests in every tuned step, say).
function(fa_step_test_executable target step_target nn)
  get_property(tests_from GLOBAL PROPERTY FA_TESTS_FROM_${nn})
  set(objects)
  foreach(from IN ITEMS ${nn} ${tests_from})
    fa_step_tests_objects(lib ${from})
    if(lib)
      list(APPEND objects $<TARGET_OBJECTS:${lib}>)
    endif()
  endforeach()
  add_executable(${target} ${objects})
  target_link_libraries(${target} PRIVATE fa_gpu_suite ${step_target} fa_harness GTest::gtest)
endfunction()

# fa_step_static_check(<NN> <suffix> [REQUIRE ...] [FORBID ...] [MIN_COUNT ...] [MAX_COUNT ...] [KERNEL regex]
#                      [ARCH regex]):
# a further SASS check on step NN's objects, the ctest case static.stepNN.<suffix>, for rules that
# hold for only some of its kernels. A step.cmake calls this, never the checker itself: the
# library-only build (FA_BUILD_TESTS=OFF, the Python package's) has no checker, and this does nothing.
function(fa_step_static_check nn suffix)
  if(NOT FA_BUILD_TESTS)
    return()
  endif()
  fa_sass_check_command(cmd fa_step${nn} ${ARGN})
  add_test(NAME static.step${nn}.${suffix} COMMAND ${cmd})
  # 77: the build has no code for the check's ARCH, reported as skipped
  set_tests_properties(static.step${nn}.${suffix} PROPERTIES LABELS "static;step${nn}" SKIP_RETURN_CODE 77)
endfunction()

# fa_step(<NN> <name> [BASE <NN>] [ARCH <architectures>]
#         [STATIC [REQUIRE <ins>...] [FORBID <ins>...] [MIN_COUNT <INS:N>...] [MAX_COUNT <INS:N>...]
#                 [HMMA_PER_KV_TILE <BLOCK_N>] [KERNEL <regex>]]
#         [CASES "<case>=<fa2 run arguments>"...] [CASES_FROM <NN>] [TESTS_FROM <NN>...])
# The one call in steps/NN_name/step.cmake. It builds attention.cu into fa_stepNN (an object
# library, so that its self-registration is always linked) against fa_library, with FA_BUILD_ID
# set; adds it to fa2 and the C library; and registers with ctest, all labelled stepNN:
#   stepNN.<suite>.<case>  the shared GPU suite and the step's own tests (label gpu)
#   stepNN.Overflow.*      offsets past 2^31 elements: a tensor that large, and (B, N, H, D) rows
#                          whose row × stride passes 2^31 (label large, one at a time)
#   static.stepNN          the SASS check: no local memory anywhere, plus the STATIC rules
#   stepNN.case.<case>     `fa2 run --step NN <arguments>` checked against the reference (label
#                          gpu; skipped without a GPU): the step's lesson on a shape worth seeing
#   stepNN.registered      `fa2 list` shows the step under this number and name, from BASE (cpu)
# ARCH replaces CMAKE_CUDA_ARCHITECTURES for this step alone (and its mutants): the Hopper steps
# say 90a, because wgmma and setmaxnreg exist only in sm_90a code; on another GPU such a step
# refuses to run (Capabilities::only_sm) and its tests report SKIPPED.
# BASE is the step this one grows from: scripts/diff_steps.sh NN diffs against it. TESTS_FROM lists
# earlier steps whose own tests (steps/NN_name/tests/) this step's test program also runs;
# CASES_FROM an earlier step whose cases (its own and those it took) this step runs too.
function(fa_step nn name)
  cmake_parse_arguments(A "STATIC" "BASE;ARCH;KERNEL;HMMA_PER_KV_TILE;CASES_FROM"
                        "REQUIRE;FORBID;MIN_COUNT;MAX_COUNT;CASES;TESTS_FROM" ${ARGN})
  set(dir ${FA_STEPS_DIR}/${nn}_${name})
  if(A_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "fa_step(${nn} ${name}): unexpected arguments '${A_UNPARSED_ARGUMENTS}'")
  endif()
  if(NOT nn MATCHES "^[0-9][0-9]$")
    message(FATAL_ERROR "fa_step(${nn} ${name}): the step number is two digits, e.g. 04")
  endif()
  if(NOT CMAKE_CURRENT_LIST_DIR STREQUAL dir)
    file(RELATIVE_PATH here ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_LIST_FILE})
    message(FATAL_ERROR "${here} declares fa_step(${nn} ${name}): number and name must match its folder")
  endif()
  if(NOT EXISTS ${dir}/attention.cu)
    message(WARNING "steps/${nn}_${name} has a step.cmake but no attention.cu yet: step ${nn} is not built")
    return()
  endif()
  set(base_regex "[^ (]")  # a first step: no "(from NN)" in fa2 list
  if(DEFINED A_BASE)
    if(NOT A_BASE MATCHES "^[0-9][0-9]$" OR NOT A_BASE LESS nn)
      message(FATAL_ERROR "fa_step(${nn} ${name}): BASE ${A_BASE} must be an earlier step's two-digit number")
    endif()
    fa_step_dir(${A_BASE} base_dir)
    set(base_regex "\\(from ${A_BASE}\\)")
  endif()

  set_property(GLOBAL PROPERTY FA_TESTS_FROM_${nn} ${A_TESTS_FROM})
  set(cases ${A_CASES})
  if(DEFINED A_CASES_FROM)
    get_property(from_cases GLOBAL PROPERTY FA_CASES_${A_CASES_FROM})
    if(NOT from_cases)
      message(FATAL_ERROR "fa_step(${nn} ${name}): CASES_FROM ${A_CASES_FROM} names no earlier step with cases")
    endif()
    set(cases ${from_cases} ${A_CASES})
  endif()
  set_property(GLOBAL PROPERTY FA_CASES_${nn} "${cases}")

  # The step itself, and the id its tuning cache is keyed by.
  fa_step_id_inputs(id_inputs ${dir})
  fa_build_id(build_id ${id_inputs})
  if(DEFINED A_ARCH)
    string(SHA256 build_id "${build_id}\narch=${A_ARCH}\n")
    string(SUBSTRING ${build_id} 0 16 build_id)
  endif()
  set_property(GLOBAL PROPERTY FA_BUILD_ID_${nn} ${build_id})
  set_property(GLOBAL PROPERTY FA_STEP_ARCH_${nn} "${A_ARCH}")
  add_library(fa_step${nn} OBJECT ${dir}/attention.cu)
  if(DEFINED A_ARCH)
    set_target_properties(fa_step${nn} PROPERTIES CUDA_ARCHITECTURES "${A_ARCH}")
  endif()
  target_link_libraries(fa_step${nn} PUBLIC fa_library)
  target_compile_definitions(fa_step${nn} PRIVATE FA_BUILD_ID="${build_id}")
  set_property(GLOBAL APPEND PROPERTY FA_STEP_TARGETS fa_step${nn})
  set_property(GLOBAL APPEND PROPERTY FA_STEP_NUMBERS ${nn})
  if(NOT FA_BUILD_TESTS)
    return()  # the library alone (the Python package's build)
  endif()

  # The shared GPU suite and the step's own tests.
  fa_step_test_executable(fa_test_step${nn} fa_step${nn} ${nn})
  gtest_discover_tests(fa_test_step${nn}
    TEST_PREFIX "step${nn}."
    DISCOVERY_TIMEOUT 60
    DISCOVERY_MODE PRE_TEST)
  # Two labels per test (gpu and stepNN). gtest_discover_tests flattens a list-valued LABELS
  # property into separate arguments, so the labels are set by a ctest include file that runs after
  # discovery, on the list of tests discovery produced (fa_test_stepNN_TESTS).
  set(labels_file ${CMAKE_CURRENT_BINARY_DIR}/fa_test_step${nn}_labels.cmake)
  file(WRITE ${labels_file}
       "if(fa_test_step${nn}_TESTS)\n"
       "  set_tests_properties(\${fa_test_step${nn}_TESTS} PROPERTIES LABELS \"gpu;step${nn}\")\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_file})
  # Offsets past 2^31 elements (tensors of 4-20 GB): one at a time, never beside each other.
  foreach(case Past2To31Elements RowStridePast2To31)
    add_test(NAME step${nn}.Overflow.${case} COMMAND fa_test_step${nn} --fa_large --gtest_filter=Overflow.${case})
    set_tests_properties(step${nn}.Overflow.${case} PROPERTIES LABELS "gpu;step${nn};large"
                         RESOURCE_LOCK gpu_memory SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endforeach()

  # The SASS check: always "no local memory"; the step's STATIC rules on top.
  set(static_args)
  foreach(kw REQUIRE FORBID MIN_COUNT MAX_COUNT HMMA_PER_KV_TILE)
    if(A_${kw})
      list(APPEND static_args ${kw} ${A_${kw}})
    endif()
  endforeach()
  if(A_KERNEL)
    list(APPEND static_args KERNEL ${A_KERNEL})
  endif()
  fa_static_check(${nn} ${static_args})

  # The step's named cases through the main tool. fa2 run exits 3 on a mismatch with the
  # reference and 77 when there is no GPU (reported as skipped, never as passed).
  foreach(c IN LISTS cases)
    if(NOT c MATCHES "^([A-Za-z0-9_]+)=(.+)$")
      message(FATAL_ERROR "fa_step(${nn} ${name}): a case is \"name=fa2 run arguments\", got \"${c}\"")
    endif()
    set(case_name ${CMAKE_MATCH_1})
    separate_arguments(case_args UNIX_COMMAND "${CMAKE_MATCH_2}")
    add_test(NAME step${nn}.case.${case_name}
             COMMAND $<TARGET_FILE:fa2> run --step ${nn} ${case_args} --iters 1 --warmup 0)
    set_tests_properties(step${nn}.case.${case_name} PROPERTIES LABELS "gpu;step${nn}" SKIP_RETURN_CODE 77)
  endforeach()

  # The registry and step.cmake agree on number, name and base (no GPU needed).
  add_test(NAME step${nn}.registered COMMAND $<TARGET_FILE:fa2> list)
  set_tests_properties(step${nn}.registered PROPERTIES LABELS "cpu;step${nn}"
                       PASS_REGULAR_EXPRESSION "(^|\n)${nn}_${name} +${base_regex}")
endfunction()
