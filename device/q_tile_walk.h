// The order in which a backward block walks its Q tiles (step 22 on). A block of the backward owns
// one KV tile and visits the Q tiles that see it, m_first .. m_tiles − 1 (a sliding window's end
// before the last Q tile: the production kernels pass the Mask's end as `tiles`), one after the
// other; in the deterministic mode each Q tile's dQ additions are made by the KV tiles in a fixed
// order (0, 1, 2, ...: a block's turn is its KV tile, counted from the first that sees the Q tile
// under a window), so the walk decides how long a block waits for
// its turn. Up from m_first, causal, block j meets Q tile m only after blocks 0 .. j − 1 have, and
// they reach it late: block 0 starts at tile 0, block j at tile m_first(j), and block j waits
// until block 0 has walked that far. Down from the last tile, every block starts at the same tile
// and walks in step with the others, one turn behind its left neighbour.
//
// __host__ __device__, so the CPU test (tests/cpu/q_tile_walk_test.cpp) checks, on a model of the
// turnstiles, exactly the walk the kernel takes.
#pragma once

#include "device/mask.h"  // FA_HD

namespace fa::tile {

/// A block's Q tiles m_first .. m_tiles − 1 in the order it takes them: up from m_first, or down
/// from m_tiles − 1. The block counts k = m_first, m_first + 1, ... as before (wrapping to m_first
/// for the next query head of a GQA group) and takes tile(k): only the map from the count to the
/// tile depends on the direction.
struct QTileWalk {
  int first;  ///< m_first: the first Q tile that sees the block's KV tile
  int tiles;  ///< m_tiles: one past the last Q tile
  bool down;  ///< walk from the last tile to the first

  /// The tile taken at count k (first <= k < tiles).
  FA_HD int tile(int k) const { return down ? tiles - 1 + first - k : k; }
  /// How many tiles the walk takes (0 when first >= tiles).
  FA_HD int count() const { return tiles > first ? tiles - first : 0; }
};

}  // namespace fa::tile
