# The forward is step 10's; the backward's kernels run beside it (no local memory anywhere). Its
# own tests: the backward against the fp64 reference (tests/backward_test.cpp).
fa_step(17 backward_mma BASE 10
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07)
