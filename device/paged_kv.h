// Paged KV caches (step 30): K and V are pools of fixed-size pages, and each sequence's keys are
// wherever its row of the block table says: key j of sequence b is row j % page_size of page
// block_table[b][j / page_size]. A serving engine hands pages out as sequences grow and takes them
// back when they end, so no sequence reserves its capacity up front.
//
// The kernel needs one thing it did not: the address of a key's row. PagedKv computes it; the tile
// loader below looks the pages up first, every row a thread copies at once, then issues the copies,
// K and V from the same pages (one lookup for both).
#pragma once

#include <cstdint>

#include "device/mask.h"  // FA_HD
#include "device/smem_tile.h"
#include "fa/params.h"

namespace fa::tile {

/// The log2 of a power of two (the page size, validated): its count of trailing zeros.
FA_HD int log2_of_power_of_two(int64_t x) {
  int s = 0;
  while ((int64_t(1) << s) < x) ++s;
  return s;
}

#if defined(__CUDACC__)

/// One sequence's keys of one KV head in a paged cache.
struct PagedKv {
  const bf16* k;          // K at the KV head: page p's row r starts at k + p·k_page + r·k_row
  const bf16* v;          // V at the KV head
  const int32_t* table;   // the sequence's row of the block table
  int64_t k_page, k_row;  // K's strides (elements) between pages, and between a page's rows
  int64_t v_page, v_row;  // V's
  int page_shift;         // log2(page_size): the page size is a power of two
  int last_page;          // num_pages − 1: a page number outside the pool is clamped to it

  /// The page that holds key j (table entries outside [0, num_pages) clamped: never a wild read).
  FA_HD int page_of(int j) const {
    const int page = table[j >> page_shift];
    return page < 0 ? 0 : (page > last_page ? last_page : page);
  }
  /// Key j's row inside its page.
  FA_HD int row_in_page(int j) const { return j & ((1 << page_shift) - 1); }
};

/// Sequence b's keys of KV head h_kv in call p's paged cache (p.block_table set): its row of the
/// table, and K and V at the head, through a page's strides.
__device__ __forceinline__ PagedKv paged_kv(const AttentionParams& p, int64_t b, int64_t h_kv) {
  return PagedKv{static_cast<const bf16*>(p.k) + h_kv * p.k_stride.head,
                 static_cast<const bf16*>(p.v) + h_kv * p.v_stride.head,
                 p.block_table + b * p.block_table_stride,
                 p.k_stride.batch,
                 p.k_stride.seq,
                 p.v_stride.batch,
                 p.v_stride.seq,
                 log2_of_power_of_two(p.page_size),
                 int(p.num_pages) - 1};
}

/// Keys [first_key, first_key + ROWS) of `kv` into k_tile and v_tile by cp.async (rows >=
/// valid_rows arrive as zeros, unread). Each thread first reads the pages of every row it copies,
/// loads that do not wait on each other, then issues its copies: a lookup between two copies would
/// wait for the table behind each (cp.async's asm is a memory barrier to the compiler). The caller
/// commits the group.
template <int NUM_THREADS, int ROWS, typename Layout>
__device__ __forceinline__ void load_paged_kv_async(SmemTile<ROWS, Layout> k_tile, SmemTile<ROWS, Layout> v_tile,
                                                    const PagedKv& kv, int first_key, int valid_rows) {
  using Plan = CopyPlan<ROWS, Layout::kCols, NUM_THREADS>;
  const int row0 = int(threadIdx.x) / Plan::kChunks, col = (int(threadIdx.x) % Plan::kChunks) * 8;
  const uint32_t offset = 2 * Layout::offset(row0, col);
  int page[Plan::kPasses];
#pragma unroll
  for (int pass = 0; pass < Plan::kPasses; ++pass) {
    const int row = row0 + pass * Plan::kRowsPerPass;
    page[pass] = row < valid_rows ? kv.page_of(first_key + row) : 0;
  }
#pragma unroll
  for (int pass = 0; pass < Plan::kPasses; ++pass) {
    const int row = row0 + pass * Plan::kRowsPerPass;
    const bool valid = row < valid_rows;
    const int r = kv.row_in_page(first_key + row);
    const uint32_t to = offset + pass * Plan::kRowsPerPass * Layout::kRowPitch * 2;
    ptx::cp_async_16(k_tile.addr() + to, valid ? kv.k + page[pass] * kv.k_page + r * kv.k_row + col : kv.k, valid);
    ptx::cp_async_16(v_tile.addr() + to, valid ? kv.v + page[pass] * kv.v_page + r * kv.v_row + col : kv.v, valid);
  }
}
#endif

}  // namespace fa::tile
