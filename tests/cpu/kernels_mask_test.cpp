// The production layer's Mask policies (kernels/mask.h) against their own element test, tile by
// tile: for every Q tile, the KV tiles it visits are exactly those holding a visible element, and
// the fully visible ones exactly those whose every element is visible; the same for the Q tiles of
// every KV tile. Masks: the ragged bound alone, causal in both alignments, sliding windows (masked
// tiles at both ends), and a window intersected with causal. And the lessons' causal tile range
// (device/tiles.h) is the policy's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "device/tiles.h"
#include "kernels/mask.h"

namespace fa::kernels {
namespace {

struct Shape {
  int64_t n_q, n_kv;
  int block_m, block_n;
};

std::string describe(const Shape& s, const std::string& mask) {
  std::ostringstream o;
  o << mask << " N_q=" << s.n_q << " N_kv=" << s.n_kv << " BLOCK_M=" << s.block_m << " BLOCK_N=" << s.block_n;
  return o.str();
}

// Brute force over one (row range, key range) block: does some element show, do all?
template <class Mask>
void scan(const Mask& m, int64_t r0, int64_t r1, int64_t k0, int64_t k1, bool* any, bool* all) {
  *any = false;
  *all = true;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t k = k0; k < k1; ++k) {
      const bool v = visible(m, r, k);
      *any |= v;
      *all &= v;
    }
}

// The expected range from per-tile verdicts: [first, end) spans the tiles with a visible element;
// [first_full, end_full) the fully visible ones, which must be contiguous.
void expect_range(const TileRange& got, const std::vector<bool>& any, const std::vector<bool>& all,
                  const std::string& where) {
  int64_t first = -1, last = -1, full_first = -1, full_last = -1;
  for (int64_t t = 0; t < int64_t(any.size()); ++t) {
    if (any[t] && first < 0) first = t;
    if (any[t]) last = t;
    if (all[t] && full_first < 0) full_first = t;
    if (all[t]) full_last = t;
  }
  if (first < 0) {
    EXPECT_TRUE(got.empty()) << where << ": nothing is visible, yet tiles [" << got.first << ", " << got.end
                             << ") are visited";
    return;
  }
  EXPECT_EQ(got.first, first) << where;
  EXPECT_EQ(got.end, last + 1) << where;
  for (int64_t t = first; t <= last; ++t) EXPECT_TRUE(any[t]) << where << ": tile " << t << " visited for nothing";
  if (full_first < 0) {
    EXPECT_EQ(got.first_full, got.end_full) << where << ": no tile is fully visible";
    EXPECT_EQ(got.first_full, got.first) << where << ": the masked tiles must all lie in [end_full, end)";
    return;
  }
  for (int64_t t = full_first; t <= full_last; ++t) ASSERT_TRUE(all[t]) << where << ": full tiles not contiguous";
  EXPECT_EQ(got.first_full, full_first) << where;
  EXPECT_EQ(got.end_full, full_last + 1) << where;
}

template <class Mask>
void check_policy(const Mask& m, const Shape& s, const std::string& name) {
  // The kernels' 32-bit element test is the 64-bit one, on every (row, key) of the shape.
  const auto element = m.element();
  for (int64_t r = 0; r < s.n_q; ++r)
    for (int64_t k = 0; k < cdiv(s.n_kv, s.block_n) * s.block_n; ++k)
      ASSERT_EQ(element(int(r), int(k)), visible(m, r, k)) << describe(s, name) << " row " << r << " key " << k;
  const int64_t kv_tiles_n = cdiv(s.n_kv, s.block_n), q_tiles_n = cdiv(s.n_q, s.block_m);
  // Forward: each Q tile's KV tiles. Its rows are the existing ones; a ragged last KV tile holds
  // keys past N_kv, which the policy's bound hides, so it is never fully visible.
  for (int64_t i = 0; i < q_tiles_n; ++i) {
    const int64_t r0 = i * s.block_m, r1 = std::min<int64_t>(r0 + s.block_m, s.n_q);
    std::vector<bool> any(kv_tiles_n), all(kv_tiles_n);
    for (int64_t n = 0; n < kv_tiles_n; ++n) {
      bool a, f;
      scan(m, r0, r1, n * s.block_n, (n + 1) * s.block_n, &a, &f);
      any[n] = a;
      all[n] = f;
    }
    expect_range(kv_tiles(m, r0, r1 - r0, s.block_n), any, all, describe(s, name) + " Q tile " + std::to_string(i));
  }
  // Backward: each KV tile's Q tiles, all BLOCK_N keys of it; a ragged last Q tile never counts as
  // fully visible (its missing rows are masked like the rest).
  for (int64_t n = 0; n < kv_tiles_n; ++n) {
    std::vector<bool> any(q_tiles_n), all(q_tiles_n);
    for (int64_t i = 0; i < q_tiles_n; ++i) {
      const int64_t r0 = i * s.block_m, r1 = std::min<int64_t>(r0 + s.block_m, s.n_q);
      bool a, f;
      scan(m, r0, r1, n * s.block_n, (n + 1) * s.block_n, &a, &f);
      any[i] = a;
      all[i] = f && r1 - r0 == s.block_m;
    }
    expect_range(q_tiles(m, n * s.block_n, s.block_n, s.block_m, s.n_q), any, all,
                 describe(s, name) + " KV tile " + std::to_string(n));
  }
}

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int64_t n_q : {1, 17, 100, 257})
    for (int64_t n_kv : {1, 17, 100, 257})
      for (int bm : {16, 32, 64, 128})
        for (int bn : {32, 64, 128}) out.push_back({n_q, n_kv, bm, bn});
  return out;
}

