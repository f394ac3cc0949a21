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

# fa_step_test_executable(<target> <step objects target> <nn>): the shared GPU suite plus the
# step's own tests (tests/gpu/stepNN_*.cpp) linked against exactly one step.
function(fa_step_test_executable target step_target nn)
  file(GLOB own_tests ${CMAKE_SOURCE_DIR}/tests/gpu/step${nn}_*.cpp ${CMAKE_SOURCE_DIR}/tests/gpu/step${nn}_*.cu)
  add_executable(${target} ${own_tests})
  target_link_libraries(${target} PRIVATE fa_gpu_suite ${step_target} fa_harness GTest::gtest)
endfunction()

# fa_add_step(<NN> <name>): builds steps/NN_name/attention.cu into fa_stepNN (an object library,
# so its self-registration is always linked), adds it to the CLI and the library, and registers
# the shared GPU suite + the step's own tests with ctest labels gpu;stepNN.
function(fa_add_step nn name)
  set(dir ${FA_STEPS_DIR}/${nn}_${name})
  add_library(fa_step${nn} OBJECT ${dir}/attention.cu)
  target_link_libraries(fa_step${nn} PUBLIC fa_harness)
  set_property(GLOBAL APPEND PROPERTY FA_STEP_TARGETS fa_step${nn})
  set_property(GLOBAL APPEND PROPERTY FA_STEP_NUMBERS ${nn})

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
  # Tensors past 2^31 elements (tens of GB): one at a time, never beside each other.
  add_test(NAME step${nn}.Overflow.Past2To31Elements COMMAND fa_test_step${nn} --fa_large)
  set_tests_properties(step${nn}.Overflow.Past2To31Elements PROPERTIES LABELS "gpu;step${nn};large"
                       RESOURCE_LOCK gpu_memory SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endfunction()
