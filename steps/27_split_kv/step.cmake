# Step 10's kernel with each Q tile's keys split across blocks and a combine kernel (Part V). Its
# own tests (tests/) give it a workspace and a split count; the shared suite, which gives neither,
# runs it unsplit. The tuner's, LSE and cp.async tests of steps 06-08 run too. The split's
# combine is checked on the CPU (tests/cpu/split_kv_test.cpp), as is the choice of S.
fa_step(27 split_kv BASE 10
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 08)
