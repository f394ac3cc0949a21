// The per-sequence arithmetic the Part V kernels run before anything else, on the CPU (the same
// __host__ __device__ code): a packed sequence's rows from its offsets, clamped to the tensor and to
// the longest length whatever the offsets hold (device/varlen.h), and a power-of-two page size's
// shift (device/paged_kv.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "device/paged_kv.h"
#include "device/varlen.h"

namespace fa {
namespace {

TEST(VarlenRows, WellFormedOffsetsGiveEachSequenceItsRows) {
  const std::vector<int32_t> cu = {0, 5, 5, 12};  // lengths 5, 0, 7
  const SequenceRows a = sequence_rows(cu.data(), 0, 12, 7), b = sequence_rows(cu.data(), 1, 12, 7),
                     c = sequence_rows(cu.data(), 2, 12, 7);
  EXPECT_EQ(a.first, 0);
  EXPECT_EQ(a.length, 5);
  EXPECT_EQ(b.first, 5);
  EXPECT_EQ(b.length, 0);
  EXPECT_EQ(c.first, 5);
  EXPECT_EQ(c.length, 7);
}

// Where a sequence's rows and LSEs are: packed with varlen, batch entries without.
TEST(VarlenRows, SequenceAndLseOffsets) {
  const std::vector<int32_t> cu = {0, 5, 5, 12};
  AttentionParams p;
  p.batch = 3, p.heads_q = 4, p.seqlen_q = 7, p.total_q = 12;
  const Strides s{/*batch=*/7 * 4 * 64, /*head=*/64, /*seq=*/4 * 64, /*dim=*/1};
  const SequenceRows c = sequence_rows(cu.data(), 2, 12, 7);
  EXPECT_EQ(sequence_offset(s, 2, c, true), 5 * 4 * 64);  // its first packed row
  EXPECT_EQ(sequence_offset(s, 2, c, false), 2 * 7 * 4 * 64);
  EXPECT_EQ(lse_offset(p, 2, 3, c, 6, true), 3 * 12 + 5 + 6);        // (H_q, total_q)
  EXPECT_EQ(lse_offset(p, 2, 3, c, 6, false), (2 * 4 + 3) * 7 + 6);  // (B, H_q, N_q)
}

// Offsets the host never sees can be anything: every sequence stays inside the tensor and within the
// longest length the grid was sized for.
TEST(VarlenRows, BadOffsetsAreClampedIntoTheTensor) {
  const std::vector<int32_t> cu = {-4, 3, 100, 50, 2000000000};
  const int64_t total = 60, longest = 20;
  for (int64_t b = 0; b + 1 < int64_t(cu.size()); ++b) {
    const SequenceRows s = sequence_rows(cu.data(), b, total, longest);
    EXPECT_GE(s.first, 0) << b;
    EXPECT_LE(s.first, total) << b;
    EXPECT_GE(s.length, 0) << b;
    EXPECT_LE(s.length, longest) << b;
    EXPECT_LE(s.first + s.length, total) << b;
  }
  EXPECT_EQ(sequence_rows(cu.data(), 0, total, longest).length, 3);   // from row 0, not −4
  EXPECT_EQ(sequence_rows(cu.data(), 1, total, longest).length, 20);  // 97 rows cut to the longest
  EXPECT_EQ(sequence_rows(cu.data(), 2, total, longest).length, 0);   // starts past the tensor
  EXPECT_EQ(sequence_rows(cu.data(), 3, total, longest).length, 10);  // cut at the tensor's end
}

// A sequence's own diagonal: its keys minus its queries bottom-right (N_q > N_kv: negative, its
// first rows see nothing), 0 top-left, whatever the call's longest lengths.
TEST(VarlenRows, EachSequenceItsOwnDiagonal) {
  AttentionParams p;
  p.seqlen_q = 4096, p.seqlen_kv = 8192;  // the longest: never the answer
  p.causal_align = CausalAlign::bottom_right;
  EXPECT_EQ(sequence_causal_offset(p, 100, 300), 200);
  EXPECT_EQ(sequence_causal_offset(p, 300, 100), -200);
  p.causal_align = CausalAlign::top_left;
  EXPECT_EQ(sequence_causal_offset(p, 100, 300), 0);
}

TEST(PagedRows, PageSizeShiftIsItsLog2) {
  for (int s = 0; s <= 30; ++s) EXPECT_EQ(tile::log2_of_power_of_two(int64_t(1) << s), s);
}

}  // namespace
}  // namespace fa
