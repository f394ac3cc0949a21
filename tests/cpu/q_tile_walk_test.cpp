// The backward's walk over Q tiles (device/q_tile_walk.h), and why the deterministic mode walks
// down: a model of its turnstiles, in which each block of one head computes a Q tile in one unit of
// time and then waits for its turn to add that tile's dQ (every block of a lower KV tile that
// visits the tile has added). Walking down, no block waits for more than a chain of additions;
// walking up, causal, block j waits while block 0 walks to block j's first tile.
#include "device/q_tile_walk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace fa::tile {
namespace {

std::vector<int> tiles_of(const QTileWalk& w) {
  std::vector<int> out;
  for (int k = w.first; k < w.first + w.count(); ++k) out.push_back(w.tile(k));
  return out;
}

TEST(QTileWalk, VisitsEachTileOnceInTheOrderAsked) {
  EXPECT_EQ(tiles_of(QTileWalk{2, 6, false}), (std::vector<int>{2, 3, 4, 5}));
  EXPECT_EQ(tiles_of(QTileWalk{2, 6, true}), (std::vector<int>{5, 4, 3, 2}));
  EXPECT_EQ(tiles_of(QTileWalk{0, 1, true}), (std::vector<int>{0}));
  EXPECT_EQ((QTileWalk{6, 6, true}.count()), 0);  // a KV tile no Q tile sees
  EXPECT_EQ((QTileWalk{7, 6, false}.count()), 0);
}

// One head's blocks (KV tiles 0 .. K − 1), all resident, in the deterministic mode: block j walks
// its tiles with QTileWalk{m_first(j), M, down}; a tile costs 1 unit of compute, then the
// block waits for the tile's previous contributor (the highest lower KV tile that visits it) to
// have added, and adds, which takes `add`. Returns each block's idle time (its finish minus its
// work), or an empty vector if no block can move (a deadlock) or a walk leaves the Q tiles.
struct Schedule {
  int m_tiles, block_m, block_n, n_q, n_kv;
  bool causal;
  int m_first(int j) const {                     // the kernel's: the Q tile of the first query that sees key j·BLOCK_N
    const int64_t offset = int64_t(n_kv) - n_q;  // bottom-right; equal lengths: top-left
    const int64_t first_query = causal ? int64_t(j) * block_n - offset : 0;
    return first_query <= 0 ? 0 : int(first_query / block_m);
  }
  int kv_tiles() const { return (n_kv + block_n - 1) / block_n; }
};

std::vector<double> idle_times(const Schedule& s, bool down, double add) {
  const int K = s.kv_tiles(), M = s.m_tiles;
  std::vector<std::vector<int>> walk(K);
  std::vector<std::vector<int>> visitors(M);  // per Q tile, its KV tiles in turn order
  for (int j = 0; j < K; ++j) {
    walk[j] = tiles_of(QTileWalk{s.m_first(j), M, down});
    for (int m : walk[j]) {
      EXPECT_TRUE(m >= 0 && m < M) << "block " << j << " walks to Q tile " << m << " of " << M;
      if (m < 0 || m >= M) return {};
      visitors[m].push_back(j);
    }
  }
  std::vector<std::vector<double>> added(K, std::vector<double>(M, -1.0));  // when block j added tile m
  std::vector<size_t> pos(K, 0);
  std::vector<double> free_at(K, 0.0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int j = 0; j < K; ++j) {
      while (pos[j] < walk[j].size()) {
        const int m = walk[j][pos[j]];
        const auto me = std::find(visitors[m].begin(), visitors[m].end(), j);
        const double turn = me == visitors[m].begin() ? 0.0 : added[*(me - 1)][m];
        if (turn < 0) break;  // the previous contributor has not added yet
        free_at[j] = std::max(free_at[j] + 1.0, turn) + add;
        added[j][m] = free_at[j];
        ++pos[j];
        moved = true;
      }
    }
  }
  std::vector<double> idle(K);
  for (int j = 0; j < K; ++j) {
    if (pos[j] != walk[j].size()) return {};  // deadlock
    idle[j] = free_at[j] - double(walk[j].size()) * (1.0 + add);
  }
  return idle;
}

// The shapes of the steps' configurations: BLOCK_M 64 (D = 64) and 32 (D = 128) against 128 keys,
// causal both alignments, equal and unequal lengths, and non-causal.
std::vector<Schedule> shapes() {
  std::vector<Schedule> out;
  for (int block_m : {32, 64})
    for (bool causal : {true, false})
      for (auto [n_q, n_kv] : {std::pair{1024, 1024}, {4096, 4096}, {1000, 1300}, {2048, 777}})
        out.push_back({(n_q + block_m - 1) / block_m, block_m, 128, n_q, n_kv, causal});
  return out;
}

std::string name(const Schedule& s) {
  return "BLOCK_M " + std::to_string(s.block_m) + " N_q " + std::to_string(s.n_q) + " N_kv " + std::to_string(s.n_kv) +
         (s.causal ? " causal" : "");
}

TEST(TurnstileModel, WalkingDownNoBlockWaitsMoreThanAChainOfAdditions) {
  constexpr double kAdd = 0.01;  // an addition, as a share of a tile's compute
  for (const Schedule& s : shapes()) {
    const std::vector<double> idle = idle_times(s, /*down=*/true, kAdd);
    ASSERT_FALSE(idle.empty()) << name(s) << ": deadlock";
    for (int j = 0; j < int(idle.size()); ++j)
      EXPECT_LE(idle[j], kAdd * s.kv_tiles() + 1e-9) << name(s) << ", block " << j;
  }
}

// What step 22 fixes, in the model: walking up, causal, the last blocks of a head idle for most of
// their run (block j for about j · BLOCK_N / BLOCK_M tiles), so the head takes as long as block 0's
// whole walk on every SM it holds: about twice the work.
TEST(TurnstileModel, WalkingUpCausalBlocksIdleForTilesOnEnd) {
  for (const Schedule& s : shapes()) {
    if (!s.causal || s.n_q < s.n_kv) continue;
    const std::vector<double> idle = idle_times(s, /*down=*/false, 0.01);
    ASSERT_FALSE(idle.empty()) << name(s);
    const int K = s.kv_tiles();
    const double expected = double(K - 1) * s.block_n / s.block_m;  // the last block's first tile
    EXPECT_GE(idle[K - 1], 0.9 * expected) << name(s);
  }
}

}  // namespace
}  // namespace fa::tile
