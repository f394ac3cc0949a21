# The production kernels (kernels/): each an object library like a step's, with its build id for
# the tuner's cache, its test program (the shared GPU suite, the tuner's tests and tests/kernels/)
# and its static checks. Linked into libfa2_capi and fa2: the library's choice (FA_STEP_AUTO, the
# package's default) runs them.
#
# FA_HEAD_DIMS chooses the head dims the production kernels are instantiated for (each head dim is
# a set of kernels to compile: a quick build takes one; "all" is every one). The default is the
# lessons' two, 64 and 128, which CI builds; 32, 96, 192 and 256 are Part VI's (forward: kernels 100
# and 101 all four; backward: the mma.sync one all four (256 on sm_90 alone), the Hopper one 32 and
# 96; the decode kernel all four). FA_DTYPES the element types of the production forwards: bf16 (the default,
# which CI builds: the lessons are bf16, so it is always in the list), and fp16 beside it
# ("bf16;fp16", or "all"), which compiles the production kernels a second time (both forwards, the
# decode kernel, both backwards), at every head dim FA_HEAD_DIMS names; without it they refuse fp16
# by name.
set(FA_HEAD_DIMS "64;128" CACHE STRING "head dims the production kernels are built for (some of: 32 64 96 128 192 256, or all)")
set(FA_DTYPES "bf16" CACHE STRING "element types the production kernels are built for (bf16, optionally fp16: bf16;fp16 or all)")
set(fa_kernel_head_dims 32 64 96 128 192 256)
if(FA_HEAD_DIMS STREQUAL "all")
  set(FA_HEAD_DIMS ${fa_kernel_head_dims})
endif()
if(NOT FA_HEAD_DIMS)
  message(FATAL_ERROR "FA_HEAD_DIMS is empty: name at least one of ${fa_kernel_head_dims}")
endif()
foreach(d IN LISTS FA_HEAD_DIMS)
  if(NOT d IN_LIST fa_kernel_head_dims)
    string(REPLACE ";" " " supported "${fa_kernel_head_dims}")
    message(FATAL_ERROR "FA_HEAD_DIMS: head dim ${d} has no production kernel yet (supported: ${supported})")
  endif()
endforeach()
if(FA_BUILD_TESTS AND (NOT "64" IN_LIST FA_HEAD_DIMS OR NOT "128" IN_LIST FA_HEAD_DIMS))
  string(REPLACE ";" " " built "${FA_HEAD_DIMS}")
  message(WARNING "FA_HEAD_DIMS (${built}) leaves out 64 or 128: the production kernels' GPU suites and the "
                  "package's tests call both (the lessons' head dims), so their calls at the missing one are "
                  "refused as unsupported and those tests fail; the kernels themselves are fine")
endif()
set(fa_kernel_dtypes bf16 fp16)  # in DType's order: bit i of FA_KERNEL_DTYPE_MASK is DType value i
if(FA_DTYPES STREQUAL "all")
  set(FA_DTYPES ${fa_kernel_dtypes})
endif()
foreach(t IN LISTS FA_DTYPES)
  if(NOT t IN_LIST fa_kernel_dtypes)
    string(REPLACE ";" " " supported "${fa_kernel_dtypes}")
    message(FATAL_ERROR "FA_DTYPES: element type ${t} has no production kernel yet (supported: ${supported})")
  endif()
endforeach()
if(NOT "bf16" IN_LIST FA_DTYPES)
  message(FATAL_ERROR "FA_DTYPES must include bf16 (got \"${FA_DTYPES}\"): the lessons are bf16; fp16 is built "
                      "beside it (bf16;fp16)")
endif()
set(fa_dtype_mask 0)  # bit i for DType value i (kernels/launch.h)
foreach(t IN LISTS FA_DTYPES)
  list(FIND fa_kernel_dtypes ${t} i)
  math(EXPR fa_dtype_mask "${fa_dtype_mask} | (1 << ${i})" OUTPUT_FORMAT HEXADECIMAL)
