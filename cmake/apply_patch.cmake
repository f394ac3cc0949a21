# Copies SRC to ROOT/REL/attention.cu and applies PATCH (paths a/REL/attention.cu) to it.
file(REMOVE_RECURSE ${ROOT})
file(MAKE_DIRECTORY ${ROOT}/${REL})
configure_file(${SRC} ${ROOT}/${REL}/attention.cu COPYONLY)
find_program(PATCH_EXE patch)
if(NOT PATCH_EXE)
  message(FATAL_ERROR "the 'patch' program is needed to build the bug-catalog mutants")
endif()
execute_process(COMMAND ${PATCH_EXE} -p1 --batch --forward --no-backup-if-mismatch -d ${ROOT} -i ${PATCH}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  file(REMOVE ${ROOT}/${REL}/attention.cu)
  message(FATAL_ERROR "patch ${PATCH} no longer applies to ${SRC}:\n${out}${err}")
endif()
