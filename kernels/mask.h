// The production kernels' Mask policies: one type answers "which tiles" and "which elements".
//
// Every mask the kernels serve lets query row r see one interval of keys, [lo(r), hi(r)), whose ends
// never move left as r grows: no mask (with the ragged bound N_kv), causal in either alignment, a
// sliding window, and any intersection of them. From those two functions and their inverses follow
//
//   - the element test, visible(r, c): lo(r) <= c < hi(r);
//   - the KV tiles a Q tile visits, and which of them need the element test: a window has masked
//     tiles at both ends of the range, causal only at its end, no mask only at a ragged last tile;
//   - the Q tiles that see a KV tile (the backward's loop runs over Q tiles for each KV tile).
//
//     keys →     tile 0   tile 1   tile 2   tile 3          a sliding window, one Q tile:
//     rows ↓    [x x · ·][· · · ·][· · · ·][· x x x]        first = 0, first_full = 1,
//               [x x x ·][· · · ·][· · · ·][· · x x]        end_full = 3, end = 4
//
// A policy is a small struct with
//   lo(r), hi(r)          the visible keys of row r (hi <= lo: none);
//   first_row(k)          the first row with hi(row) > k (the first row that sees key k or a later one);
//   end_row(k)            one past the last row with lo(row) <= k (the last that sees k or an earlier one);
//   key_end()             one past the last key that exists (N_kv; unbounded for all but KeyBound);
// and `Both<A, B>` intersects two of them. Everything is __host__ __device__ and 64-bit; the CPU
// tests check each range against the element test, tile by tile.
//
// In the kernel, the element test runs on every score of a masked tile, so it is 32-bit there:
// `element()` gives a functor (row, col) -> visible for apply_mask (device/warp_tile.h), the same
// rule in int (the kernels index rows and keys below 2^30, library/launch_limits.h).
#pragma once

#include <cstdint>

#include "device/mask.h"  // FA_HD, CausalMask
#include "device/tiles.h"
#include "fa/params.h"

namespace fa::kernels {

/// Stands for "no bound": far past any N (validation keeps sizes below 2^60 elements).
constexpr int64_t kUnbounded = int64_t(1) << 61;

FA_HD int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}
FA_HD int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
/// Floor and ceiling division by a positive divisor, for any sign of the dividend.
FA_HD int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
FA_HD int64_t ceil_div(int64_t a, int64_t b) {
  return -floor_div(-a, b);
}

// ---- the policies ------------------------------------------------------------------------------

/// Keys at and past N_kv do not exist (a ragged last KV tile). Every kernel's mask includes it.
struct KeyBound {
  int64_t n_kv;
  FA_HD int64_t lo(int64_t) const { return 0; }
  FA_HD int64_t hi(int64_t) const { return n_kv; }
  FA_HD int64_t first_row(int64_t key) const { return key < n_kv ? -kUnbounded : kUnbounded; }
  FA_HD int64_t end_row(int64_t key) const { return key >= 0 ? kUnbounded : -kUnbounded; }
  FA_HD int64_t key_end() const { return n_kv; }
  struct Element {
    int n_kv;
    FA_HD bool operator()(int, int col) const { return col < n_kv; }
  };
  FA_HD Element element() const { return {int(n_kv)}; }
};

/// Key j is visible to row i when j <= i + offset (offset: AttentionParams::causal_offset(), 0
/// top-left, N_kv − N_q bottom-right).
struct Causal {
  int64_t offset;
  FA_HD int64_t lo(int64_t) const { return 0; }
  FA_HD int64_t hi(int64_t row) const { return row + offset + 1; }
  FA_HD int64_t first_row(int64_t key) const { return key - offset; }
  FA_HD int64_t end_row(int64_t key) const { return key >= 0 ? kUnbounded : -kUnbounded; }
  FA_HD int64_t key_end() const { return kUnbounded; }
  struct Element {
    int offset;  // |offset| < 2^30
    FA_HD bool operator()(int row, int col) const { return col <= row + offset; }
  };
  FA_HD Element element() const { return {int(offset)}; }
};