endforeach()
# The lessons' head dims among them: the steps a production kernel is checked against have no others.
set(fa_step_head_dims ${FA_HEAD_DIMS})
list(FILTER fa_step_head_dims INCLUDE REGEX "^(64|128)$")
set(fa_head_dim_mask 0)  # bit d/8 for head dim d (kernels/launch.h)
foreach(d IN LISTS FA_HEAD_DIMS)
  math(EXPR fa_head_dim_mask "${fa_head_dim_mask} | (1 << (${d} / 8))" OUTPUT_FORMAT HEXADECIMAL)
endforeach()
# The definitions every kernel object takes, so that kernels/launch.h reads the same in all of them.
set(fa_kernel_masks FA_KERNEL_HEAD_DIM_MASK=${fa_head_dim_mask}ull FA_KERNEL_DTYPE_MASK=${fa_dtype_mask}u)

# The production backward on mma.sync (kernels/bwd_mma.cu, from step 23): one object library for every
# architecture the build targets, registered by the mma.sync production kernel (its backward),
# linked wherever the production kernels are.
add_library(fa_kernel_bwd_mma OBJECT ${CMAKE_SOURCE_DIR}/kernels/bwd_mma.cu)
target_link_libraries(fa_kernel_bwd_mma PUBLIC fa_library)
target_compile_definitions(fa_kernel_bwd_mma PRIVATE ${fa_kernel_masks})
target_compile_options(fa_kernel_bwd_mma PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-diag-suppress=177>)
set_property(GLOBAL APPEND PROPERTY FA_KERNEL_TARGETS fa_kernel_bwd_mma)
# The Hopper backward (kernels/bwd_hopper.cu, from step 24), sm_90a alone, registered by the Hopper
# production kernel.
add_library(fa_kernel_bwd_hopper OBJECT ${CMAKE_SOURCE_DIR}/kernels/bwd_hopper.cu)
set_target_properties(fa_kernel_bwd_hopper PROPERTIES CUDA_ARCHITECTURES 90a)
target_link_libraries(fa_kernel_bwd_hopper PUBLIC fa_library)
target_compile_definitions(fa_kernel_bwd_hopper PRIVATE ${fa_kernel_masks})
target_compile_options(fa_kernel_bwd_hopper PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-diag-suppress=177>)
set_property(GLOBAL APPEND PROPERTY FA_KERNEL_TARGETS fa_kernel_bwd_hopper)

