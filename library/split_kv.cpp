// How many ways to split the keys of a forward call (library/split_kv.h).
#include "library/split_kv.h"

#include "library/launch_limits.h"

#include <algorithm>
#include <cmath>

namespace fa {

int choose_kv_splits(int64_t blocks, int64_t kv_tiles, int64_t slots, int max_splits, SplitRule rule) {
  if (blocks <= 0 || kv_tiles <= 1 || slots <= 0 || max_splits <= 1) return 1;
  if (double(blocks) >= rule.no_split_fill * double(slots))
    return 1;  // most of a wave already: only the combine to add
  const int most = int(std::min<int64_t>({int64_t(max_splits), kv_tiles, slots}));
  // A wave's efficiency: the blocks of the grid over the slots of the waves it takes.
  auto efficiency = [&](int s) {
    const double waves = double(blocks) * s / double(slots);
    return waves / std::ceil(waves);
  };
  // A split count is worth considering only if it shortens the longest range.
  auto shortens = [&](int s) {
    return s == 1 || kv_tiles_per_split(kv_tiles, s) < kv_tiles_per_split(kv_tiles, s - 1);
  };
  double best = 0.0;
  for (int s = 1; s <= most; ++s)
    if (shortens(s)) best = std::max(best, efficiency(s));
  for (int s = 1; s <= most; ++s)
    if (shortens(s) && efficiency(s) >= rule.min_efficiency * best) return s;
  return 1;
}

Status split_count(const AttentionParams& p, const void* split_kernel, int threads, int smem_bytes, int64_t blocks,
                   int64_t kv_tiles, int* splits, SplitRule rule) {
  *splits = 1;
  if (p.num_splits >= 1) {
    *splits = p.num_splits;  // validate() checked that the workspace holds them
    return Status::Ok();
  }
  if (p.workspace == nullptr) return Status::Ok();
  if (Status st = opt_in_shared_memory(split_kernel, smem_bytes); !st.ok()) return st;
  int slots = 0;
  if (Status st = resident_blocks(split_kernel, threads, smem_bytes, &slots); !st.ok()) return st;
  int s = choose_kv_splits(blocks, kv_tiles, slots, kMaxKvSplits, rule);
  while (s > 1 && split_kv_workspace_bytes(p, s) > p.workspace_bytes) --s;
  *splits = s;
  return Status::Ok();
}

}  // namespace fa
