// GQA packing's bookkeeping (device/gqa_pack.h), checked against brute force on the CPU: every
// packed row stands for one (head, query) and reaches its address; the packed mask is the causal
// rule on the row's query; and a packed tile's KV range, from its queries, holds every key a row
// of it sees, with every tile before its first masked one fully visible to all its rows.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "device/gqa_pack.h"
#include "device/tiles.h"

namespace fa {
namespace {

TEST(GqaPack, EveryPackedRowIsOneHeadAndQuery) {
  for (int pack : {1, 3, 4, 7, 32})
    for (int n_q : {1, 5, 100}) {
      // A (B, H, N, D)-like tensor: heads 1000 elements apart, queries 10.
      const int64_t head_stride = 1000, seq_stride = 10;
      const PackedRows<const int> rows{nullptr, head_stride, seq_stride, pack};
      std::set<std::pair<int, int>> seen;
      for (int r = 0; r < n_q * pack; ++r) {
        const int g = r % pack, i = packed_query(r, pack);
        EXPECT_EQ(rows(r) - rows(0), g * head_stride + i * seq_stride) << "row " << r << ", pack " << pack;
        EXPECT_TRUE(seen.insert({g, i}).second) << "row " << r << " repeats (head " << g << ", query " << i << ")";
        EXPECT_LT(i, n_q);
      }
      EXPECT_EQ(int(seen.size()), n_q * pack);
    }
}

TEST(GqaPack, PackedTileRangeHoldsEveryVisibleKey) {
  for (int pack : {1, 3, 4, 7, 32})
    for (auto [n_q, n_kv] : {std::pair{1, 1000}, std::pair{5, 777}, std::pair{100, 301}, std::pair{70, 33}})
      for (bool causal : {false, true})
        for (int64_t offset : {int64_t(0), int64_t(n_kv - n_q)})
          for (int block_m : {64, 128}) {
            const int block_n = 64, n_rows = n_q * pack;
            for (int m_start = 0; m_start < n_rows; m_start += block_m) {
              const QueryRange qr = packed_tile_queries(m_start, block_m, n_rows, pack);
              const int end = kv_tile_end(qr.first, qr.count, block_n, n_kv, causal, offset);
              const int first_masked = kv_tile_first_masked(qr.first, qr.count, block_n, n_kv, causal, offset);
              const PackedCausalMask mask{n_kv, causal, offset, pack};
              int last_visible = -1;
              bool tiles_before_first_masked_full = true;
              for (int r = m_start; r < std::min(m_start + block_m, n_rows); ++r)
                for (int j = 0; j < n_kv + block_n; ++j) {
                  const bool vis = mask(r, j);
                  EXPECT_EQ(vis, j < n_kv && (!causal || causal_visible(packed_query(r, pack), j, offset)));
                  if (vis) last_visible = std::max(last_visible, j);
                  if (j / block_n < first_masked && !vis) tiles_before_first_masked_full = false;
                }
              SCOPED_TRACE(::testing::Message() << "pack " << pack << " N_q " << n_q << " N_kv " << n_kv << " causal "
                                                << causal << " offset " << offset << " tile at row " << m_start);
              EXPECT_EQ(end, last_visible < 0 ? 0 : last_visible / block_n + 1) << "the tile's last visible key";
              EXPECT_TRUE(tiles_before_first_masked_full);
            }
          }
}

// The decode kernel's window on packed rows: PackedWindowMask is key_visible on each row's query
// (and keys past N_kv hidden), and kv_tile_span on the tile's queries holds every visible key, its
// [first_full, end_full) tiles whole for every row of the tile.
TEST(GqaPack, PackedWindowSpanHoldsEveryVisibleKeyAndMasksTheRest) {
  for (int pack : {1, 4, 7})
    for (auto [n_q, n_kv] : {std::pair{1, 1000}, std::pair{5, 777}, std::pair{70, 33}})
      for (bool causal : {false, true})
        for (int64_t offset : {int64_t(0), int64_t(n_kv - n_q)})
          for (auto [left, right] : {std::pair{int64_t(100), int64_t(0)}, std::pair{int64_t(0), int64_t(0)},
                                     std::pair{int64_t(200), int64_t(50)}, std::pair{int64_t(-1), int64_t(3)},
                                     std::pair{int64_t(5), int64_t(-1)}}) {
            const int block_m = 64, block_n = 64, n_rows = n_q * pack;
            const PackedWindowMask mask{WindowMask(n_kv, causal, offset, left, right), pack};
            for (int m_start = 0; m_start < n_rows; m_start += block_m) {
              SCOPED_TRACE(::testing::Message() << "pack " << pack << " N_q " << n_q << " N_kv " << n_kv << " causal "
                                                << causal << " offset " << offset << " window (" << left << ", "
                                                << right << ") tile at row " << m_start);
              const QueryRange qr = packed_tile_queries(m_start, block_m, n_rows, pack);
              const KvTileSpan span = kv_tile_span(qr.first, qr.count, block_n, n_kv, causal, offset, left, right);
              for (int r = m_start; r < std::min(m_start + block_m, n_rows); ++r)
                for (int j = 0; j < n_kv + block_n; ++j) {
                  const bool vis = mask(r, j);
                  ASSERT_EQ(vis, j < n_kv && key_visible(packed_query(r, pack), j, offset, causal, left, right))
                      << "row " << r << " key " << j;
                  if (vis) {
                    ASSERT_GE(j / block_n, span.begin) << "a visible key before the span";
                    ASSERT_LT(j / block_n, span.end) << "a visible key past the span";
                  } else if (j / block_n >= span.first_full && j / block_n < span.end_full) {
                    FAIL() << "row " << r << " key " << j << ": hidden in a tile the span calls whole";
                  }
                }
            }
          }
}

}  // namespace
}  // namespace fa
