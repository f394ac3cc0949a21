// Step 32's append against the fp64 reference and byte for byte. Sequence b's cache holds the
// problem's keys [0, L_b) before the call and k_new, v_new hold its keys [L_b, L_b + N_new): after
// the call the cache must hold its first L_b + N_new keys, the output must be the reference on
// those, and every other byte of the caches (rows past each sequence's new ones, the padding between
// sequences or pages, spare pages) must be what it was. The caches start NaN where no key is, so a
// row written one place off shows twice: a NaN read where the new row should be, and a changed
// byte where nothing should be written. Contiguous (B, capacity, H_kv, D) caches with a padded batch
// stride, and paged ones (flash-attn's layout, pages shuffled, padded page stride); one sequence in
// each call whose new rows do not fit gets nothing written and attends to its full, unchanged cache.
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

// `lengths`: each sequence's seqlens_kv (its keys before the call); page_size 0: a contiguous cache.
void expect_append(ProblemShape s, int64_t page_size, const std::vector<int32_t>& lengths, int num_splits) {
  s.with_lse = true;
  AttentionProblem prob(s);
  AttentionParams p = prob.params();
  const int64_t B = s.batch, H = s.heads_kv, D = s.head_dim, cap = s.seqlen_kv, n_new = s.seqlen_q, row = H * D;
  ASSERT_EQ(int64_t(lengths.size()), B);
  auto fits = [&](int64_t b) { return lengths[size_t(b)] >= 0 && lengths[size_t(b)] + n_new <= cap; };
  auto length = [&](int64_t b) { return std::clamp<int64_t>(int64_t(lengths[size_t(b)]) + n_new, 0, cap); };
  const std::vector<float> hq = prob.host_q(), hk = prob.host_k(), hv = prob.host_v();
  auto source = [&](const std::vector<float>& h, const Strides& st, int64_t b, int64_t j, int64_t hd, int64_t d) {
    return testing::bf16_bits(h[size_t(b * st.batch + hd * st.head + j * st.seq + d)]);
  };
  // The cache's layout: where key j of sequence b starts (head 0), in elements.
  const bool paged = page_size > 0;
  const int64_t per_seq = paged ? (cap + page_size - 1) / page_size : 0, table_stride = per_seq + 1;
  const int64_t num_pages = paged ? B * per_seq + 2 : 0;                 // two spare pages no sequence owns
  const int64_t stride = paged ? page_size * row + 64 : cap * row + 64;  // between pages, or sequences
  std::vector<int32_t> table(size_t(std::max<int64_t>(B * table_stride, 1)), int32_t(num_pages - 1));
  if (paged) {
    std::vector<int32_t> order(size_t(B * per_seq));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(s.seed)));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < per_seq; ++i) table[size_t(b * table_stride + i)] = order[size_t(b * per_seq + i)];
  }
  auto where = [&](int64_t b, int64_t j) {
    return paged ? table[size_t(b * table_stride + j / page_size)] * stride + (j % page_size) * row
                 : b * stride + j * row;
  };
  const size_t cache_elems = size_t(paged ? num_pages * stride : B * stride);
  std::vector<uint16_t> k_cache(cache_elems, 0xFFFF), v_cache(cache_elems, 0xFFFF);  // NaN where no key is
  // The new rows, (B, N_new, H_kv, D) contiguous: the sequence's next keys, or (a sequence they
  // would not fit) 7.0, which no cache row may receive.
  std::vector<uint16_t> k_new(size_t(B * n_new * row)), v_new(k_new.size());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t old_keys = fits(b) ? lengths[size_t(b)] : cap;  // a sequence that does not fit: full
    for (int64_t j = 0; j < old_keys; ++j)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const size_t to = size_t(where(b, j) + h * D + d);
          k_cache[to] = source(hk, p.k_stride, b, j, h, d);
          v_cache[to] = source(hv, p.v_stride, b, j, h, d);
        }
    for (int64_t r = 0; r < n_new; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const size_t to = size_t((b * n_new + r) * row + h * D + d);
          k_new[to] = fits(b) ? source(hk, p.k_stride, b, lengths[size_t(b)] + r, h, d) : testing::bf16_bits(7.0f);
          v_new[to] = fits(b) ? source(hv, p.v_stride, b, lengths[size_t(b)] + r, h, d) : testing::bf16_bits(7.0f);
        }
  }
  // What the caches must hold after the call: the fitting sequences' new rows at their lengths.
  std::vector<uint16_t> k_want = k_cache, v_want = v_cache;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; fits(b) && r < n_new; ++r)
      for (int64_t e = 0; e < row; ++e) {
        k_want[size_t(where(b, lengths[size_t(b)] + r) + e)] = k_new[size_t((b * n_new + r) * row + e)];
        v_want[size_t(where(b, lengths[size_t(b)] + r) + e)] = v_new[size_t((b * n_new + r) * row + e)];
      }
  std::vector<double> ref_o, ref_lse;
  testing::per_sequence_reference(p, hq, hk, hv, length, &ref_o, &ref_lse);

  DeviceBuffer<uint16_t> k_dev(cache_elems), v_dev(cache_elems), k_new_dev(k_new.size()), v_new_dev(v_new.size());
  k_dev.upload(k_cache);
  v_dev.upload(v_cache);
  k_new_dev.upload(k_new);
  v_new_dev.upload(v_new);
  DeviceBuffer<int32_t> table_dev(table.size()), seqlens(lengths.size());
  table_dev.upload(table);
  seqlens.upload(lengths);
  p.k = k_dev.get();
  p.v = v_dev.get();
  if (paged) {
    p.k_stride = p.v_stride = Strides{stride, D, row, 1};  // (page, head, row in page, dim)
    p.block_table = table_dev.get();
    p.block_table_stride = table_stride;
    p.page_size = page_size;
    p.num_pages = num_pages;
  } else {
    p.k_stride = p.v_stride = Strides{stride, D, row, 1};  // (B, capacity, H_kv, D), padded per sequence
  }
  p.seqlens_kv = seqlens.get();
  p.k_new = k_new_dev.get();
  p.v_new = v_new_dev.get();
  p.k_new_stride = p.v_new_stride = Strides{n_new * row, D, row, 1};
  p.seqlen_new = n_new;
  std::string lens;
  for (int32_t l : lengths) lens += std::to_string(l) + " ";
  const std::string what = (paged ? "page size " + std::to_string(page_size) : std::string("contiguous")) +
                           ", lengths " + lens + ", " + std::to_string(n_new) + " new";
  testing::expect_cache_call_matches(prob, p, num_splits, ref_o, ref_lse, what);
  // Byte for byte: the new rows where they belong, nothing else changed.
  const std::vector<uint16_t> k_got = k_dev.download(), v_got = v_dev.download();
  size_t wrong = 0, first = cache_elems;
  for (size_t i = 0; i < cache_elems; ++i)
    if (k_got[i] != k_want[i] || v_got[i] != v_want[i]) {
      if (!wrong) first = i;
      ++wrong;
    }
  EXPECT_EQ(wrong, 0u) << what << ", num_splits " << num_splits << ": " << wrong
                       << " cache elements differ from the expected append, the first at element " << first << " (row "
                       << first / size_t(row) << ")";
  // The new rows are inputs: the call must not change them.
  EXPECT_TRUE(k_new_dev.download() == k_new && v_new_dev.download() == v_new) << what << ": k_new or v_new changed";
}

