// The tile bookkeeping of the tensor-core steps (device/tiles.h) and the swizzle of
// device/ptx/swizzle.h, checked against brute force on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "device/mask.h"
#include "fa/params.h"
#include "library/launch_limits.h"
#include "device/ptx/swizzle.h"
#include "device/ptx/wgmma.h"
#include "device/smem_tile.h"
#include "device/tiles.h"

namespace fa {
namespace {

struct TileCase {
  int64_t n_q, n_kv;
  int block_m, block_n;
  bool causal;
  CausalAlign align;
};

// Every (Q tile, KV tile) pair of a problem, classified by brute force over all its elements.
void check_case(const TileCase& c) {
  const int64_t offset = c.align == CausalAlign::bottom_right ? c.n_kv - c.n_q : 0;
  for (int64_t m_start = 0; m_start < c.n_q; m_start += c.block_m) {
    const int end = kv_tile_end(m_start, c.block_m, c.block_n, c.n_kv, c.causal, offset);
    const int first = kv_tile_first_masked(m_start, c.block_m, c.block_n, c.n_kv, c.causal, offset);
    SCOPED_TRACE("n_q=" + std::to_string(c.n_q) + " n_kv=" + std::to_string(c.n_kv) +
                 " bm=" + std::to_string(c.block_m) + " bn=" + std::to_string(c.block_n) +
                 " causal=" + std::to_string(c.causal) + " offset=" + std::to_string(offset) +
                 " m_start=" + std::to_string(m_start));
    ASSERT_LE(first, end);
    const int tiles = int(cdiv(c.n_kv, c.block_n));
    ASSERT_LE(end, tiles);
    for (int n = 0; n < tiles; ++n) {
      bool any_visible = false, all_visible = true, any_real_visible = false;
      for (int64_t i = m_start; i < m_start + c.block_m; ++i)
        for (int64_t j = int64_t(n) * c.block_n; j < int64_t(n + 1) * c.block_n; ++j) {
          const bool vis = j < c.n_kv && (!c.causal || causal_visible(i, j, offset));
          any_visible |= vis;
          all_visible &= vis;
          any_real_visible |= vis && i < c.n_q;
        }
      if (n >= end) {
        EXPECT_FALSE(any_real_visible) << "tile " << n << " is skipped but a row sees one of its keys";
      }
      if (n == end - 1) {
        EXPECT_TRUE(any_visible) << "tile " << n << " is visited but no row sees any key: the loop runs too far";
      }
      if (n < first) {
        EXPECT_TRUE(all_visible) << "tile " << n << " runs unmasked but hides some key from some row";
      }
      if (n == first && first < end) {
        EXPECT_FALSE(all_visible) << "tile " << n << " is masked though every key is visible: wasted work";
      }
      if (c.causal && n < end && n >= first && (int64_t(n) + 1) * c.block_n <= c.n_kv) {
        // A masked tile that is not the ragged last one straddles the diagonal.
        EXPECT_TRUE(is_diagonal_tile(m_start, c.block_m, n, c.block_n, offset)) << "tile " << n;
      }
      if (c.causal) {
        bool vis = false, masked = false;  // over the keys of the tile, ignoring N_kv
        for (int64_t i = m_start; i < m_start + c.block_m; ++i)
          for (int64_t j = int64_t(n) * c.block_n; j < int64_t(n + 1) * c.block_n; ++j)
            (causal_visible(i, j, offset) ? vis : masked) = true;
        EXPECT_EQ(is_diagonal_tile(m_start, c.block_m, n, c.block_n, offset), vis && masked) << "tile " << n;
      }
    }
  }
}

TEST(Tiles, VisitAndMaskExactlyTheNeededTiles) {
  for (int64_t n_q : {1, 17, 64, 100, 128, 300, 1000})
    for (int64_t n_kv : {1, 5, 64, 77, 128, 300, 1013})
      for (int bm : {64, 128})
        for (int bn : {32, 64, 128})
          for (bool causal : {false, true})
            for (CausalAlign align : {CausalAlign::top_left, CausalAlign::bottom_right})
              check_case({n_q, n_kv, bm, bn, causal, align});
}

// kv_tile_span (step 38) against brute force: every tile a row sees is visited, the span's ends
// hold a visible key, every unmasked tile is wholly visible, and a masked tile next to the unmasked
// middle is not (or the mask would be wasted work). Windows narrower and wider than a tile, one side
// unbounded, with and without causal, both alignments, rows that see nothing.
void check_span(int64_t n_q, int64_t n_kv, int bm, int bn, bool causal, int64_t offset, int64_t left, int64_t right) {
  const int tiles = int(cdiv(n_kv, bn));
  for (int64_t m_start = 0; m_start < n_q; m_start += bm) {
    const KvTileSpan s = kv_tile_span(m_start, bm, bn, n_kv, causal, offset, left, right);
    SCOPED_TRACE("n_q=" + std::to_string(n_q) + " n_kv=" + std::to_string(n_kv) + " bm=" + std::to_string(bm) +
                 " bn=" + std::to_string(bn) + " causal=" + std::to_string(causal) +
                 " offset=" + std::to_string(offset) + " window=(" + std::to_string(left) + "," +
                 std::to_string(right) + ") m_start=" + std::to_string(m_start));
    ASSERT_TRUE(s.begin <= s.first_full && s.first_full <= s.end_full && s.end_full <= s.end && s.end <= tiles);
    const WindowMask mask(int(n_kv), causal, offset, left, right);
    for (int n = 0; n < tiles; ++n) {
      bool any = false, all = true;
      for (int64_t i = m_start; i < m_start + bm; ++i)
        for (int64_t j = int64_t(n) * bn; j < int64_t(n + 1) * bn; ++j) {
          const bool vis = j < n_kv && key_visible(i, j, offset, causal, left, right);
          ASSERT_EQ(mask(int(i), int(j)), vis) << "WindowMask disagrees with key_visible at (" << i << ", " << j << ")";
          any |= vis;
          all &= vis;
        }
      const bool visited = n >= s.begin && n < s.end, unmasked = n >= s.first_full && n < s.end_full;
      if (any) EXPECT_TRUE(visited) << "tile " << n << " holds a visible key and is skipped";
      if ((n == s.begin || n == s.end - 1) && visited) EXPECT_TRUE(any) << "tile " << n << ": the span runs too far";
      if (unmasked) EXPECT_TRUE(all) << "tile " << n << " runs unmasked but hides a key from some row";
      if (visited && !unmasked && s.first_full < s.end_full && (n == s.first_full - 1 || n == s.end_full))
        EXPECT_FALSE(all) << "tile " << n << " is masked though every row sees all of it";
    }
  }
}

TEST(Tiles, WindowSpanVisitsAndMasksExactlyTheNeededTiles) {
  for (int64_t n_q : {1, 100, 300})
    for (int64_t n_kv : {5, 128, 333})
      for (int bm : {64, 128})
        for (int bn : {32, 64})
          for (bool causal : {false, true})
            for (bool bottom_right : {false, true})
              for (int64_t left : {-1, 0, 7, 64, 100, 1000})
                for (int64_t right : {-1, 0, 5, 64, 200})
                  check_span(n_q, n_kv, bm, bn, causal, bottom_right ? n_kv - n_q : 0, left, right);
}

// Without a window the span is the causal steps' own: kv_tile_end and kv_tile_first_masked.
TEST(Tiles, WindowSpanWithoutAWindowIsTheCausalRange) {
  for (int64_t n_kv : {5, 300, 1013})
    for (bool causal : {false, true})
      for (int64_t m_start : {0, 128, 256, 640}) {
        const int64_t offset = causal ? n_kv - 700 : 0;
        const KvTileSpan s = kv_tile_span(m_start, 128, 64, n_kv, causal, offset, -1, -1);
        const int end = kv_tile_end(m_start, 128, 64, n_kv, causal, offset);
        EXPECT_EQ(s.end, end);
        if (end > 0) {
          EXPECT_EQ(s.begin, 0);
          const int first_masked = kv_tile_first_masked(m_start, 128, 64, n_kv, causal, offset);
          EXPECT_EQ(s.end_full, first_masked == 0 ? 0 : first_masked);
        }
      }
}

TEST(Tiles, NonCausalVisitsAllAndMasksOnlyTheRaggedTile) {
  EXPECT_EQ(kv_tile_end(0, 128, 64, 1000, false, 0), 16);
  EXPECT_EQ(kv_tile_first_masked(0, 128, 64, 1000, false, 0), 15);  // 1000 = 15·64 + 40
  EXPECT_EQ(kv_tile_first_masked(0, 128, 64, 1024, false, 0), 16);  // no mask at all
}

TEST(Tiles, QTileThatSeesNoKeyVisitsNothing) {
  // Bottom-right alignment, N_q = 1000 > N_kv = 300: offset -700, rows 0..699 see nothing.
  EXPECT_EQ(kv_tile_end(0, 128, 64, 300, true, -700), 0);
  EXPECT_EQ(kv_tile_first_masked(0, 128, 64, 300, true, -700), 0);
  EXPECT_GT(kv_tile_end(640, 128, 64, 300, true, -700), 0);
}

// A persistent grid visits every work tile exactly once, and (causal) every block's work, in K/V
// tiles, ends within a few percent of the mean: the folded pairs of device/tiles.h balance tiles of
// unequal length. The plain deal (block b takes b, b + G, ...) of a longest-first order, which they
// replaced, is checked to be unbalanced here, so that the test can tell the two apart.
struct DealCase {
  int m_tiles, batch_heads, grid;
};

std::vector<int64_t> block_work(const DealCase& c, bool causal, bool fold, std::vector<int>* visits) {
  const int tiles = c.m_tiles * c.batch_heads;
  visits->assign(size_t(tiles), 0);
  std::vector<int64_t> work(size_t(c.grid), 0);
  for (int b = 0; b < c.grid; ++b) {
    for (int k = 0;; ++k) {
      const int t = persistent_tile(k, b, c.grid, causal && fold);
      if (t >= tiles) break;
      const WorkTile w = fold ? work_tile(t, c.m_tiles, causal)
                              : WorkTile{t / c.m_tiles, c.m_tiles - 1 - t % c.m_tiles};  // longest first
      EXPECT_GE(w.bh, 0);
      EXPECT_LT(w.bh, c.batch_heads);
      EXPECT_GE(w.m_tile, 0);
      EXPECT_LT(w.m_tile, c.m_tiles);
      ++(*visits)[size_t(w.bh * c.m_tiles + w.m_tile)];
      work[size_t(b)] += causal ? w.m_tile + 1 : 1;  // BLOCK_M = BLOCK_N: Q tile m visits m + 1 tiles
    }
  }
  return work;
}

double imbalance(const std::vector<int64_t>& work) {
  int64_t sum = 0, most = 0;
  for (int64_t w : work) sum += w, most = std::max(most, w);
  return double(most) * double(work.size()) / double(sum);
}

TEST(PersistentTiles, EveryTileOnceAndCausalWorkBalanced) {
  for (const DealCase c : {DealCase{8, 256, 132}, DealCase{32, 64, 132}, DealCase{128, 16, 132}, DealCase{5, 3, 132},
                           DealCase{7, 33, 132}, DealCase{7, 9, 4}, DealCase{1, 1, 1}}) {
    SCOPED_TRACE("m_tiles=" + std::to_string(c.m_tiles) + " batch_heads=" + std::to_string(c.batch_heads) +
                 " grid=" + std::to_string(c.grid));
    for (bool causal : {false, true}) {
      std::vector<int> visits;
      const std::vector<int64_t> work = block_work(c, causal, /*fold=*/true, &visits);
      for (int v : visits) ASSERT_EQ(v, 1);
      if (c.m_tiles * c.batch_heads >= 8 * c.grid) {  // enough tiles that one more per block is small
        EXPECT_LT(imbalance(work), 1.04);
      }
    }
  }
}

TEST(PersistentTiles, PlainDealOfLongestFirstIsUnbalanced) {
  std::vector<int> visits;
  EXPECT_GT(imbalance(block_work({128, 16, 132}, true, /*fold=*/false, &visits)), 1.4);
  EXPECT_LT(imbalance(block_work({128, 16, 132}, true, /*fold=*/true, &visits)), 1.04);
}

// Packed sequences: each head's slots refolded by its own tile count visit each of its tiles once
// (and nothing past them), and the causal work of a mixed batch is balanced again: folded by the
// longest sequence's count, a head of half as many tiles keeps only the short half of each pair.
TEST(PersistentTiles, PackedSequencesRefoldedByTheirOwnTileCount) {
  for (int m_tiles : {1, 2, 7, 32})
    for (int own = 0; own <= m_tiles; ++own) {
      std::vector<int> visits(size_t(own), 0);
      for (int slot = 0; slot < m_tiles; ++slot) {
        const int m = refold_tile(work_tile(slot, m_tiles, true).m_tile, m_tiles, own);
        ASSERT_GE(m, 0);
        ASSERT_LE(m, own);
        if (m < own) ++visits[size_t(m)];
        if (own == m_tiles) {
          EXPECT_EQ(m, work_tile(slot, m_tiles, true).m_tile);
        }
      }
      for (int v : visits) ASSERT_EQ(v, 1) << "m_tiles " << m_tiles << " own " << own;
    }
  // 8 sequences of 16 Q tiles each, numbered to 32 (max_seqlen twice the real ones), 32 heads.
  auto work_of = [](const std::vector<int>& own, int heads, bool refold) {
    const int m_tiles = 32, grid = 132, tiles = m_tiles * int(own.size()) * heads;
    std::vector<int64_t> work(size_t(grid), 0);
    for (int b = 0; b < grid; ++b)
      for (int k = 0;; ++k) {
        const int t = persistent_tile(k, b, grid, true);
        if (t >= tiles) break;
        const WorkTile w = work_tile(t, m_tiles, true);
        const int n = own[size_t(w.bh / heads)];
        const int m = refold ? refold_tile(w.m_tile, m_tiles, n) : w.m_tile;
        if (m < n) work[size_t(b)] += m + 1;
      }
    return work;
  };
  const std::vector<int> equal(8, 16), mixed = {32, 24, 16, 15, 8, 4, 2, 1};
  EXPECT_GT(imbalance(work_of(equal, 32, false)), 1.15);
  EXPECT_LT(imbalance(work_of(equal, 32, true)), 1.05);
  EXPECT_GT(imbalance(work_of(mixed, 8, false)), 1.3);
  EXPECT_LT(imbalance(work_of(mixed, 8, true)), 1.2);
}

TEST(Swizzle, IsAPermutationOfEachRow) {
  for (int row_elems : {64, 128, 256})
    for (int row = 0; row < 16; ++row) {
      std::set<int> seen;
      for (int col = 0; col < row_elems; ++col) {
        const int off = ptx::swizzled_offset(row, col, row_elems);
        EXPECT_GE(off, row * row_elems);
        EXPECT_LT(off, (row + 1) * row_elems);
        seen.insert(off);
      }
      EXPECT_EQ(int(seen.size()), row_elems);
    }
}

TEST(Swizzle, EightRowsAtOneChunkHitEveryBankOnce) {
  // One ldmatrix phase: 8 lanes read 16 bytes each from 8 consecutive rows at the same logical
  // column. Conflict-free means the 8 chunks cover the 32 four-byte banks exactly once.
  for (int row_elems : {64, 128, 256})
    for (int row0 = 0; row0 < 64; row0 += 8)
      for (int col = 0; col < row_elems; col += 8) {
        std::set<int> banks;
        for (int r = row0; r < row0 + 8; ++r) {
          const int byte = 2 * ptx::swizzled_offset(r, col, row_elems);
          for (int w = 0; w < 4; ++w) banks.insert((byte / 4 + w) % 32);
        }
        EXPECT_EQ(banks.size(), 32u) << "row_elems " << row_elems << " rows " << row0 << ".. col " << col;
      }
}

// Kernel 100's padded tiles (Part VI's head dims 32, 96 and 192, whose rows are not a power of two
// of 128 bytes or more): the 8 rows one ldmatrix phase reads at one logical chunk cover the 32
// banks exactly once, as the swizzle's do.
TEST(PaddedLayout, EightRowsAtOneChunkHitEveryBankOnce) {
  auto check = [](auto layout) {
    using L = decltype(layout);
    for (int row0 = 0; row0 < 64; row0 += 8)
      for (int col = 0; col < L::kCols; col += 8) {
        std::set<int> banks;
        for (int r = row0; r < row0 + 8; ++r) {
          const int byte = 2 * L::offset(r, col);
          EXPECT_EQ(byte % 16, 0) << "ldmatrix reads 16-byte aligned rows";
          for (int w = 0; w < 4; ++w) banks.insert((byte / 4 + w) % 32);
        }
        EXPECT_EQ(banks.size(), 32u) << "D = " << L::kCols << " rows " << row0 << ".. col " << col;
      }
  };
  check(tile::PaddedLayout<32>{});
  check(tile::PaddedLayout<96>{});
  check(tile::PaddedLayout<192>{});
}

// A copy plan (device/smem_tile.h's CopyPlan) copies every 16-byte chunk of its tile exactly once
// and nothing past it: thread t's chunk in pass p is row t / kChunks + p·kRowsPerPass, column
// (t % kChunks)·8, copied where copies(t, row) says. The tiles the kernels copy, regular (the
// lessons') and not (threads that do not split into whole rows: D = 96 and 192; passes that overrun
// the tile); a swizzled tile's plan keeps whole groups of 8 rows a pass (kPlanFits).
template <int ROWS, int COLS, int NT, typename Layout>
void expect_plan_covers_tile() {
  using Plan = tile::CopyPlan<ROWS, COLS, NT>;
  SCOPED_TRACE("tile " + std::to_string(ROWS) + "x" + std::to_string(COLS) + ", " + std::to_string(NT) + " threads");
  const size_t chunks = static_cast<size_t>(ROWS) * Plan::kChunks;
  std::vector<int> copied(chunks, 0);
  for (int t = 0; t < NT; ++t)
    for (int pass = 0; pass < Plan::kPasses; ++pass) {
      const int row = t / Plan::kChunks + pass * Plan::kRowsPerPass, chunk = t % Plan::kChunks;
      if (!Plan::copies(t, row)) continue;
      ASSERT_LT(row, ROWS) << "thread " << t << " pass " << pass << " copies past the tile";
      ++copied[size_t(row) * Plan::kChunks + size_t(chunk)];
    }
  for (size_t i = 0; i < chunks; ++i)
    EXPECT_EQ(copied[i], 1) << "row " << i / Plan::kChunks << " chunk " << i % Plan::kChunks;
  EXPECT_TRUE((tile::kPlanFits<Layout, Plan>));
}

TEST(CopyPlan, EveryChunkOnceAndNothingPastTheTile) {
  using tile::PaddedLayout, tile::SwizzledLayout;
  // The lessons' (regular); then kernel 100's tiles at Part VI's head dims, (rows, D, threads):
  // Q tiles of BLOCK_M rows and K/V tiles of BLOCK_N (kernels/fwd_mma.cu's configurations).
  expect_plan_covers_tile<128, 64, 128, SwizzledLayout<64>>();
  expect_plan_covers_tile<64, 128, 128, SwizzledLayout<128>>();
  expect_plan_covers_tile<128, 32, 128, PaddedLayout<32>>();  // D = 32: 32 rows a pass
  expect_plan_covers_tile<64, 32, 128, PaddedLayout<32>>();
  expect_plan_covers_tile<64, 32, 64, PaddedLayout<32>>();
  expect_plan_covers_tile<128, 96, 128, PaddedLayout<96>>();  // D = 96: 10 rows a pass, 120 threads
  expect_plan_covers_tile<32, 96, 128, PaddedLayout<96>>();
  expect_plan_covers_tile<64, 96, 128, PaddedLayout<96>>();
  expect_plan_covers_tile<128, 96, 256, PaddedLayout<96>>();  // 21 rows a pass, 252 threads
  expect_plan_covers_tile<64, 96, 256, PaddedLayout<96>>();
  expect_plan_covers_tile<64, 192, 128, PaddedLayout<192>>();  // D = 192: 5 rows a pass
  expect_plan_covers_tile<32, 192, 128, PaddedLayout<192>>();
  expect_plan_covers_tile<128, 192, 256, PaddedLayout<192>>();  // 10 rows a pass, 240 threads
  expect_plan_covers_tile<64, 192, 256, PaddedLayout<192>>();
  expect_plan_covers_tile<128, 256, 256, SwizzledLayout<256>>();  // D = 256: 8 warps, 8 rows a pass
  expect_plan_covers_tile<32, 256, 256, SwizzledLayout<256>>();
}

TEST(Swizzle, MovingRightBySixteenColumnsIsAnXor) {
  for (int row_elems : {64, 128, 256})
    for (int row = 0; row < 32; ++row)
      for (int colblock = 0; colblock < 2; ++colblock)
        for (int cols = 0; cols < row_elems; cols += 16) {
          const unsigned base = 2 * unsigned(ptx::swizzled_offset(row, colblock * 8, row_elems));
          EXPECT_EQ(ptx::swizzle_move_right(base, cols),
                    2 * unsigned(ptx::swizzled_offset(row, colblock * 8 + cols, row_elems)));
        }
}

// Step 33's descriptors advanced by addition: for every 1024-byte-aligned tile start a shared
// address can have, and every offset a product's k-steps, panels and stages add (multiples of 16
// that keep the address below 2^18), the added descriptor is bit for bit the one built from the
// address, in both kinds (K-major, and MN-major with each panel size the products use).
TEST(WgmmaDescriptor, AddingTheOffsetEqualsBuildingFromTheAddress) {
  for (uint32_t base = 0; base < (1u << 18); base += 1024)
    for (uint32_t off = 0; base + off < (1u << 18) && off < 64 * 1024; off += 16) {
      ASSERT_EQ((ptx::split_desc(ptx::smem_desc_k_major(base)) + off).bits(), ptx::smem_desc_k_major(base + off))
          << "K-major, base " << base << " + " << off;
      for (uint32_t panel : {64u * 128, 128u * 128})
        ASSERT_EQ((ptx::split_desc(ptx::smem_desc_mn_major(base, panel)) + off).bits(),
                  ptx::smem_desc_mn_major(base + off, panel))
            << "MN-major, panel " << panel << ", base " << base << " + " << off;
    }
}

}  // namespace
}  // namespace fa
