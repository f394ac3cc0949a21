# fa_patch_exactly(<root> <patch>): applies <patch> (paths a/..., b/...) inside <root> with --fuzz=0:
# every context line must match, since a patch applied with fuzz could inject its bug in the wrong
# place after the code has changed, and its mutant would then test something else. Sets rc, out and
# err for the caller's message. Shared by apply_patch.cmake (a step's copy) and
# apply_kernel_patch.cmake (the production kernels' copies).
macro(fa_patch_exactly root patch)
  find_program(PATCH_EXE patch)
  if(NOT PATCH_EXE)
    message(FATAL_ERROR "the 'patch' program is needed to build the bug-catalog mutants")
  endif()
  execute_process(COMMAND ${PATCH_EXE} -p1 --fuzz=0 --batch --forward --no-backup-if-mismatch -d ${root} -i ${patch}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
endmacro()
