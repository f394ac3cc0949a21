# The bug catalog's mechanism. steps/NN_name/bugs/<bug>.patch is applied at build time to a copy
# of that step's attention.cu, exactly (patch --fuzz=0: a patch whose context has drifted breaks
# the build and has to be re-made), the copy is built into its own test program, and the ctest
# case bug.NN-<bug> passes only if the named regression test FAILS on that build by its assertion
# ("the mutant is killed"; tests/bugs/run_mutant.sh tells a failed assertion from a crash).
#
#   fa_add_mutant(<NN> <bug> FILTER <gtest filter> [ARGS ...])   the step's GPU tests matching FILTER
#   fa_add_mutant(<NN> <bug> STATIC [REQUIRE ...] [FORBID ...])  the SASS check on the mutant
#
# A patch starts with a header (ignored by `patch`) that names the regression test it must fail:
#   Bug: <one line>                   what the patch does to the step
#   Catalog: <entry id>               its entry in docs/bug_catalog.md
#   Test: <gtest filter>              e.g.  Test: LargeLogits.*
#   Args: <extra arguments>           optional, e.g. Args: --fa_large (the >2^31-element suite)
#   Static: [REQUIRE <ins>...] [FORBID <ins>...] [MIN_COUNT <INS:N>...] [MAX_COUNT <INS:N>...]
#           [HMMA_PER_KV_TILE <n>]
#           [KERNEL <regex>] [ARCH <regex>]
#                                     a SASS check instead
#   Symptom: fault                    optional: the bug is expected to fault (e.g. an out-of-bounds
#                                     access), so a crash counts as caught
#   Symptom: hang                     optional: the bug is expected to hang (a wait for an mbarrier
#                                     phase that never completes): the runner kills it after 30 s,
#                                     and that hang counts as caught
# tests/catalog_check.py keeps the headers, the catalog and the test names in sync.

# fa_patched_step(<out-obj> <NN> <kind> <name> <patch>): step NN's attention.cu with <patch> applied
# exactly, as object library fa_<kind>_obj_NN_<name> with its own build id (a tuning cache must
# never hand a patched build the timings of its step). Shared by the mutants and the experiments.
function(fa_patched_step out nn kind name patch)
  fa_step_dir(${nn} dir)
  file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${dir})
  set(root ${CMAKE_BINARY_DIR}/${kind}s/${nn}-${name})
  set(src ${root}/${rel}/attention.cu)
  add_custom_command(OUTPUT ${src}
    COMMAND ${CMAKE_COMMAND} -DSRC=${dir}/attention.cu -DPATCH=${patch} -DROOT=${root} -DREL=${rel}
            -P ${CMAKE_SOURCE_DIR}/cmake/apply_patch.cmake
    DEPENDS ${dir}/attention.cu ${patch} ${CMAKE_SOURCE_DIR}/cmake/apply_patch.cmake
            ${CMAKE_SOURCE_DIR}/cmake/patch_exactly.cmake
    COMMENT "Applying ${kind} ${nn}-${name}")
  get_property(step_id GLOBAL PROPERTY FA_BUILD_ID_${nn})
  file(SHA256 ${patch} patch_hash)
  string(SHA256 id "${step_id}\n${patch_hash}\n")
  string(SUBSTRING ${id} 0 16 id)
  set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${patch})
  set(obj fa_${kind}_obj_${nn}_${name})
  add_library(${obj} OBJECT ${src})
  get_property(step_arch GLOBAL PROPERTY FA_STEP_ARCH_${nn})
  if(step_arch)
    set_target_properties(${obj} PROPERTIES CUDA_ARCHITECTURES "${step_arch}")
  endif()
  target_link_libraries(${obj} PUBLIC fa_library)
  target_compile_definitions(${obj} PRIVATE FA_BUILD_ID="${id}")
  set(${out} ${obj} PARENT_SCOPE)
endfunction()

