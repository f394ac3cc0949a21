// Step 03's grid: (Q tiles, batch·heads). The corners of both loops at once, with B != H so a
// swapped batch/head decode cannot go unnoticed, and more (b, h) pairs than gridDim.y allows.
#include <gtest/gtest.h>

#include "harness/check.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

// N_q = 65: two Q tiles, the last with one row. N_kv = 33: two K/V tiles, the last with one key.
// B = 3, H = 5, H_kv = 5: every (b, h) block has distinct data.
TEST(Step03Grid, LastRowAndLastKeyTilesWithBNotEqualH) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128}) {
    ProblemShape s;
    s.batch = 3;
    s.heads_q = s.heads_kv = 5;
    s.seqlen_q = 65;
    s.seqlen_kv = 33;
    s.head_dim = d;
    s.seed = 0x9e1d00 + uint64_t(d);
    s.with_lse = false;
    testing::expect_matches_reference(testing::the_step(), s);
  }
}

// blockIdx.y holds batch·heads, and CUDA caps gridDim.y at 65535: the rest spills into z.
// B·H = 65538 leaves the second z slice with three real (b, h) pairs and 65532 empty ones.
TEST(Step03Grid, MoreThan65535BatchHeads) {
  FA_REQUIRE_GPU();
  ProblemShape s;
  s.batch = 2;
  s.heads_q = s.heads_kv = 32769;
  s.seqlen_q = 9;
  s.seqlen_kv = 17;
  s.head_dim = 64;
  s.seed = 0x9e1d01;
  s.with_lse = false;
  testing::expect_matches_reference(testing::the_step(), s);
}

}  // namespace
}  // namespace fa
