# Step 17's backward with a deterministic mode (BackwardParams::deterministic). It runs step 17's
# tests (the backward against the fp64 reference, in both modes here) and its own: the same call
# repeated gives the same bits (tests/deterministic_test.cpp).
fa_step(18 backward_deterministic BASE 17
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 17)