/// flash-attn's window: key j is visible to row i when i + offset − left <= j <= i + offset + right
/// (offset as for Causal; right = 0 is a causal window of `left` keys before the diagonal).
struct SlidingWindow {
  int64_t left, right, offset;
  FA_HD int64_t lo(int64_t row) const { return row + offset - left; }
  FA_HD int64_t hi(int64_t row) const { return row + offset + right + 1; }
  FA_HD int64_t first_row(int64_t key) const { return key - offset - right; }
  FA_HD int64_t end_row(int64_t key) const { return key - offset + left + 1; }
  FA_HD int64_t key_end() const { return kUnbounded; }
  struct Element {
    int lo, hi;  // row + lo <= col <= row + hi; a window wider than 2^30 is clamped (no row is that long)
    FA_HD bool operator()(int row, int col) const { return (col >= row + lo) & (col <= row + hi); }
  };
  FA_HD Element element() const {
    const int64_t big = int64_t(1) << 30;
    return {int(max64(offset - left, -big)), int(min64(offset + right, big))};
  }
};

/// The keys both A and B let a row see. Intervals intersect, and the ends stay monotone.
template <class A, class B>
struct Both {
  A a;
  B b;
  FA_HD int64_t lo(int64_t row) const { return max64(a.lo(row), b.lo(row)); }
  FA_HD int64_t hi(int64_t row) const { return min64(a.hi(row), b.hi(row)); }
  // hi(row) > k needs both his above k: the later of the two first rows; lo(row) <= k both los.
  FA_HD int64_t first_row(int64_t key) const { return max64(a.first_row(key), b.first_row(key)); }
  FA_HD int64_t end_row(int64_t key) const { return min64(a.end_row(key), b.end_row(key)); }
  FA_HD int64_t key_end() const { return min64(a.key_end(), b.key_end()); }
  struct Element {
    typename A::Element a;
    typename B::Element b;
    // Bitwise, not short-circuit: both tests are a compare or two, kept in predicates.
    FA_HD bool operator()(int row, int col) const { return a(row, col) & b(row, col); }
  };
  FA_HD Element element() const { return {a.element(), b.element()}; }
};

template <class A, class B>
FA_HD Both<A, B> both(A a, B b) {
  return Both<A, B>{a, b};
}

/// The element test of any policy.
template <class Mask>
FA_HD bool visible(const Mask& m, int64_t row, int64_t key) {
  return m.lo(row) <= key && key < m.hi(row);
}

// ---- tile ranges -------------------------------------------------------------------------------

/// Tiles [first, end) are visited; those in [first_full, end_full) are fully visible (no element
/// test), those in [first, first_full) and [end_full, end) need it. first <= first_full <= end_full
/// <= end; no fully visible tile: first_full = end_full = first, so that [end_full, end) holds every
/// masked tile whenever first_full == first (a loop that starts at the first key tests one bound);
/// nothing visible: all four equal.
struct TileRange {
  int64_t first, first_full, end_full, end;
  FA_HD int64_t count() const { return end - first; }
  FA_HD bool empty() const { return end == first; }
};

FA_HD TileRange make_range(int64_t first, int64_t first_full, int64_t end_full, int64_t end) {
  if (end <= first) return {first, first, first, first};
  first_full = max64(first_full, first);
  end_full = min64(end_full, end);
  if (end_full <= first_full) first_full = end_full = first;
  return {first, first_full, end_full, end};
}

/// The KV tiles (of `block_n` keys) that the Q tile of rows [m_start, m_start + rows) visits.
/// Rows are the tile's existing rows (a ragged last Q tile passes fewer than BLOCK_M).
template <class Mask>
FA_HD TileRange kv_tiles(const Mask& m, int64_t m_start, int64_t rows, int block_n) {
  const int64_t r0 = m_start, r1 = m_start + rows - 1;
  const int64_t lo_min = max64(m.lo(r0), 0), hi_max = m.hi(r1);  // the ends are monotone in the row
  if (rows <= 0 || hi_max <= lo_min) return {0, 0, 0, 0};
  const int64_t lo_max = max64(m.lo(r1), 0), hi_min = m.hi(r0);
  return make_range(floor_div(lo_min, block_n), ceil_div(lo_max, block_n), floor_div(hi_min, block_n),
                    ceil_div(hi_max, block_n));
}

/// The Q tiles (of `block_m` rows, of N_q rows in all) that see some key of the KV tile
/// [n_start, n_start + block_n): the backward's loop for one KV tile. A tile is fully visible when
/// every element of its BLOCK_M × BLOCK_N block is: a ragged last tile either way never is (its
/// missing rows or keys are masked like the rest).
template <class Mask>
FA_HD TileRange q_tiles(const Mask& m, int64_t n_start, int block_n, int block_m, int64_t n_q) {
  // Only existing keys make a row see the tile: a row whose window starts past the last key sees
  // nothing, though its lo is below the tile's end.
  const int64_t k0 = n_start, k1 = min64(n_start + block_n, m.key_end()) - 1;
  const int64_t r0 = max64(m.first_row(k0), 0), r1 = min64(m.end_row(k1), n_q);  // rows [r0, r1) see it
  if (k1 < k0 || r1 <= r0) return {0, 0, 0, 0};
  const int64_t k_last = n_start + block_n - 1;  // every key of the block, existing or not
  const int64_t full0 = max64(m.first_row(k_last), 0), full1 = min64(m.end_row(k0), n_q);
  return make_range(floor_div(r0, block_m), ceil_div(full0, block_m), floor_div(full1, block_m), ceil_div(r1, block_m));
}