ProblemShape shape(int64_t b, int64_t h, int64_t hkv, int64_t n_new, int64_t capacity, int64_t d, bool causal) {
  ProblemShape s;
  s.batch = b, s.heads_q = h, s.heads_kv = hkv, s.seqlen_q = n_new, s.seqlen_kv = capacity, s.head_dim = d;
  s.causal = causal, s.align = CausalAlign::bottom_right;
  s.seed = uint64_t(32000 + b * 7 + h * 11 + n_new * 13 + capacity * 17 + d + causal);
  return s;
}

TEST(KvAppend, NewRowLandsAtEachLength) {
  FA_REQUIRE_GPU();
  // One new token per sequence after: an empty cache, one key, a ragged tile, the last free row,
  // and a full cache (nothing written); contiguous and pages of 16 and 64 keys; split and not.
  for (int64_t page : {0, 16, 64})
    for (int64_t d : {64, 128})
      for (int splits : {1, 0}) expect_append(shape(5, 8, 2, 1, 300, d, false), page, {0, 1, 150, 299, 300}, splits);
}

TEST(KvAppend, SpeculativeRowsAppendedAndMaskedBottomRight) {
  FA_REQUIRE_GPU();
  // Three new tokens whose queries see the cache and the new keys up to their own: causal,
  // bottom-right to each sequence's grown length; one sequence two rows short of room.
  for (int64_t page : {0, 16})
    for (int splits : {1, 3}) expect_append(shape(4, 16, 4, 3, 300, 128, true), page, {0, 61, 297, 298}, splits);
}

TEST(KvAppend, MultiHeadAttentionOnePagePerSequence) {
  FA_REQUIRE_GPU();
  // H_kv = H_q (no packing), one page per sequence, and B past one block's worth of rows.
  std::vector<int32_t> lengths(40);
  for (size_t b = 0; b < lengths.size(); ++b) lengths[b] = int32_t((b * 37) % 128);
  expect_append(shape(40, 4, 4, 1, 128, 64, false), 128, lengths, 0);
}

}  // namespace
}  // namespace fa
