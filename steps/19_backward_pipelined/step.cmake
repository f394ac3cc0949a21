# Step 18's backward with its loads pipelined: the next Q tile's Q, dO, LSE and D in flight while
# the current one computes. It runs step 17's tests (both modes) and step 18's repeatability test.
fa_step(19 backward_pipelined BASE 18
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 17 18)