// ---- the kernels' mask policies ----------------------------------------------------------------
// What a kernel asks of its Mask policy: range() (the KV tiles of a Q tile, from the policies
// above), element() (the 32-bit element test of the masked tiles), longest_first() (whether the
// scheduler should hand out the Q tiles with the most KV tiles first) and kFromFirstKey: every
// row's keys start at key 0 (no window's lower edge), so the range starts at KV tile 0 and no tile
// before the full ones is masked; the kernels' loops are then the steps' exactly (a tile index from
// 0, one bound), which at the register cap decides between spilling and not.

/// The Q tiles [first, end) that see a KV tile, as the backward kernels walk them.
struct QTileSpan {
  int64_t first, end;
};

/// The default: the call's causal flag, either alignment, decided at run time in one kernel as the
/// steps do; its element test is the lessons' (device/mask.h). A compile-time mask (a sliding
/// window) is a policy with its own kernels.
struct CausalFlag {
  static constexpr bool kFromFirstKey = true;
  /// kv_tiles of Both<KeyBound, Causal> (or KeyBound alone), worked out by the lessons' own
  /// functions (device/tiles.h), which know the range starts at tile 0: the kernels then compile to
  /// the steps' instructions (the general form cost the Hopper kernel's producer ~50 instructions a
  /// work tile). CausalFlagIsTheGeneralRange (tests/cpu/kernels_mask_test.cpp) proves them equal.
  FA_HD static TileRange range(const AttentionParams& p, int64_t offset, int64_t m_start, int rows, int block_n) {
    return range(p, p.seqlen_kv, offset, m_start, rows, block_n);
  }
  FA_HD static fa::CausalMask element(const AttentionParams& p, int64_t offset) {
    return element(p, p.seqlen_kv, offset);
  }
  /// The same for one sequence of N_kv keys and its own diagonal offset (a varlen call's sequence).
  FA_HD static TileRange range(const AttentionParams& p, int64_t n_kv, int64_t offset, int64_t m_start, int rows,
                               int block_n) {
    const int end = kv_tile_end(m_start, rows, block_n, n_kv, p.causal, offset);
    return {0, 0, kv_tile_first_masked(m_start, rows, block_n, n_kv, p.causal, offset), end};
  }
  FA_HD static fa::CausalMask element(const AttentionParams& p, int64_t n_kv, int64_t offset) {
    return {int(n_kv), p.causal, offset};
  }
  FA_HD static bool longest_first(const AttentionParams& p) { return p.causal; }

  // The backward's side (kernels/bwd_mma.cu), which walks Q tiles for each KV tile.
  /// The first Q tile (of block_m rows) that sees a key of the KV tile starting at n_start: the
  /// one holding query n_start − offset when causal (the first to see key n_start), else 0. Every
  /// later Q tile sees the KV tile too, up to the last, so that is the range. q_tiles().first of the
  /// general policies where any row sees the tile; past the last Q tile where none does
  /// (CausalFlagIsTheGeneralQRange, tests/cpu/kernels_mask_test.cpp).
  FA_HD static int64_t q_tile_first(const AttentionParams& p, int64_t offset, int64_t n_start, int block_m) {
    const int64_t first_query = p.causal ? n_start - offset : 0;
    return first_query <= 0 ? 0 : first_query / block_m;
  }
  /// The backward kernels' question, the same for every policy: the Q tiles [first, end) that see the
  /// KV tile at n_start. Here from q_tile_first to the last Q tile.
  FA_HD static QTileSpan q_tile_span(const AttentionParams& p, int64_t offset, int64_t n_start, int /*block_n*/,
                                     int block_m) {
    return {q_tile_first(p, offset, n_start, block_m), (p.seqlen_q + block_m - 1) / block_m};
  }
  /// The first KV tile that sees a Q tile (where its deterministic turn starts): 0, every row's keys
  /// start at key 0.
  FA_HD static int64_t kv_tile_first(const AttentionParams&, int64_t, int64_t, int, int) { return 0; }
  /// Whether the block of queries [q0, q0 + rows) × keys [n_start, n_start + block_n) has an element
  /// that is not visible (a missing query or key, or one past a query's diagonal): the blocks that
  /// need the element test. In int, as the kernel's indices (|offset| < 2^30).
  FA_HD static bool block_masked(const AttentionParams& p, int offset, int q0, int rows, int n_start, int block_n) {
    return n_start + block_n > int(p.seqlen_kv) || q0 + rows > int(p.seqlen_q) ||
           (p.causal && n_start + block_n - 1 > q0 + offset);
  }
};