# fa_patch_step_number(<out-var> <patch>): NN of steps/NN_name/<sub>/<file>.patch.
function(fa_patch_step_number out patch)
  get_filename_component(sub_dir ${patch} DIRECTORY)
  get_filename_component(step_dir ${sub_dir} DIRECTORY)
  get_filename_component(folder ${step_dir} NAME)
  string(SUBSTRING ${folder} 0 2 nn)
  set(${out} ${nn} PARENT_SCOPE)
endfunction()

function(fa_add_mutant nn bug)
  cmake_parse_arguments(A "STATIC" "FILTER;KERNEL;ARCH;PATCH;HMMA_PER_KV_TILE" "REQUIRE;FORBID;MIN_COUNT;MAX_COUNT;ARGS"
                        ${ARGN})
  set(patch ${A_PATCH})
  fa_patched_step(obj ${nn} mutant ${bug} ${patch})
  set(name bug.${nn}-${bug})
  set(runner bash ${CMAKE_SOURCE_DIR}/tests/bugs/run_mutant.sh ${name} ${patch})
  if(A_STATIC)
    set(args)
    foreach(kw REQUIRE FORBID MIN_COUNT MAX_COUNT HMMA_PER_KV_TILE)
      if(A_${kw})
        list(APPEND args ${kw} ${A_${kw}})
      endif()
    endforeach()
    foreach(kw KERNEL ARCH)
      if(A_${kw})
        list(APPEND args ${kw} ${A_${kw}})
      endif()
    endforeach()
    fa_sass_check_command(cmd ${obj} ${args})
    add_test(NAME ${name} COMMAND ${runner} "*" ${cmd})
    set_tests_properties(${name} PROPERTIES LABELS "bug;static;step${nn}" SKIP_RETURN_CODE 77)
  else()
    set(exe fa_mutant_${nn}_${bug})
    fa_step_test_executable(${exe} ${obj} ${nn})
    add_test(NAME ${name} COMMAND ${runner} "${A_FILTER}" $<TARGET_FILE:${exe}> ${A_ARGS})
    set_tests_properties(${name} PROPERTIES LABELS "bug;gpu;step${nn}" SKIP_RETURN_CODE 77)
    if(A_ARGS MATCHES "--fa_large")
      set_tests_properties(${name} PROPERTIES RESOURCE_LOCK gpu_memory)
    endif()
  endif()
endfunction()

# fa_add_experiment(<NN> <name> PATCH <patch> FILTER <gtest filter>): a lesson's experiment, e.g.
# another place for the softmax scale. Built like a mutant, but the ctest case
# experiment.NN-<name> passes only if the named tests PASS: an experiment is a different correct
# kernel, and the patch keeps it building as the step changes (its header has Experiment: and Test:).
function(fa_add_experiment nn name)
  cmake_parse_arguments(A "" "FILTER;PATCH" "" ${ARGN})
  fa_patched_step(obj ${nn} experiment ${name} ${A_PATCH})
  set(exe fa_experiment_${nn}_${name})
  fa_step_test_executable(${exe} ${obj} ${nn})
  add_test(NAME experiment.${nn}-${name} COMMAND ${exe} --gtest_filter=${A_FILTER})
  set_tests_properties(experiment.${nn}-${name} PROPERTIES LABELS "gpu;step${nn};experiment"
                       SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]" FAIL_REGULAR_EXPRESSION "PASSED  \\] 0 tests")
endfunction()