# The production decode (kernels/fwd_decode.cu, from step 28): GQA-packed split-KV on mma.sync, for
# every architecture the build targets; both production forwards hand it the calls it takes. Its own
# tuner, so its own build id.
file(GLOB_RECURSE fa_decode_inputs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/device/* ${CMAKE_SOURCE_DIR}/kernels/*.h)
list(SORT fa_decode_inputs)
list(PREPEND fa_decode_inputs ${CMAKE_SOURCE_DIR}/kernels/fwd_decode.cu)
list(APPEND fa_decode_inputs ${CMAKE_SOURCE_DIR}/library/tuner.h)
set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${fa_decode_inputs})
fa_build_id(fa_decode_build_id ${fa_decode_inputs})
string(SHA256 fa_decode_build_id "${fa_decode_build_id}\nhead_dims=${FA_HEAD_DIMS}\n")
string(SUBSTRING ${fa_decode_build_id} 0 16 fa_decode_build_id)
add_library(fa_kernel_decode OBJECT ${CMAKE_SOURCE_DIR}/kernels/fwd_decode.cu)
target_link_libraries(fa_kernel_decode PUBLIC fa_library)
target_compile_definitions(fa_kernel_decode PRIVATE FA_BUILD_ID="${fa_decode_build_id}"
                                                    ${fa_kernel_masks})
target_compile_options(fa_kernel_decode PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-diag-suppress=177>)
set_property(GLOBAL APPEND PROPERTY FA_KERNEL_TARGETS fa_kernel_decode)

# fa_production_kernel(<name> <source> [ARCH <architectures>] [SAME_AS_STEP <NN>] [INS <instruction>...]
#                      [SAME_SKIP <regex>] [STATIC <sass_check rules>...] [TESTS <sources>...])
# ARCH as in fa_step. SAME_AS_STEP: the static check that every configuration both compile has the
# step's count of each instruction in INS (default: tensor-core, ldmatrix, cp.async, exp2);
# SAME_SKIP: the kernel's instantiations it leaves out (those the step has no counterpart for).
function(fa_production_kernel name source)
  cmake_parse_arguments(A "" "SAME_AS_STEP;ARCH;SAME_SKIP" "STATIC;TESTS;INS" ${ARGN})
  file(GLOB_RECURSE device_files CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/device/* ${CMAKE_SOURCE_DIR}/kernels/*.h)
  list(SORT device_files)
  set(inputs ${CMAKE_SOURCE_DIR}/${source} ${device_files} ${CMAKE_SOURCE_DIR}/library/tuner.h)
  set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${inputs})
  fa_build_id(build_id ${inputs})
  string(SHA256 build_id "${build_id}\narch=${A_ARCH}\nhead_dims=${FA_HEAD_DIMS}\n")
  string(SUBSTRING ${build_id} 0 16 build_id)
  add_library(fa_kernel_${name} OBJECT ${CMAKE_SOURCE_DIR}/${source})
  if(A_ARCH)
    set_target_properties(fa_kernel_${name} PROPERTIES CUDA_ARCHITECTURES "${A_ARCH}")
  endif()
  target_link_libraries(fa_kernel_${name} PUBLIC fa_library)
  target_compile_definitions(fa_kernel_${name} PRIVATE FA_BUILD_ID="${build_id}" ${fa_kernel_masks})
  # A configuration at a head dim the build leaves out is never instantiated, so nvcc would warn
  # that the members of its Config type go unused (#177) in a build with fewer head dims.
  target_compile_options(fa_kernel_${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-diag-suppress=177>)
  set_property(GLOBAL APPEND PROPERTY FA_KERNEL_TARGETS fa_kernel_${name})
  if(NOT FA_BUILD_TESTS)
    return()
  endif()
  # The tests as an object library of their own: the kernel's test program and its bug-catalog
  # mutants' (tests/bugs/mutants.cmake, kernels/bugs/) link the same objects.
  add_library(fa_kernel_tests_${name} OBJECT ${A_TESTS} ${CMAKE_SOURCE_DIR}/steps/06_autotune/tests/autotune_test.cpp)
  target_link_libraries(fa_kernel_tests_${name} PRIVATE fa_harness GTest::gtest)
  set_property(GLOBAL PROPERTY FA_KERNEL_SOURCE_${name} ${source})
  set_property(GLOBAL PROPERTY FA_KERNEL_ARCH_${name} "${A_ARCH}")
  set_property(GLOBAL PROPERTY FA_KERNEL_BUILD_ID_${name} ${build_id})
  add_executable(fa_test_kernel_${name} $<TARGET_OBJECTS:fa_kernel_tests_${name}>)
  target_link_libraries(fa_test_kernel_${name} PRIVATE fa_gpu_suite fa_kernel_${name} fa_kernel_bwd_mma
                                                       fa_kernel_bwd_hopper fa_kernel_decode fa_harness GTest::gtest)
  gtest_discover_tests(fa_test_kernel_${name} TEST_PREFIX "kernels.${name}." DISCOVERY_TIMEOUT 60
                       DISCOVERY_MODE PRE_TEST PROPERTIES LABELS "gpu")
  fa_sass_check_command(cmd fa_kernel_${name} ${A_STATIC})
  add_test(NAME static.kernels.${name} COMMAND ${cmd})
  set_tests_properties(static.kernels.${name} PROPERTIES LABELS "static;kernels")
  # Free abstraction: per configuration, the step's count of each named instruction.
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(A_SAME_AS_STEP AND Python3_Interpreter_FOUND AND fa_step_head_dims)
    set(ins)
    if(A_INS)
      set(ins --ins ${A_INS})
    endif()
    if(A_SAME_SKIP)
      list(APPEND ins --skip ${A_SAME_SKIP})
    endif()
    add_test(NAME static.kernels.${name}.same_as_step${A_SAME_AS_STEP}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/static/same_counts.py --cuobjdump ${FA_CUOBJDUMP}
                     --kernel $<TARGET_OBJECTS:fa_kernel_${name}> --step $<TARGET_OBJECTS:fa_step${A_SAME_AS_STEP}> ${ins}
                     --head-dims ${fa_step_head_dims})
    set_tests_properties(static.kernels.${name}.same_as_step${A_SAME_AS_STEP} PROPERTIES LABELS "static;kernels")
  endif()
endfunction()

# The backward's tests, as on steps 17-21: against the fp64 reference in both modes, and bit-for-bit
# repeatable in the deterministic one.
set(fa_backward_tests ${CMAKE_SOURCE_DIR}/steps/17_backward_mma/tests/backward_test.cpp
                      ${CMAKE_SOURCE_DIR}/steps/18_backward_deterministic/tests/deterministic_test.cpp)

# Step 10's rules, which the default policies must keep: tensor cores, ldmatrix, cp.async, no
# local memory, and every kernel the HMMAs of one K/V tile. The bf16 instantiations are compared with
# step 10 (the fp16 ones, __half in their names, have checks of their own below).
fa_production_kernel(mma kernels/fwd_mma.cu SAME_AS_STEP 10 SAME_SKIP "WindowFlag|__half"
  STATIC REQUIRE HMMA LDSM LDGSTS HMMA_PER_KV_TILE 64:2 KERNEL attention_kernel
  TESTS ${CMAKE_SOURCE_DIR}/tests/kernels/kernel_mma_test.cpp ${CMAKE_SOURCE_DIR}/tests/kernels/decode_test.cpp
        ${CMAKE_SOURCE_DIR}/steps/29_ragged_kv_cache/tests/ragged_kv_cache_test.cpp
        ${CMAKE_SOURCE_DIR}/steps/30_paged_kv_cache/tests/paged_kv_cache_test.cpp
        ${CMAKE_SOURCE_DIR}/steps/31_varlen/tests/varlen_test.cpp
        ${CMAKE_SOURCE_DIR}/steps/32_kv_append/tests/kv_append_test.cpp
        ${fa_backward_tests})

# Step 16's rules (sm_90a alone): wgmma, TMA loads and stores, mbarriers, setmaxnreg, no mma.sync
# or cp.async, and step 16's instruction counts per configuration, UTMASTG included, for the
# batched instantiations (the packed ones, for varlen calls, have no step 16 counterpart).
fa_production_kernel(hopper kernels/fwd_hopper.cu ARCH 90a SAME_AS_STEP 16 SAME_SKIP "Packed|WindowFlag|__half"
  INS HGMMA UTMALDG UTMASTG MUFU.EX2 BAR.SYNC FENCE.VIEW.ASYNC.S
  STATIC REQUIRE HGMMA UTMALDG UTMASTG SYNCS USETMAXREG FORBID HMMA LDSM LDGSTS MAX_COUNT WARPGROUP.ARRIVE:4
         KERNEL attention_kernel
  TESTS ${CMAKE_SOURCE_DIR}/tests/kernels/kernel_hopper_test.cpp ${CMAKE_SOURCE_DIR}/tests/kernels/decode_test.cpp
        ${CMAKE_SOURCE_DIR}/steps/29_ragged_kv_cache/tests/ragged_kv_cache_test.cpp
        ${CMAKE_SOURCE_DIR}/steps/30_paged_kv_cache/tests/paged_kv_cache_test.cpp
        ${CMAKE_SOURCE_DIR}/steps/31_varlen/tests/varlen_test.cpp
        ${CMAKE_SOURCE_DIR}/steps/32_kv_append/tests/kv_append_test.cpp
        ${fa_backward_tests})

# The fp16 forwards (FA_DTYPES=bf16;fp16): every rule above holds for them too (the checks of
# static.kernels.mma and .hopper read every attention_kernel: no local memory, the HMMAs of a tile),
# and here what is theirs: their tensor-core instructions are the fp16 forms, never a bf16 one (an
# fp16 kernel that multiplies with the bf16 instruction reads its operands' bits as the other type),
# and their counts of each instruction are the step's, configuration by configuration, as the bf16
# kernels' are: the element type costs nothing.
if(FA_BUILD_TESTS AND "fp16" IN_LIST FA_DTYPES)
  fa_sass_check_command(cmd fa_kernel_mma REQUIRE HMMA LDSM LDGSTS FORBID HMMA.16816.F32.BF16
                        HMMA_PER_KV_TILE 64:2 KERNEL "attention_kernel.*__half")
  add_test(NAME static.kernels.mma.fp16 COMMAND ${cmd})
  set_tests_properties(static.kernels.mma.fp16 PROPERTIES LABELS "static;kernels")
  fa_sass_check_command(cmd fa_kernel_hopper REQUIRE HGMMA UTMALDG UTMASTG FORBID "HGMMA.64x[0-9]+x16.F32.BF16"
                        KERNEL "attention_kernel.*__half")
  add_test(NAME static.kernels.hopper.fp16 COMMAND ${cmd})
  set_tests_properties(static.kernels.hopper.fp16 PROPERTIES LABELS "static;kernels")
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND AND fa_step_head_dims)
    add_test(NAME static.kernels.mma.fp16_same_as_step10
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/static/same_counts.py --cuobjdump ${FA_CUOBJDUMP}
                     --kernel $<TARGET_OBJECTS:fa_kernel_mma> --step $<TARGET_OBJECTS:fa_step10> --skip WindowFlag
                     --kernel-only __half --head-dims ${fa_step_head_dims})
    add_test(NAME static.kernels.hopper.fp16_same_as_step16
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/static/same_counts.py --cuobjdump ${FA_CUOBJDUMP}
                     --kernel $<TARGET_OBJECTS:fa_kernel_hopper> --step $<TARGET_OBJECTS:fa_step16>
                     --ins HGMMA UTMALDG UTMASTG MUFU.EX2 BAR.SYNC FENCE.VIEW.ASYNC.S --skip "Packed|WindowFlag"
                     --kernel-only __half --head-dims ${fa_step_head_dims})
    set_tests_properties(static.kernels.mma.fp16_same_as_step10 static.kernels.hopper.fp16_same_as_step16
                         PROPERTIES LABELS "static;kernels")
  endif()
endif()
# The same rule for the decode kernel's and both backwards' fp16 kernels: the fp16 tensor-core forms
# alone (their bf16 twins are held to the lessons' counts above; the type changes nothing else).
if(FA_BUILD_TESTS AND "fp16" IN_LIST FA_DTYPES)
  fa_sass_check_command(cmd fa_kernel_decode REQUIRE HMMA FORBID HMMA.16816.F32.BF16 KERNEL "decode_kernel.*__half")
  add_test(NAME static.kernels.decode.fp16 COMMAND ${cmd})
  fa_sass_check_command(cmd fa_kernel_bwd_mma REQUIRE HMMA FORBID HMMA.16816.F32.BF16 KERNEL "backward_kernel.*__half")
  add_test(NAME static.kernels.bwd_mma.fp16 COMMAND ${cmd})
  fa_sass_check_command(cmd fa_kernel_bwd_hopper REQUIRE HGMMA FORBID "HGMMA.64x[0-9]+x16.F32.BF16"
                        KERNEL "backward_kernel.*__half")
  add_test(NAME static.kernels.bwd_hopper.fp16 COMMAND ${cmd})
  set_tests_properties(static.kernels.decode.fp16 static.kernels.bwd_mma.fp16 static.kernels.bwd_hopper.fp16
                       PROPERTIES LABELS "static;kernels")
endif()

# The backward's rules: step 23's (tensor cores, ldmatrix, cp.async, no local memory; on sm_90 dQ
# through vector atomics only), and step 23's instruction counts per configuration.
if(FA_BUILD_TESTS)
  # The decode kernel: step 28's rules (tensor cores, ldmatrix, cp.async, no local memory). Its
  # tests run through kernels 100 and 101 (tests/kernels/decode_test.cpp).
  fa_sass_check_command(cmd fa_kernel_decode REQUIRE HMMA LDSM LDGSTS KERNEL decode_kernel)
  add_test(NAME static.kernels.decode COMMAND ${cmd})
  set_tests_properties(static.kernels.decode PROPERTIES LABELS "static;kernels")
  fa_sass_check_command(cmd fa_kernel_bwd_mma REQUIRE HMMA LDSM LDGSTS KERNEL backward_kernel)
  add_test(NAME static.kernels.bwd_mma COMMAND ${cmd})
  set_tests_properties(static.kernels.bwd_mma PROPERTIES LABELS "static;kernels")
  # dQ's additions two floats at a time on sm_90: a thread adds its (16 rows, DQ_COLS) slice of dQ, 8
  # x2 atomics at D = 64 and up; at D = 32 the slice is 16 columns, 4 (built with FA_HEAD_DIMS=all).
  fa_sass_check_command(cmd fa_kernel_bwd_mma ARCH sm_90a? MIN_COUNT REDG.E.ADD.F32x2:8 FORBID REDG.E.ADD.F32
                        KERNEL "backward_kernelILi([0-9][0-9][0-9]|[4-9][0-9])E")
  add_test(NAME static.kernels.bwd_mma.vector_atomics COMMAND ${cmd})
  set_tests_properties(static.kernels.bwd_mma.vector_atomics PROPERTIES LABELS "static;kernels" SKIP_RETURN_CODE 77)
  if(32 IN_LIST FA_HEAD_DIMS)
    fa_sass_check_command(cmd fa_kernel_bwd_mma ARCH sm_90a? MIN_COUNT REDG.E.ADD.F32x2:4 FORBID REDG.E.ADD.F32
                          KERNEL "backward_kernelILi32E")
    add_test(NAME static.kernels.bwd_mma.vector_atomics_d32 COMMAND ${cmd})
    set_tests_properties(static.kernels.bwd_mma.vector_atomics_d32 PROPERTIES LABELS "static;kernels"
                                                                               SKIP_RETURN_CODE 77)
  endif()
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND AND TARGET fa_step23 AND fa_step_head_dims)
    add_test(NAME static.kernels.bwd_mma.same_as_step23
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/static/same_counts.py --cuobjdump ${FA_CUOBJDUMP}
                     --family backward --kernel $<TARGET_OBJECTS:fa_kernel_bwd_mma> --step $<TARGET_OBJECTS:fa_step23>
                     --ins HMMA LDSM LDGSTS MUFU.EX2 RED REDG BAR.SYNC --head-dims ${fa_step_head_dims}
                     --skip "WindowFlag|__half")
    set_tests_properties(static.kernels.bwd_mma.same_as_step23 PROPERTIES LABELS "static;kernels")
  endif()
endif()

# The Hopper backward's rules: step 37's (wgmma only, TMA loads behind mbarriers, setmaxnreg, dQ
# through the copy engine's bulk reduce and no atomic, no cp.async, no local memory) and step 37's
# instruction counts per configuration (step 24's kernel on step 33's diet, warp-specialised as
# step 34, dQ by step 36's copy-engine warp, step 37's 128-query tiles at D = 64).
if(FA_BUILD_TESTS)
  fa_sass_check_command(cmd fa_kernel_bwd_hopper REQUIRE HGMMA UTMALDG SYNCS USETMAXREG UTMAREDG
                        FORBID HMMA LDSM LDGSTS REDG ATOMG KERNEL backward_kernel)
  add_test(NAME static.kernels.bwd_hopper COMMAND ${cmd})
  set_tests_properties(static.kernels.bwd_hopper PROPERTIES LABELS "static;kernels")
  if(Python3_Interpreter_FOUND AND TARGET fa_step37 AND fa_step_head_dims)
    add_test(NAME static.kernels.bwd_hopper.same_as_step37
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/static/same_counts.py --cuobjdump ${FA_CUOBJDUMP}
                     --family backward --kernel $<TARGET_OBJECTS:fa_kernel_bwd_hopper> --step $<TARGET_OBJECTS:fa_step37>
                     --ins HGMMA UTMALDG UTMAREDG SYNCS.ARRIVE MUFU.EX2 RED REDG BAR.SYNC BAR.ARV
                     --head-dims ${fa_step_head_dims} --skip "WindowFlag|__half")
    set_tests_properties(static.kernels.bwd_hopper.same_as_step37 PROPERTIES LABELS "static;kernels")
  endif()
endif()

# FA_HEAD_DIMS refuses a head dim with no kernel, and compiles only what it names.
if(FA_BUILD_TESTS)
  add_test(NAME kernels.head_dims_option
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/kernels/head_dims_option.sh ${CMAKE_SOURCE_DIR} ${CMAKE_CUDA_COMPILER}
                   ${FA_CUOBJDUMP})
  set_tests_properties(kernels.head_dims_option PROPERTIES LABELS "static;kernels")
endif()
