// Step 31's packed sequences against the fp64 reference, sequence by sequence
// (tests/gpu/varlen_check.h): lengths that differ between queries and keys, sequences with no
// queries or no keys, a longest length above every real one, NaN rows past the packed ones that
// must stay NaN (O, LSE) and never reach a result (K, V).
#include <gtest/gtest.h>

#include "tests/gpu/varlen_check.h"

namespace fa {
namespace {

using testing::expect_varlen_matches;

TEST(Varlen, PrefillEachSequenceItsOwnLengths) {
  FA_REQUIRE_GPU();
  // Ragged tiles, one row, a sequence with no keys, one longer than a tile of packed rows.
  for (int64_t d : {64, 128})
    for (bool causal : {false, true})
      expect_varlen_matches({100, 1, 7, 300, 64}, {100, 513, 0, 257, 90}, 8, 2, d, causal, 0);
}

TEST(Varlen, LongestAboveEveryLengthAndSequencesWithoutQueries) {
  FA_REQUIRE_GPU();
  expect_varlen_matches({0, 33, 0, 129}, {17, 200, 5, 129}, 4, 4, 64, true, 0, /*slack=*/37);
}

// Sequences of many Q and KV tiles (the prefill kernels' tiles are up to 256 rows and 128 keys),
// lengths that end inside a tile and on its edge, and a call whose tensors go on past the last
// sequence with NaN rows: its last sequence's tiles reach into them, which must be neither read
// into the result (K masked, V zeroed or never loaded) nor written (O and LSE stay NaN).
TEST(Varlen, LongSequencesAndRowsPastTheLast) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128})
    for (bool causal : {false, true})
      expect_varlen_matches({700, 37, 1100, 384, 129}, {900, 37, 1100, 200, 641}, 4, 2, d, causal, 0, 0,
                            /*rows_past_last=*/true);
}

TEST(Varlen, DecodeRowsSplit) {
  FA_REQUIRE_GPU();
  // One or a few new rows per sequence against its keys, split 3 or 24 ways through the workspace
  // (24: the production decode kernel's combine gives a row 4 or 8 warps, and the rows past a
  // shorter sequence's end share their blocks with rows that exist).
  for (int64_t d : {64, 128})
    for (int splits : {1, 3, 24}) expect_varlen_matches({1, 4, 1, 2}, {1000, 77, 1, 4096}, 32, 8, d, true, splits);
}

// A sliding window on packed sequences (a padded batch of a model with local layers, unpadded):
// decode-sized rows, split or not, each sequence's window at its own diagonal (the production
// kernels' decode kernel). A step without a window refuses it by name, with nothing written.
TEST(Varlen, SlidingWindowDecodeRows) {
  FA_REQUIRE_GPU();
  testing::VarlenOptions window;
  window.window = {100, 0};
  if (!testing::the_step().caps.sliding_window) window.refusal = "sliding window";
  for (int64_t d : {64, 128})
    for (int splits : {1, 3})
      expect_varlen_matches({1, 4, 1, 2}, {1000, 77, 1, 4096}, 32, 8, d, true, splits, 0, false, "", window);
}

}  // namespace
}  // namespace fa