TEST(KernelsMask, KeyBoundAlone) {
  for (const Shape& s : shapes()) check_policy(KeyBound{s.n_kv}, s, "none");
}

// A loop over the masks whose keys start at key 0 (no window) tests one bound, the one step 10
// tests: every masked tile at or after end_full. That needs first_full == first == 0, with or
// without fully visible tiles (kernels/fwd_mma.cu's kFromFirstKey).
TEST(KernelsMask, MasksFromTheFirstKeyHaveTheirMaskedTilesAtTheEnd) {
  for (const Shape& s : shapes())
    for (int64_t offset : {int64_t(0), s.n_kv - s.n_q, int64_t(-40), int64_t(40)})
      for (int64_t m_start = 0; m_start < s.n_q; m_start += s.block_m) {
        const std::string where =
            describe(s, "offset " + std::to_string(offset)) + " m_start " + std::to_string(m_start);
        for (const TileRange& t : {kv_tiles(KeyBound{s.n_kv}, m_start, s.block_m, s.block_n),
                                   kv_tiles(both(KeyBound{s.n_kv}, Causal{offset}), m_start, s.block_m, s.block_n)}) {
          EXPECT_EQ(t.first, 0) << where;
          EXPECT_EQ(t.first_full, 0) << where;
        }
      }
}

TEST(KernelsMask, CausalBothAlignments) {
  for (const Shape& s : shapes()) {
    check_policy(both(KeyBound{s.n_kv}, Causal{0}), s, "causal top-left");
    check_policy(both(KeyBound{s.n_kv}, Causal{s.n_kv - s.n_q}), s, "causal bottom-right");
  }
}

TEST(KernelsMask, SlidingWindowsHaveMaskedTilesAtBothEnds) {
  for (const Shape& s : shapes())
    for (int64_t left : {0, 5, 40, 1000})
      for (int64_t right : {0, 7, 70})
        for (int64_t offset : {int64_t(0), s.n_kv - s.n_q}) {
          const std::string name =
              "window(" + std::to_string(left) + "," + std::to_string(right) + ") offset " + std::to_string(offset);
          check_policy(both(KeyBound{s.n_kv}, SlidingWindow{left, right, offset}), s, name);
          check_policy(both(both(KeyBound{s.n_kv}, Causal{offset}), SlidingWindow{left, right, offset}), s,
                       name + " & causal");
        }
  // The picture in kernels/mask.h: one Q tile with masked tiles before and after its full ones.
  const TileRange t = kv_tiles(both(KeyBound{1024}, SlidingWindow{200, 200, 0}), 256, 128, 64);
  EXPECT_LT(t.first, t.first_full);
  EXPECT_LT(t.end_full, t.end);
}

// ---- a worked example: a new mask is one small struct ------------------------------------------
// Prefix-LM attention: the first `prefix` keys (a prompt) are visible to every row, the rest
// causally. Row r sees keys [0, max(prefix, r + offset + 1)): an interval from key 0 whose end
// never moves left, so it is a policy. It gives the four functions and its 32-bit element test;
// Both<> intersects it with the ragged bound; the tile ranges and the backward's Q ranges follow,
// and check_policy proves them against its element test on every tile.
struct PrefixLM {
  int64_t prefix, offset;
  FA_HD int64_t lo(int64_t) const { return 0; }
  FA_HD int64_t hi(int64_t row) const { return max64(prefix, row + offset + 1); }
  // hi(row) > key: every row when the key is in the prefix, else the causal rows from key − offset.
  FA_HD int64_t first_row(int64_t key) const { return key < prefix ? -kUnbounded : key - offset; }
  FA_HD int64_t end_row(int64_t key) const { return key >= 0 ? kUnbounded : -kUnbounded; }
  FA_HD int64_t key_end() const { return kUnbounded; }
  struct Element {
    int prefix, offset;
    FA_HD bool operator()(int row, int col) const { return (col < prefix) | (col <= row + offset); }
  };
  FA_HD Element element() const { return {int(prefix), int(offset)}; }
};

