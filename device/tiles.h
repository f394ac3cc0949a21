// Which K/V tiles a Q tile visits, and which of them need the per-element mask. Used by the
// tensor-core steps with the causal mask (05 on) and unit-tested on the CPU against a brute-force mask.
//
// A Q tile covers query rows [m_start, m_start + block_m); KV tile n covers keys
// [n·block_n, (n+1)·block_n). With the causal mask, key j is visible to row i when
// j <= i + offset (device/mask.h). Picture for block_m = block_n, offset 0 (· visible, x masked):
//
//              KV tile 0   KV tile 1   KV tile 2
//   Q tile 0   [·x x x]    skipped     skipped        tile 0 straddles the diagonal: masked
//              [· ·x x]
//   Q tile 1   [· · · ·]   [·x x x]    skipped        tile 0 fully visible: no mask at all
//              [· · · ·]   [· ·x x]
//
// kv_tile_end: the first tile no row of the Q tile can see (the loop stops there).
// kv_tile_first_masked: the first tile that some row sees only partly (the diagonal, or keys
// past N_kv in a ragged last tile). Tiles before it run without any mask code.
#pragma once

#include <cstdint>

#include "device/mask.h"

namespace fa {

/// Number of KV tiles the Q tile starting at `m_start` visits: tiles [0, end). Zero when no row
/// of the tile sees any key (bottom-right alignment with N_q > N_kv): the tile just writes zeros.
FA_HD int kv_tile_end(int64_t m_start, int block_m, int block_n, int64_t n_kv, bool causal, int64_t offset) {
  int64_t keys = n_kv;
  if (causal) {
    const int64_t last_row_keys = m_start + block_m + offset;  // keys seen by row m_start + block_m - 1
    keys = last_row_keys < 0 ? 0 : (last_row_keys < n_kv ? last_row_keys : n_kv);
  }
  return int((keys + block_n - 1) / block_n);
}

/// First KV tile that needs per-element masking; tiles [0, first) are fully visible to every row.
FA_HD int kv_tile_first_masked(int64_t m_start, int block_m, int block_n, int64_t n_kv, bool causal, int64_t offset) {
  int64_t first = n_kv / block_n;  // a ragged last tile has keys past N_kv
  if (causal) {
    const int64_t first_row_keys = m_start + offset + 1;  // keys seen by the tile's first row
    const int64_t full = first_row_keys <= 0 ? 0 : first_row_keys / block_n;
    first = full < first ? full : first;
  }
  const int end = kv_tile_end(m_start, block_m, block_n, n_kv, causal, offset);
  return int(first < end ? first : end);
}

/// The K/V tiles a Q tile visits under the causal flag and a sliding window (step 38), and which
/// of them need the element mask. Row i sees keys [lo(i), hi(i)): lo(i) = i + offset − left (0
/// without a left edge), hi(i) = the least of N_kv, i + offset + 1 (causal) and i + offset + right
/// + 1; both grow with i, so the Q tile's first row has the lowest edges and its last row the
/// highest. Tiles [begin, end) hold a key some row sees; [first_full, end_full) hold only keys every
/// row sees (no mask); the tiles at both ends, [begin, first_full) and [end_full, end), are masked.
/// begin == end: no row sees any key. Without a window: begin 0, end kv_tile_end, first_full 0,
/// end_full kv_tile_first_masked.
struct KvTileSpan {
  int begin, first_full, end_full, end;
};
FA_HD KvTileSpan kv_tile_span(int64_t m_start, int block_m, int block_n, int64_t n_kv, bool causal, int64_t offset,
                              int64_t left, int64_t right) {
  auto lo = [&](int64_t i) -> int64_t { return left < 0 || i + offset - left < 0 ? 0 : i + offset - left; };
  auto hi = [&](int64_t i) -> int64_t {
    int64_t h = n_kv;
    if (causal && i + offset + 1 < h) h = i + offset + 1;
    if (right >= 0 && i + offset + right + 1 < h) h = i + offset + right + 1;
    return h < 0 ? 0 : h;
  };
  const int64_t first_row = m_start, last_row = m_start + block_m - 1;
  const int64_t lo_min = lo(first_row), lo_max = lo(last_row), hi_min = hi(first_row), hi_max = hi(last_row);
  if (hi_max <= lo_min) return {0, 0, 0, 0};
  const int begin = int(lo_min / block_n), end = int((hi_max + block_n - 1) / block_n);
  int first_full = int((lo_max + block_n - 1) / block_n), end_full = int(hi_min / block_n);
  if (first_full < begin) first_full = begin;
  if (end_full > end) end_full = end;
  if (end_full <= first_full) first_full = end_full = begin;  // no tile every row sees whole
  return {begin, first_full, end_full, end};
}

/// True when KV tile `n_block` straddles the causal diagonal of the Q tile at `m_start`: some of
/// its (row, key) pairs are visible and some are masked.
FA_HD bool is_diagonal_tile(int64_t m_start, int block_m, int n_block, int block_n, int64_t offset) {
  const int64_t n_start = int64_t(n_block) * block_n;
  const bool some_visible = n_start <= m_start + block_m - 1 + offset;  // first key, last row
  const bool some_masked = n_start + block_n - 1 > m_start + offset;    // last key, first row
  return some_visible && some_masked;
}

// ---- work tiles of a persistent grid (step 14 on) ------------------------------------------------
// A work tile is one Q tile of one (batch, head): T = m_tiles · batch_heads of them, numbered heads
// outer, so that the tiles running at one time share their heads' K/V in L2. A persistent grid of
// G blocks deals them out without any communication between blocks:
//
//  * non-causal, every tile costs the same: block b takes tiles b, b + G, b + 2G, ...
//  * causal, Q tile m visits about m + 1 K/V tiles, so dealt that way block b would get the same
//    Q tile of every head it meets, and some blocks would work several times as long as others.
//    Instead each head's tiles are folded into pairs, the longest with the shortest:
//
//      Q tile (m_tiles = 6):     5 0 | 4 1 | 3 2        each pair visits about m_tiles + 1 K/V tiles
//      work tile t in the head:  0 1 | 2 3 | 4 5
//
//    and block b takes the pairs b, b + G, b + 2G, ..., each pair's long tile first. Every pair
//    costs the same, so every block ends within one pair of the others.

/// The work tile block `block` of `grid` takes in its k-th turn (>= T once it has had them all):
/// single tiles, or (paired) both tiles of pairs b, b + G, ... in turn.
FA_HD int persistent_tile(int k, int block, int grid, bool paired) {
  return paired ? 2 * (block + (k >> 1) * grid) + (k & 1) : block + k * grid;
}

/// Kept far enough below 2^31 that the next turn's index still fits in an int.
constexpr int64_t kMaxWorkTiles = 0x7fffffff - 2 * 0xffff;

struct WorkTile {
  int bh;      // batch · heads_q + head
  int m_tile;  // which Q tile of that head
};

/// Work tile t of m_tiles · batch_heads: heads outer; causal: folded pairs (above).
FA_HD WorkTile work_tile(int t, int m_tiles, bool causal) {
  const int bh = t / m_tiles, i = t - bh * m_tiles;
  if (!causal) return {bh, i};
  return {bh, (i & 1) ? i >> 1 : m_tiles - 1 - (i >> 1)};
}

/// Packed sequences (varlen) have fewer Q tiles than the longest, whose count (m_tiles) numbers the
/// work tiles: folded by m_tiles, a short sequence's pairs lose their long tile and cost unequal
/// amounts. This is the Q tile of work_tile's slot had the head been folded by its own count `own`
/// (pairs of equal cost again), or `own` when the slot lies past the sequence's tiles (no work).
/// Causal only; with own == m_tiles it returns m_tile.
FA_HD int refold_tile(int m_tile, int m_tiles, int own) {
  const int slot = m_tile >= m_tiles / 2 ? 2 * (m_tiles - 1 - m_tile) : 2 * m_tile + 1;  // work_tile's inverse
  if (slot >= own) return own;
  return (slot & 1) ? slot >> 1 : own - 1 - (slot >> 1);
}

}  // namespace fa
