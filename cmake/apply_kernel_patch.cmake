# Copies the production kernels' sources (SRC_DIR = kernels/: its .h and .cu files) to ROOT/kernels
# and applies PATCH (paths a/kernels/<file>) there, exactly (patch_exactly.cmake). The
# mutant's kernel objects are compiled from ROOT/kernels with ROOT first on the include path, so
# that every "kernels/<header>" they include is the patched copy.
file(REMOVE_RECURSE ${ROOT})
file(MAKE_DIRECTORY ${ROOT}/kernels)
file(GLOB sources ${SRC_DIR}/*.h ${SRC_DIR}/*.cu)
foreach(f IN LISTS sources)
  get_filename_component(name ${f} NAME)
  configure_file(${f} ${ROOT}/kernels/${name} COPYONLY)
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/patch_exactly.cmake)
fa_patch_exactly(${ROOT} ${PATCH})
if(NOT rc EQUAL 0)
  file(REMOVE_RECURSE ${ROOT}/kernels)
  message(FATAL_ERROR "patch ${PATCH} no longer applies exactly to kernels/:\n${out}${err}\n"
          "The kernel has changed under the patch: re-make it against the current file (diff -u with paths "
          "a/kernels/<file> and b/kernels/<file>) and keep its header (Bug:, Catalog:, Kernel:, Test:).\n"
          "To build without the mutants meanwhile: configure with -DFA_SKIP_MUTANTS=ON.")
endif()
# The outputs the build waits for, touched so that they are newer than the patch.
foreach(f IN LISTS sources)
  get_filename_component(name ${f} NAME)
  file(TOUCH_NOCREATE ${ROOT}/kernels/${name})
endforeach()
