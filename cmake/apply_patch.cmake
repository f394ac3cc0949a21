# Copies SRC to ROOT/REL/attention.cu and applies PATCH (paths a/REL/attention.cu) to it.
# --fuzz=0: every context line must match. A patch applied with fuzz could inject its bug in the
# wrong place after the step has changed, and the mutant would then test something else.
file(REMOVE_RECURSE ${ROOT})
file(MAKE_DIRECTORY ${ROOT}/${REL})
configure_file(${SRC} ${ROOT}/${REL}/attention.cu COPYONLY)
include(${CMAKE_CURRENT_LIST_DIR}/patch_exactly.cmake)
fa_patch_exactly(${ROOT} ${PATCH})
if(NOT rc EQUAL 0)
  file(REMOVE ${ROOT}/${REL}/attention.cu)
  get_filename_component(bug ${PATCH} NAME_WE)
  string(SUBSTRING ${REL} 6 2 nn)  # REL is steps/NN_name
  message(FATAL_ERROR "patch ${PATCH} no longer applies exactly to ${SRC}:\n${out}${err}\n"
          "The step has changed under the patch. Re-make it against the current attention.cu, e.g.\n"
          "  scripts/new_bug_patch.sh ${nn} ${bug} '<Test filter>' '<Bug: line>' <Catalog id>\n"
          "and keep its header (Bug:, Catalog:, Test:/Static:, Args:, Symptom:).\n"
          "To build without the mutants meanwhile: configure with -DFA_SKIP_MUTANTS=ON.")
endif()
