// How many ways to split the keys of a forward call (split-KV, Part V): host code.
//
// A forward block computes one Q tile of one (batch, query head). At decode (N_q = 1 or a few
// rows) there are only B·H_q such blocks, a few dozen on a GPU with 132 SMs, each streaming a long
// KV range: most of the GPU idles and the KV cache is read at a fraction of the memory's rate.
// Splitting each block's KV tiles into S ranges gives S times the blocks, at the price of a
// combine pass (device/split_combine.h) over S partial results.
//
// The choice: no split when the blocks already fill the GPU; otherwise the fewest splits whose
// last wave is nearly as full as the best choice's. A wave is one block in every slot (SMs ×
// blocks per SM); a grid that ends with a half-empty wave wastes the other half of that wave's
// time. Splits that give every range as many KV tiles as one split fewer does are skipped: they
// add blocks without shortening any.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fa/params.h"  // kMaxKvSplits: S partial results per row cost S · D · 4 bytes of workspace

namespace fa {

/// When to split, and how far: a grid whose blocks fill at least `no_split_fill` of a wave is not
/// split (splitting only adds the combine); otherwise the fewest splits whose last wave is at least
/// `min_efficiency` as full as the best choice's.
struct SplitRule {
  double no_split_fill;
  double min_efficiency;
};
/// The steps' rule.
constexpr SplitRule kSplitRule{0.8, 0.85};
/// The production decode kernel's: a memory-bound decode reads at the rate of the blocks resident,
/// so a wave 85 % full reads at about 85 % of the rate, while the extra splits' combine costs
/// microseconds. On the H200, 1 × 128k keys (8 KV heads) read 3.35 TB/s at 29 splits (232 blocks of
/// 264 slots) and 3.59 at 33 (264); 4 × 64k read 3.62 at 7 splits (224) and 4.05 at 8 (256).
constexpr SplitRule kDecodeSplitRule{0.95, 0.95};

/// The number of KV ranges (1 = no split) for a grid of `blocks` blocks (Q tiles × B × H_q), each
/// walking `kv_tiles` KV tiles, on `slots` resident-block slots (SMs × blocks per SM), at most
/// `max_splits`, by `rule`. Always between 1 and max(1, min(max_splits, kv_tiles)).
int choose_kv_splits(int64_t blocks, int64_t kv_tiles, int64_t slots, int max_splits = kMaxKvSplits,
                     SplitRule rule = kSplitRule);

/// The split count a split-KV forward uses on call `p`: the call's (num_splits >= 1); else, with a
/// workspace, choose_kv_splits for an unsplit grid of `blocks` blocks over `kv_tiles` KV tiles,
/// on the slots the GPU holds of `split_kernel` (resident blocks × SMs), cut to what the workspace
/// holds; 1 without a workspace. The slots are asked after the kernel has opted in to `smem_bytes`
/// of shared memory: before, CUDA's occupancy query answers 0 blocks for a kernel above 48 KB, and
/// nothing would ever split. `rule`: choose_kv_splits's.
Status split_count(const AttentionParams& p, const void* split_kernel, int threads, int smem_bytes, int64_t blocks,
                   int64_t kv_tiles, int* splits, SplitRule rule = kSplitRule);

/// KV tiles per range when `kv_tiles` are split `splits` ways (the last range may be shorter, or
/// empty when splits > kv_tiles: its block writes lse = −inf).
inline int64_t kv_tiles_per_split(int64_t kv_tiles, int splits) {
  return (kv_tiles + splits - 1) / splits;
}

/// The production decode kernel (kernels/fwd_decode.cu) packs a KV head's query heads into one
/// tile of this many rows: it takes calls with N_q · H_q / H_kv up to it, with keys in tiles of
/// kDecodeKvTile.
constexpr int64_t kDecodeMaxPackedRows = 64;
constexpr int64_t kDecodeKvTile = 64;

/// The split-KV workspace the library's choice may use on `p`: enough for any split count the
/// decode kernel chooses (at most one range per KV tile, at most kMaxKvSplits), 0 for a call it
/// does not take.
inline size_t forward_workspace_bytes(const AttentionParams& p) {
  if (p.heads_kv < 1 || p.heads_q % p.heads_kv != 0 || p.seqlen_q < 1 || p.seqlen_kv < 1) return 0;
  if (p.seqlen_q * (p.heads_q / p.heads_kv) > kDecodeMaxPackedRows) return 0;
  const int64_t tiles = (p.seqlen_kv + kDecodeKvTile - 1) / kDecodeKvTile;
  return split_kv_workspace_bytes(p, int(tiles < kMaxKvSplits ? tiles : kMaxKvSplits));
}

}  // namespace fa
