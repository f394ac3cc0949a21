// Step 30's paged KV caches against the fp64 reference, sequence by sequence. The problem's K and V
// are scattered into pools of pages in flash-attn's layout, (num_pages, page_size, H_kv, D) with a
// padded page stride, each sequence's pages in shuffled order; the pool starts NaN everywhere, so a
// row the kernel reads from a wrong page, a wrong row of the right page, a page past the sequence's
// length or a spare page shows. Table entries past each sequence's pages point at a spare page.
// Page sizes from 1 key (every row its own page) to 256 (a page of several K/V tiles); lengths per
// sequence and none; split and unsplit; O, the LSE, their guards and the workspace poisoned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "reference/cpu_reference.h"
#include "tests/gpu/bf16_bits.h"
#include "tests/gpu/split_kv_check.h"

namespace fa {
namespace {

// Runs the step on `s` (N_kv = the capacity) through a paged copy of its K and V, with `lengths`
// (empty: no seqlens_kv, every sequence at the capacity) and num_splits (0: its choice, with a
// workspace of kMaxKvSplits), and checks every sequence against the reference on its own keys.
void expect_paged_matches(ProblemShape s, int64_t page_size, const std::vector<int32_t>& lengths, int num_splits) {
  s.with_lse = true;
  AttentionProblem prob(s);
  AttentionParams p = prob.params();
  const int64_t B = s.batch, H = s.heads_kv, D = s.head_dim, cap = s.seqlen_kv;
  auto length = [&](int64_t b) { return lengths.empty() ? cap : std::clamp<int64_t>(lengths[size_t(b)], 0, cap); };
  // The pool: every sequence's pages, shuffled, and 3 spare pages that no sequence owns.
  const int64_t per_seq = (cap + page_size - 1) / page_size, table_stride = per_seq + 2;
  const int64_t num_pages = B * per_seq + 3;
  std::vector<int32_t> order(size_t(B * per_seq));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(s.seed)));
  std::vector<int32_t> table(size_t(B * table_stride), int32_t(num_pages - 1));  // past the pages: a spare
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < per_seq; ++i) table[size_t(b * table_stride + i)] = order[size_t(b * per_seq + i)];
  const int64_t row = H * D, page_stride = page_size * row + 64;  // padded: the kernel must take the stride
  const std::vector<float> hq = prob.host_q(), hk = prob.host_k(), hv = prob.host_v();
  std::vector<uint16_t> k_pool(size_t(num_pages * page_stride), 0xFFFF), v_pool(k_pool);  // NaN
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < length(b); ++j) {
      const int64_t page = table[size_t(b * table_stride + j / page_size)];
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const size_t to = size_t(page * page_stride + (j % page_size) * row + h * D + d);
          k_pool[to] =
              testing::bf16_bits(hk[size_t(b * p.k_stride.batch + h * p.k_stride.head + j * p.k_stride.seq + d)]);
          v_pool[to] =
              testing::bf16_bits(hv[size_t(b * p.v_stride.batch + h * p.v_stride.head + j * p.v_stride.seq + d)]);
        }
    }
  std::vector<double> ref_o, ref_lse;
  testing::per_sequence_reference(p, hq, hk, hv, length, &ref_o, &ref_lse);
  DeviceBuffer<uint16_t> k_dev(k_pool.size()), v_dev(v_pool.size());
  k_dev.upload(k_pool);
  v_dev.upload(v_pool);
  DeviceBuffer<int32_t> table_dev(table.size()), seqlens(std::max<size_t>(lengths.size(), 1));
  table_dev.upload(table);
  if (!lengths.empty()) seqlens.upload(lengths);
  p.k = k_dev.get();
  p.v = v_dev.get();
  p.k_stride = p.v_stride = Strides{page_stride, D, row, 1};  // (page, head, row in page, dim)
  p.block_table = table_dev.get();
  p.block_table_stride = table_stride;
  p.page_size = page_size;
  p.num_pages = num_pages;
  p.seqlens_kv = lengths.empty() ? nullptr : seqlens.get();
  std::string lens;
  for (int32_t l : lengths) lens += std::to_string(l) + " ";
  testing::expect_cache_call_matches(
      prob, p, num_splits, ref_o, ref_lse,
      "page size " + std::to_string(page_size) + ", lengths " + (lengths.empty() ? "none" : lens));
}

ProblemShape shape(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t capacity, int64_t d, bool causal) {
  ProblemShape s;
  s.batch = b, s.heads_q = h, s.heads_kv = hkv, s.seqlen_q = nq, s.seqlen_kv = capacity, s.head_dim = d;
  s.causal = causal, s.align = CausalAlign::bottom_right;
  s.seed = uint64_t(30000 + b * 7 + h * 11 + nq * 13 + capacity * 17 + d + causal);
  return s;
}

TEST(PagedCache, DecodeEveryPageSize) {
  FA_REQUIRE_GPU();
  // Pages of one key, smaller than a K/V tile, a tile, four tiles; lengths: the capacity, one key,
  // none, a ragged tile, exactly one tile.
  for (int64_t page : {1, 16, 64, 256})
    for (int64_t d : {64, 128})
      for (int splits : {1, 3, 0})
        expect_paged_matches(shape(5, 8, 2, 1, 1000, d, false), page, {1000, 1, 0, 513, 64}, splits);
}

TEST(PagedCache, SpeculativeRowsWithoutLengths) {
  FA_REQUIRE_GPU();
  // Every sequence at the capacity (777: the last page part-used), 4 causal rows bottom-right.
  for (int splits : {1, 4}) expect_paged_matches(shape(3, 16, 4, 4, 777, 128, true), 32, {}, splits);
}

// A sliding window over a paged cache (the production kernels'): the window starts inside a page
// (pages of 16 keys, and of 64, one K/V tile), ends at each sequence's own length, split or not. A
// step without a window refuses the call by name, with nothing written.
TEST(PagedCache, SlidingWindowOverPages) {
  FA_REQUIRE_GPU();
  ProblemShape s = shape(3, 16, 4, 2, 777, 128, true);
  s.window_left = 100, s.window_right = 0;
  if (testing::the_step().caps.sliding_window) {
    for (int64_t page : {16, 64})
      for (int splits : {1, 3}) expect_paged_matches(s, page, {777, 50, 300}, splits);
    return;
  }
  testing::expect_step_refuses(s, "sliding window");
}

TEST(PagedCache, MultiHeadAttentionOnePage) {
  FA_REQUIRE_GPU();
  // H_kv = H_q (no packing) and a page as large as the capacity: one page per sequence.
  expect_paged_matches(shape(2, 4, 4, 1, 512, 64, true), 512, {300, 512}, 2);
}

}  // namespace
}  // namespace fa