TEST(KernelsMask, AToyPolicyPrefixLM) {
  for (const Shape& s : shapes())
    for (int64_t prefix : {0, 1, 40, 200})
      check_policy(both(KeyBound{s.n_kv}, PrefixLM{prefix, s.n_kv - s.n_q}), s, "prefix-LM " + std::to_string(prefix));
  // With a prefix, the first Q tile's range reaches past its diagonal: tiles it would skip causally.
  const TileRange causal = kv_tiles(both(KeyBound{1024}, Causal{0}), 0, 64, 64);
  const TileRange prefix_lm = kv_tiles(both(KeyBound{1024}, PrefixLM{300, 0}), 0, 64, 64);
  EXPECT_EQ(causal.end, 1);
  EXPECT_EQ(prefix_lm.end, 5);
  EXPECT_EQ(prefix_lm.end_full, 4);  // keys 0-255 seen by every row; tile 4 (256-319) partly
}

// The lessons' causal loop bounds (device/tiles.h) are the policy's, on every whole Q tile.
TEST(KernelsMask, LessonsCausalRangeIsThePolicys) {
  for (const Shape& s : shapes())
    for (int64_t offset : {int64_t(0), s.n_kv - s.n_q}) {
      const auto m = both(KeyBound{s.n_kv}, Causal{offset});
      for (int64_t m_start = 0; m_start + s.block_m <= s.n_q; m_start += s.block_m) {
        const TileRange t = kv_tiles(m, m_start, s.block_m, s.block_n);
        const std::string where = describe(s, "causal") + " m_start " + std::to_string(m_start);
        EXPECT_EQ(t.end, kv_tile_end(m_start, s.block_m, s.block_n, s.n_kv, true, offset)) << where;
        EXPECT_EQ(t.first, 0) << where;
        // The lesson's first masked tile is where the policy's full tiles end (or its range does).
        const int64_t lesson_first_masked = kv_tile_first_masked(m_start, s.block_m, s.block_n, s.n_kv, true, offset);
        EXPECT_EQ(t.end_full, lesson_first_masked) << where;
      }
    }
}

// The kernels' default policy takes the lessons' functions for its range: it must be the general
// range of the same mask, on every Q tile (the last, ragged one counted as a whole tile, as the
// kernels count it), causal in both alignments or not.
TEST(KernelsMask, CausalFlagIsTheGeneralRange) {
  for (const Shape& s : shapes())
    for (bool causal : {false, true})
      for (int64_t offset : {int64_t(0), s.n_kv - s.n_q, int64_t(-40), int64_t(40)}) {
        AttentionParams p;
        p.seqlen_q = s.n_q;
        p.seqlen_kv = s.n_kv;
        p.causal = causal;
        for (int64_t m_start = 0; m_start < s.n_q; m_start += s.block_m) {
          const TileRange want = causal
                                     ? kv_tiles(both(KeyBound{s.n_kv}, Causal{offset}), m_start, s.block_m, s.block_n)
                                     : kv_tiles(KeyBound{s.n_kv}, m_start, s.block_m, s.block_n);
          const TileRange got = CausalFlag::range(p, offset, m_start, s.block_m, s.block_n);
          const std::string where = describe(s, causal ? "causal" : "none") + " offset " + std::to_string(offset) +
                                    " m_start " + std::to_string(m_start);
          EXPECT_EQ(got.first, want.first) << where;
          EXPECT_EQ(got.first_full, want.first_full) << where;
          EXPECT_EQ(got.end_full, want.end_full) << where;
          EXPECT_EQ(got.end, want.end) << where;
        }
      }
}

// The window kernels' policy (WindowFlag) against the references' rule (key_visible, device/mask.h)
// on every (row, key), causal or not, both alignments, windows bounded on either side, both or
// neither; and its tile ranges against the element test, tile by tile (check_policy). A window
// edge off by one, the causal flag not folded in, or an unbounded side taken as 0, fails here.
// A call of shape s with the causal flag and the window (left, right), and its name in messages.
AttentionParams window_call(const Shape& s, bool causal, int64_t left, int64_t right) {
  AttentionParams p;
  p.seqlen_q = s.n_q;
  p.seqlen_kv = s.n_kv;
  p.causal = causal;
  p.window_left = left;
  p.window_right = right;
  return p;
}