/// The call's sliding window (AttentionParams::window_left, window_right), with its causal flag
/// folded in (causal bounds the right side at the diagonal) and the ragged bound: its own kernels,
/// in which a Q tile's KV tiles start past tile 0 and are masked at both ends (kFromFirstKey false:
/// the general loop). Forward and backward.
struct WindowFlag {
  static constexpr bool kFromFirstKey = false;
  /// The interval policy of one sequence of N_kv keys with diagonal offset `offset`.
  FA_HD static Both<KeyBound, SlidingWindow> policy(const AttentionParams& p, int64_t n_kv, int64_t offset) {
    const int64_t left = p.window_left < 0 ? kUnbounded : p.window_left;
    int64_t right = p.window_right < 0 ? kUnbounded : p.window_right;
    if (p.causal) right = min64(right, 0);
    return both(KeyBound{n_kv}, SlidingWindow{left, right, offset});
  }
  FA_HD static TileRange range(const AttentionParams& p, int64_t offset, int64_t m_start, int rows, int block_n) {
    return range(p, p.seqlen_kv, offset, m_start, rows, block_n);
  }
  FA_HD static TileRange range(const AttentionParams& p, int64_t n_kv, int64_t offset, int64_t m_start, int rows,
                               int block_n) {
    return kv_tiles(policy(p, n_kv, offset), m_start, rows, block_n);
  }
  FA_HD static Both<KeyBound, SlidingWindow>::Element element(const AttentionParams& p, int64_t offset) {
    return policy(p, p.seqlen_kv, offset).element();
  }
  FA_HD static Both<KeyBound, SlidingWindow>::Element element(const AttentionParams& p, int64_t n_kv, int64_t offset) {
    return policy(p, n_kv, offset).element();
  }
  /// A window gives every Q tile about the same number of KV tiles: no reordering. A causal call
  /// without one (the score modifications' kernels take every mask through this policy) has the
  /// causal flag's triangle: its longest Q tiles first.
  FA_HD static bool longest_first(const AttentionParams& p) {
    return p.causal && p.window_left < 0 && p.window_right < 0;
  }

  // The backward's side (kernels/bwd_mma.cu, kernels/bwd_hopper.cu). Unlike the causal flag's, a
  // window's Q tiles of a KV tile end before the last one, and a Q tile's first KV tile is not 0:
  // its deterministic turn starts there.
  /// The Q tiles (of block_m rows) that see a key of the KV tile starting at n_start: [first, end).
  FA_HD static TileRange q_range(const AttentionParams& p, int64_t offset, int64_t n_start, int block_n, int block_m) {
    return q_tiles(policy(p, p.seqlen_kv, offset), n_start, block_n, block_m, p.seqlen_q);
  }
  FA_HD static QTileSpan q_tile_span(const AttentionParams& p, int64_t offset, int64_t n_start, int block_n,
                                     int block_m) {
    const TileRange r = q_range(p, offset, n_start, block_n, block_m);
    return {r.first, r.end};
  }
  /// The first KV tile (of block_n keys) that a key of some row of [m_start, m_start + rows) sees:
  /// where the deterministic mode's turn for that Q tile starts.
  FA_HD static int64_t kv_tile_first(const AttentionParams& p, int64_t offset, int64_t m_start, int rows, int block_n) {
    return range(p, offset, m_start, rows, block_n).first;
  }
  /// Whether the block of queries [q0, q0 + rows) × keys [n_start, n_start + block_n) has an element
  /// that is not visible: a missing query or key, or a key outside some row's window (the first row
  /// has the lowest upper edge, the last row the highest lower edge).
  FA_HD static bool block_masked(const AttentionParams& p, int offset, int q0, int rows, int n_start, int block_n) {
    if (int64_t(n_start) + block_n > p.seqlen_kv || int64_t(q0) + rows > p.seqlen_q) return true;
    const auto m = policy(p, p.seqlen_kv, offset);
    return !(m.lo(q0 + rows - 1) <= n_start && m.hi(q0) >= int64_t(n_start) + block_n);
  }
};

}  // namespace fa::kernels
