// The production kernels' Scheduler policies: which (batch·head, Q tile) a block works on, turn by
// turn. A work tile is one Q tile of one (batch, head); `Tiles` says how many there are and whether
// the longest go first (causal: Q tile m visits about m + 1 KV tiles).
//
// One interface, that varlen and split-KV schedulers will implement too:
//
//   grid(tiles, resident, &dim3)   host: the grid to launch (resident: blocks that fit at once),
//                                  or an error when the work cannot be numbered;
//   work(tiles, turn)              device: the block's work tile in its turn-th turn (turn 0 is the
//                                  first); a Work whose bh lies outside [0, batch_heads) means the
//                                  block has no (more) work: −1 (persistent, past the last tile)
//                                  or ≥ batch_heads (grid: a spare block of the last z slice).
//
// GridScheduler gives every block one turn (step 10's grid); PersistentScheduler launches as many
// blocks as run at once and deals the tiles out turn by turn (steps 14–16, device/tiles.h).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "device/tiles.h"
#include "fa/params.h"
#include "library/launch_limits.h"

namespace fa::kernels {

/// The work tiles of one call: m_tiles Q tiles in each of batch_heads (batch, head) pairs.
struct Tiles {
  int m_tiles;
  int64_t batch_heads;
  bool longest_first;  // causal: the Q tiles with the most KV tiles first
};

/// One block per work tile: Q tiles along x, B·H_q along y and on along z past gridDim.y's 65535.
struct GridScheduler {
  struct Work {
    int m_block;
    int64_t bh;  // >= batch_heads: the few spare blocks of the last z slice have no work
  };
  static Status grid(const Tiles& t, int /*resident*/, dim3* grid) {
    *grid = dim3(unsigned(t.m_tiles), unsigned(std::min<int64_t>(t.batch_heads, kMaxGridYZ)),
                 unsigned(cdiv(t.batch_heads, kMaxGridYZ)));
    return Status::Ok();
  }
  /// The block's one work tile (turn 0); longest first: Q tiles from the last.
  __device__ __forceinline__ static Work work(const Tiles& t, int turn) {
    if (turn > 0) return {0, t.batch_heads};
    const int m_block = t.longest_first ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
    return {m_block, blockIdx.y + int64_t(blockIdx.z) * gridDim.y};
  }
};

/// As many blocks as run at once, never more than there are tiles; block b takes tiles b, b + G, ...
/// heads outer, so the tiles in flight share their heads' K/V in L2; longest first: each head's Q
/// tiles folded into pairs of equal cost (device/tiles.h's persistent_tile and work_tile).
struct PersistentScheduler {
  struct Work {
    int bh;  // -1: no more work tiles
    int m_block;
  };
  static Status grid(const Tiles& t, int resident, dim3* grid) {
    const int64_t tiles = int64_t(t.m_tiles) * t.batch_heads;
    if (tiles > kMaxWorkTiles)
      return Status::Unsupported("persistent grid: more than 2^31 work tiles (B·H_q·N_q / BLOCK_M)");
    *grid = dim3(unsigned(std::min<int64_t>(tiles, resident)));
    return Status::Ok();
  }
  __device__ __forceinline__ static Work work(const Tiles& t, int turn) {
    const int tile = persistent_tile(turn, int(blockIdx.x), int(gridDim.x), t.longest_first);
    if (tile >= t.m_tiles * int(t.batch_heads)) return {-1, 0};  // at most kMaxWorkTiles (grid() refuses more)
    const WorkTile w = work_tile(tile, t.m_tiles, t.longest_first);
    return {w.bh, w.m_tile};
  }
};

}  // namespace fa::kernels