std::string window_name(bool causal, int64_t left, int64_t right, int64_t offset) {
  return std::string(causal ? "causal " : "") + "window (" + std::to_string(left) + ", " + std::to_string(right) +
         ") offset " + std::to_string(offset);
}

TEST(KernelsMask, WindowFlagIsTheReferencesWindow) {
  const std::pair<int64_t, int64_t> windows[] = {{-1, -1}, {0, 0},  {3, -1}, {-1, 5},
                                                 {7, 2},   {40, 0}, {0, -1}, {16, 16}};
  for (const Shape& s : shapes())
    for (bool causal : {false, true})
      for (int64_t offset : {int64_t(0), s.n_kv - s.n_q})
        for (auto [left, right] : windows) {
          const AttentionParams p = window_call(s, causal, left, right);
          const std::string name = window_name(causal, left, right, offset);
          const auto element = WindowFlag::element(p, offset);
          for (int64_t r = 0; r < s.n_q; ++r) {
            // The interval the GPU reference and the FLOP count walk holds exactly the visible keys.
            const KeyRange range = visible_key_range(r, s.n_kv, offset, causal, left, right);
            for (int64_t k = 0; k < cdiv(s.n_kv, s.block_n) * s.block_n; ++k) {
              const bool visible = k < s.n_kv && key_visible(r, k, offset, causal, left, right);
              ASSERT_EQ(element(int(r), int(k)), visible) << describe(s, name) << " row " << r << " key " << k;
              ASSERT_EQ(range.begin <= k && k < range.end, visible)
                  << describe(s, name) << " row " << r << " key " << k << ": visible_key_range [" << range.begin << ", "
                  << range.end << ")";
            }
          }
          check_policy(WindowFlag::policy(p, s.n_kv, offset), s, name);
        }
}

// The backward's questions of CausalFlag against the general policies and the element test: the
// first Q tile that sees a KV tile (the rest up to the last see it too), and which blocks of a Q
// tile's rows and a KV tile's keys hold an element that is not visible. Offsets of −1 and 15 put a
// block's last key exactly on its first row's diagonal (rows start at multiples of 16), −2 and 14
// one key past it: an off-by-one either way changes the answer there.
TEST(KernelsMask, CausalFlagIsTheGeneralQRange) {
  for (const Shape& s : shapes())
    for (bool causal : {false, true})
      for (int64_t offset : {int64_t(0), s.n_kv - s.n_q, int64_t(-40), int64_t(40), int64_t(-1), int64_t(15),
                             int64_t(-2), int64_t(14)}) {
        const AttentionParams p = window_call(s, causal, -1, -1);
        const int64_t q_tile_count = (s.n_q + s.block_m - 1) / s.block_m;
        for (int64_t n_start = 0; n_start < s.n_kv; n_start += s.block_n) {
          const TileRange want =
              causal ? q_tiles(both(KeyBound{s.n_kv}, Causal{offset}), n_start, s.block_n, s.block_m, s.n_q)
                     : q_tiles(KeyBound{s.n_kv}, n_start, s.block_n, s.block_m, s.n_q);
          const int64_t got = CausalFlag::q_tile_first(p, offset, n_start, s.block_m);
          const std::string where = describe(s, causal ? "causal" : "none") + " offset " + std::to_string(offset) +
                                    " n_start " + std::to_string(n_start);
          // Where no row sees the tile, the tiles from `got` on are visited for nothing but
          // correctly (every block is masked: checked below); elsewhere the range is exact.
          if (!want.empty()) {
            EXPECT_EQ(got, want.first) << where;
            EXPECT_EQ(want.end, q_tile_count) << where << ": the range runs to the last Q tile";
          }
          // Blocks of 16 or 32 rows against the whole KV tile (steps 20-22's sub-tiles) and against
          // each warp's 32 keys of it (step 23's warp blocks).
          for (int rows : {16, 32})
            for (int64_t k0 = n_start; k0 < n_start + s.block_n; k0 += 32)
              for (int keys : {int(s.block_n), 32}) {
                if (keys == s.block_n && k0 != n_start) continue;
                for (int64_t q0 = 0; q0 < s.n_q; q0 += rows) {
                  bool hidden = false;
                  for (int64_t r = q0; r < q0 + rows; ++r)
                    for (int64_t k = k0; k < k0 + keys; ++k)
                      hidden |= r >= s.n_q || k >= s.n_kv || (causal && !visible(Causal{offset}, r, k));
                  EXPECT_EQ(CausalFlag::block_masked(p, int(offset), int(q0), rows, int(k0), keys), hidden)
                      << where << " rows " << q0 << "..+" << rows << ", keys " << k0 << "..+" << keys;
                }
              }
        }
      }
}