# fa_add_kernel_mutant(<kernel> <bug> <patch> <gtest filter>): a production kernel's mutant
# (kernels/bugs/<bug>.patch, its header's `Kernel: mma` or `Kernel: hopper`). The patch may touch any
# file of kernels/ (paths a/kernels/<file>); the kernel's forward and backward are compiled again from
# the patched copies, and the decode kernel when the patch touches it or a header (the other kernel's
# backward is the build's own), linked
# with the kernel's tests, and the ctest case bug.kernel_<kernel>-<bug> passes only if FILTER's tests
# fail on it by their assertion, as a step's mutant.
function(fa_add_kernel_mutant kernel bug patch filter)
  set(root ${CMAKE_BINARY_DIR}/kernel_mutants/${bug})
  get_property(source GLOBAL PROPERTY FA_KERNEL_SOURCE_${kernel})
  get_property(arch GLOBAL PROPERTY FA_KERNEL_ARCH_${kernel})
  get_property(kernel_id GLOBAL PROPERTY FA_KERNEL_BUILD_ID_${kernel})
  get_filename_component(fwd ${source} NAME)
  set(bwd bwd_${kernel}.cu)
  file(GLOB kernel_files CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/*.h ${CMAKE_SOURCE_DIR}/kernels/*.cu)
  add_custom_command(OUTPUT ${root}/kernels/${fwd} ${root}/kernels/${bwd} ${root}/kernels/fwd_decode.cu
    COMMAND ${CMAKE_COMMAND} -DSRC_DIR=${CMAKE_SOURCE_DIR}/kernels -DPATCH=${patch} -DROOT=${root}
            -P ${CMAKE_SOURCE_DIR}/cmake/apply_kernel_patch.cmake
    DEPENDS ${kernel_files} ${patch} ${CMAKE_SOURCE_DIR}/cmake/apply_kernel_patch.cmake
            ${CMAKE_SOURCE_DIR}/cmake/patch_exactly.cmake
    COMMENT "Applying kernel mutant ${bug}")
  set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${patch})
  file(SHA256 ${patch} patch_hash)
  string(SHA256 id "${kernel_id}\n${patch_hash}\n")
  string(SUBSTRING ${id} 0 16 id)  # its own build id: the tuner's cache never hands it the kernel's timings
  # The decode kernel too, from the copies, when the patch touches it or a header it includes.
  set(decode fwd_decode.cu)
  set(parts fwd bwd)
  set(with_decode FALSE)
  file(STRINGS ${patch} touched REGEX "^\\+\\+\\+ b/kernels/")
  foreach(line IN LISTS touched)
    if(line MATCHES "fwd_decode\\.cu|\\.h$")
      set(parts fwd bwd decode)
      set(with_decode TRUE)
    endif()
  endforeach()
  set(objs)
  foreach(part IN LISTS parts)
    set(obj fa_kernel_mutant_obj_${bug}_${part})
    add_library(${obj} OBJECT ${root}/kernels/${${part}})
    target_include_directories(${obj} BEFORE PRIVATE ${root})
    if(arch)
      set_target_properties(${obj} PROPERTIES CUDA_ARCHITECTURES "${arch}")
    endif()
    target_link_libraries(${obj} PUBLIC fa_library)
    target_compile_definitions(${obj} PRIVATE FA_BUILD_ID="${id}" ${fa_kernel_masks})
    target_compile_options(${obj} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-diag-suppress=177>)
    list(APPEND objs ${obj})
  endforeach()
  set(others)
  if(NOT with_decode)
    set(others fa_kernel_decode)
  endif()
  foreach(k mma hopper)
    if(NOT k STREQUAL kernel)
      list(APPEND others fa_kernel_bwd_${k})
    endif()
  endforeach()
  set(exe fa_kernel_mutant_${bug})
  add_executable(${exe} $<TARGET_OBJECTS:fa_kernel_tests_${kernel}>)
  target_link_libraries(${exe} PRIVATE fa_gpu_suite ${objs} ${others} fa_harness GTest::gtest)
  set(name bug.kernel_${kernel}-${bug})
  add_test(NAME ${name} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/bugs/run_mutant.sh ${name} ${patch} "${filter}"
                                $<TARGET_FILE:${exe}>)
  set_tests_properties(${name} PROPERTIES LABELS "bug;gpu;kernels" SKIP_RETURN_CODE 77)
endfunction()

# ---- the catalog: every steps/NN_name/bugs/<bug>.patch is a mutant -----------------------------
if(FA_SKIP_MUTANTS)
  message(STATUS "FA_SKIP_MUTANTS=ON: the bug-catalog mutants are not built (the catalog test still runs)")
else()
  file(GLOB FA_BUG_PATCHES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/steps/[0-9][0-9]_*/bugs/*.patch)
  list(SORT FA_BUG_PATCHES)
  foreach(patch IN LISTS FA_BUG_PATCHES)
    get_filename_component(bug ${patch} NAME_WE)
    fa_patch_step_number(nn ${patch})
    if(NOT TARGET fa_step${nn})
      message(WARNING "${patch}: step ${nn} is not built, so neither is this mutant")
      continue()
    endif()
    file(STRINGS ${patch} header REGEX "^(Test|Static):")
    file(STRINGS ${patch} extra REGEX "^Args:")
    set(mutant_args)
    if(extra MATCHES "^Args: *(.+)$")
      separate_arguments(mutant_args UNIX_COMMAND "${CMAKE_MATCH_1}")
    endif()
    if(header MATCHES "^Test: *(.+)$")
      fa_add_mutant(${nn} ${bug} PATCH ${patch} FILTER "${CMAKE_MATCH_1}" ARGS ${mutant_args})
    elseif(header MATCHES "^Static:(.*)$")
      separate_arguments(static_args UNIX_COMMAND "${CMAKE_MATCH_1}")
      fa_add_mutant(${nn} ${bug} PATCH ${patch} STATIC ${static_args})
    else()
      message(FATAL_ERROR "${patch}: the header needs a 'Test: <filter>' or 'Static: ...' line")
    endif()
  endforeach()
  # ... and every kernels/bugs/<bug>.patch, a production kernel's mutant. Their tests are GPU tests,
  # and each is a copy of a kernel's forward and backward (and with some the decode kernel): seven of
  # them took 6 of CI's 31 minutes on 2 cores, to be skipped. FA_KERNEL_MUTANTS=AUTO (the default)
  # builds them where configure sees a GPU (nvidia-smi lists one); elsewhere each one's ctest case
  # only applies its patch, exactly, to a copy of kernels/ (a stale patch fails) and reports itself
  # skipped (77), never passed.
  set(FA_KERNEL_MUTANTS AUTO CACHE STRING "Build the production kernels' mutants: ON, OFF or AUTO (with a GPU)")
  set(fa_build_kernel_mutants ${FA_KERNEL_MUTANTS})
  if(FA_KERNEL_MUTANTS STREQUAL "AUTO")
    execute_process(COMMAND nvidia-smi -L OUTPUT_VARIABLE fa_gpus RESULT_VARIABLE fa_smi_rc ERROR_QUIET)
    if(fa_smi_rc EQUAL 0 AND fa_gpus MATCHES "GPU [0-9]")
      set(fa_build_kernel_mutants ON)
    else()
      set(fa_build_kernel_mutants OFF)
      message(STATUS "No GPU visible: the production kernels' mutants are not built, their patches only "
                     "applied by their tests (-DFA_KERNEL_MUTANTS=ON builds them)")
    endif()
  endif()
  file(GLOB FA_KERNEL_BUG_PATCHES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/bugs/*.patch)
  list(SORT FA_KERNEL_BUG_PATCHES)
  foreach(patch IN LISTS FA_KERNEL_BUG_PATCHES)
    get_filename_component(bug ${patch} NAME_WE)
    file(STRINGS ${patch} test_line REGEX "^Test:")
    file(STRINGS ${patch} kernel_line REGEX "^Kernel:")
    if(NOT test_line MATCHES "^Test: *(.+)$")
      message(FATAL_ERROR "${patch}: a kernel mutant's header needs a 'Test: <filter>' line")
    endif()
    set(filter "${CMAKE_MATCH_1}")
    if(NOT kernel_line MATCHES "^Kernel: *(mma|hopper) *$")
      message(FATAL_ERROR "${patch}: a kernel mutant's header needs 'Kernel: mma' or 'Kernel: hopper'")
    endif()
    set(kernel ${CMAKE_MATCH_1})
    if(NOT TARGET fa_kernel_tests_${kernel})
      message(WARNING "${patch}: kernel ${kernel} has no test program in this build, so neither has this mutant")
      continue()
    endif()
    # `HeadDims: <d> ...`: a bug that only a head dim beyond the default set shows (Part VI's). Without
    # every one of them in FA_HEAD_DIMS the mutant is not built: its tests could not see the bug, and
    # its ctest case only applies the patch and reports itself skipped.
    file(STRINGS ${patch} dims_line REGEX "^HeadDims:")
    set(dims_built TRUE)
    if(dims_line MATCHES "^HeadDims: *(.+)$")
      separate_arguments(needed_dims UNIX_COMMAND "${CMAKE_MATCH_1}")
      foreach(d IN LISTS needed_dims)
        if(NOT d IN_LIST FA_HEAD_DIMS)
          set(dims_built FALSE)
        endif()
      endforeach()
    endif()
    if(fa_build_kernel_mutants AND dims_built)
      fa_add_kernel_mutant(${kernel} ${bug} ${patch} "${filter}")
    else()
      set(name bug.kernel_${kernel}-${bug})
      add_test(NAME ${name}
               COMMAND bash -c "\"$0\" -DSRC_DIR=\"$1\" -DPATCH=\"$2\" -DROOT=\"$3\" -P \"$4\" && { echo \
'the mutant is not built here (no GPU at configure, or a head dim it needs left out of FA_HEAD_DIMS): its \
patch applies exactly, its test is skipped'; exit 77; }"
                       ${CMAKE_COMMAND} ${CMAKE_SOURCE_DIR}/kernels ${patch} ${CMAKE_BINARY_DIR}/kernel_mutants/${bug}
                       ${CMAKE_SOURCE_DIR}/cmake/apply_kernel_patch.cmake)
      set_tests_properties(${name} PROPERTIES LABELS "bug;gpu;kernels" SKIP_RETURN_CODE 77)
    endif()
  endforeach()
endif()

# ---- the lessons' experiments: every steps/NN_name/experiments/<name>.patch ------------------
if(NOT FA_SKIP_MUTANTS)
  file(GLOB FA_EXPERIMENT_PATCHES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/steps/[0-9][0-9]_*/experiments/*.patch)
  list(SORT FA_EXPERIMENT_PATCHES)
  foreach(patch IN LISTS FA_EXPERIMENT_PATCHES)
    get_filename_component(name ${patch} NAME_WE)
    fa_patch_step_number(nn ${patch})
    if(NOT TARGET fa_step${nn})
      continue()
    endif()
    file(STRINGS ${patch} header REGEX "^Test:")
    if(NOT header MATCHES "^Test: *(.+)$")
      message(FATAL_ERROR "${patch}: an experiment's header needs a 'Test: <filter>' line")
    endif()
    fa_add_experiment(${nn} ${name} PATCH ${patch} FILTER "${CMAKE_MATCH_1}")
  endforeach()
endif()

# How run_mutant.sh reads a test program's output (killed, survived, crashed, not run), on
# made-up programs: no GPU needed.
add_test(NAME mutant_selftest COMMAND bash ${CMAKE_SOURCE_DIR}/tests/bugs/run_mutant_selftest.sh)
set_tests_properties(mutant_selftest PROPERTIES LABELS "cpu")

# docs/bug_catalog.md, the patches and the named tests agree (no GPU needed).
find_package(Python3 COMPONENTS Interpreter REQUIRED)
add_test(NAME catalog COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/catalog_check.py
         --repo ${CMAKE_SOURCE_DIR} --build ${CMAKE_BINARY_DIR})
set_tests_properties(catalog PROPERTIES LABELS "cpu")
# ... and it notices when they do not.
add_test(NAME catalog_selftest COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/catalog_check.py --selftest
         --repo ${CMAKE_SOURCE_DIR})
set_tests_properties(catalog_selftest PROPERTIES LABELS "cpu")