TEST(KernelsMask, FloorAndCeilingDivisionForAnySign) {
  EXPECT_EQ(floor_div(-1, 64), -1);
  EXPECT_EQ(floor_div(-64, 64), -1);
  EXPECT_EQ(floor_div(-65, 64), -2);
  EXPECT_EQ(ceil_div(-1, 64), 0);
  EXPECT_EQ(ceil_div(65, 64), 2);
  EXPECT_EQ(ceil_div(64, 64), 1);
}

// The backward's questions of WindowFlag against the element test: the Q tiles that see a KV tile
// are exactly [q_range.first, q_range.end); every such Q tile's first KV tile (where its
// deterministic turn starts) is at or before the KV tile, and is itself seen by the Q tile; and
// block_masked is true exactly for the blocks that hold a hidden element. Windows bounded on either
// side, both or neither, causal or not, both alignments, and offsets that put a block's edge keys
// exactly on a row's window edge or one past it (rows start at multiples of 16; right edges of 0,
// 15 and 16 with offsets −1 and −2).
TEST(KernelsMask, WindowFlagAnswersTheBackwardsQuestions) {
  const std::pair<int64_t, int64_t> windows[] = {{-1, -1}, {0, 0},   {3, -1},  {-1, 5}, {7, 2},
                                                 {40, 0},  {16, 16}, {15, 15}, {-1, 15}};
  for (const Shape& s : shapes())
    for (bool causal : {false, true})
      for (int64_t offset : {int64_t(0), s.n_kv - s.n_q, int64_t(-1), int64_t(-2), int64_t(15), int64_t(14)})
        for (auto [left, right] : windows) {
          const AttentionParams p = window_call(s, causal, left, right);
          const std::string name = window_name(causal, left, right, offset);
          auto sees = [&](int64_t r, int64_t k) {
            return r < s.n_q && k < s.n_kv && key_visible(r, k, offset, causal, left, right);
          };
          for (int64_t n_start = 0; n_start < s.n_kv; n_start += s.block_n) {
            const TileRange q = WindowFlag::q_range(p, offset, n_start, int(s.block_n), int(s.block_m));
            for (int64_t m_start = 0; m_start < s.n_q; m_start += s.block_m) {
              bool any = false;
              for (int64_t r = m_start; r < m_start + s.block_m; ++r)
                for (int64_t k = n_start; k < n_start + s.block_n; ++k) any |= sees(r, k);
              const int64_t m = m_start / s.block_m;
              ASSERT_EQ(m >= q.first && m < q.end, any) << describe(s, name) << " KV tile at " << n_start << ", Q tile "
                                                        << m << ": q_range [" << q.first << ", " << q.end << ")";
              if (!any) continue;
              const int rows = int(std::min<int64_t>(s.block_m, s.n_q - m_start));
              const int64_t first = WindowFlag::kv_tile_first(p, offset, m_start, rows, int(s.block_n));
              // The kernels ask with BLOCK_M rows whatever the tile's real count: the same answer.
              ASSERT_EQ(WindowFlag::kv_tile_first(p, offset, m_start, int(s.block_m), int(s.block_n)), first)
                  << describe(s, name) << " Q tile " << m;
              ASSERT_LE(first * s.block_n, n_start) << describe(s, name) << " Q tile " << m;
              bool first_seen = false;
              for (int64_t r = m_start; r < m_start + rows; ++r)
                for (int64_t k = first * s.block_n; k < (first + 1) * s.block_n; ++k) first_seen |= sees(r, k);
              ASSERT_TRUE(first_seen) << describe(s, name) << " Q tile " << m << ": its first KV tile " << first;
            }
            for (int rows : {16, 32})
              for (int64_t q0 = 0; q0 < s.n_q; q0 += rows) {
                bool hidden = false;
                for (int64_t r = q0; r < q0 + rows; ++r)
                  for (int64_t k = n_start; k < n_start + s.block_n; ++k) hidden |= !sees(r, k);
                ASSERT_EQ(WindowFlag::block_masked(p, int(offset), int(q0), rows, int(n_start), int(s.block_n)), hidden)
                    << describe(s, name) << " rows " << q0 << "..+" << rows << ", keys " << n_start;
              }
          }
        }
}

}  // namespace
}  // namespace fa::kernels
