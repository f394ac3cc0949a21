// Paged KV caches (step 30): K and V are pools of fixed-size pages, and each sequence's keys are
// wherever its row of the block table says: key j of sequence b is row j % page_size of page
// block_table[b][j / page_size]. A serving engine hands pages out as sequences grow and takes them
// back when they end, so no sequence reserves its capacity up front.
//
// The kernel needs one thing it did not: the address of a key's row. PagedKv computes it;
// lookup_tile_pages reads a tile's pages, each lane one of the rows its lane group copies, a tile
// ahead of load_paged_kv_async, which takes each row's page from the lane that read it and issues
// the copies, K and V from the same pages (one lookup for both).
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
  const bf16* k;         // K at the KV head: page p's row r starts at k + p·k_page + r·k_row
  const bf16* v;         // V at the KV head
  const int32_t* table;  // the sequence's row of the block table
  int k_page, k_row;     // K's strides (elements) between pages, and between a page's rows:
  int v_page, v_row;     // V's. 32-bit (validation keeps them, and a page's rows, below 2^31)
  int page_shift;        // log2(page_size): the page size is a power of two
  int last_page;         // num_pages − 1: a page number outside the pool is clamped to it

  /// The table's entry for key j: the page that holds it, as the caller wrote it (a load; nothing
  /// waits for it until clamped_page() uses it).
  FA_HD int table_entry(int j) const { return table[j >> page_shift]; }
  /// A table entry clamped into [0, num_pages): a bad entry reads a wrong page, never outside the pool.
  FA_HD int clamped_page(int entry) const { return entry < 0 ? 0 : (entry > last_page ? last_page : entry); }
  /// Key j's row inside its page.
  FA_HD int row_in_page(int j) const { return j & ((1 << page_shift) - 1); }
};

/// Sequence b's keys of KV head h_kv in call p's paged cache (p.block_table set): its row of the
/// table, and K and V at the head, through a page's strides.
__device__ __forceinline__ PagedKv paged_kv(const AttentionParams& p, int64_t b, int64_t h_kv) {
  return PagedKv{static_cast<const bf16*>(p.k) + h_kv * p.k_stride.head,
                 static_cast<const bf16*>(p.v) + h_kv * p.v_stride.head,
                 p.block_table + b * p.block_table_stride,
                 int(p.k_stride.batch),
                 int(p.k_stride.seq),
                 int(p.v_stride.batch),
                 int(p.v_stride.seq),
                 log2_of_power_of_two(p.page_size),
                 int(p.num_pages) - 1};
}

/// Where sequence b's key j starts (KV head 0) in call p's K and V, in elements: row j of batch
/// entry b of a contiguous cache, or row j % page_size of page table[j / page_size] (clamped into
/// the pool) of a paged one. For writes into the cache (step 32's append), one key at a time.
struct CacheRow {
  int64_t k, v;
};
__device__ __forceinline__ CacheRow cache_row(const AttentionParams& p, int64_t b, int64_t j) {
  if (p.block_table == nullptr)
    return CacheRow{b * p.k_stride.batch + j * p.k_stride.seq, b * p.v_stride.batch + j * p.v_stride.seq};
  const PagedKv pages = paged_kv(p, b, 0);
  const int64_t page = pages.clamped_page(pages.table_entry(int(j))), row = pages.row_in_page(int(j));
  return CacheRow{page * pages.k_page + row * pages.k_row, page * pages.v_page + row * pages.v_row};
}

/// Step 32's append, one row: sequence b's new row r (of k_new and v_new) copied into K and V as
/// its key `key`, every KV head, by the block's threads, 16 bytes each. The caller chooses the key
/// and whether the row fits; K and V are written (with k_new they are the caches).
__device__ __forceinline__ void write_new_row(const AttentionParams& p, int64_t b, int64_t r, int64_t key) {
  const CacheRow at = cache_row(p, b, key);
  const bf16* const k_src = static_cast<const bf16*>(p.k_new) + b * p.k_new_stride.batch + r * p.k_new_stride.seq;
  const bf16* const v_src = static_cast<const bf16*>(p.v_new) + b * p.v_new_stride.batch + r * p.v_new_stride.seq;
  bf16* const k_dst = const_cast<bf16*>(static_cast<const bf16*>(p.k)) + at.k;
  bf16* const v_dst = const_cast<bf16*>(static_cast<const bf16*>(p.v)) + at.v;
  const int chunks = int(p.head_dim) / 8;  // 16-byte chunks of a head's row
  for (int c = int(threadIdx.x); c < int(p.heads_kv) * chunks; c += int(blockDim.x)) {
    const int64_t h = c / chunks, d = int64_t(c % chunks) * 8;
    *reinterpret_cast<uint4*>(k_dst + h * p.k_stride.head + d) =
        *reinterpret_cast<const uint4*>(k_src + h * p.k_new_stride.head + d);
    *reinterpret_cast<uint4*>(v_dst + h * p.v_stride.head + d) =
        *reinterpret_cast<const uint4*>(v_src + h * p.v_new_stride.head + d);
  }
}

/// The pages of the rows a thread copies of a ROWS-row K/V tile, spread over the lanes that copy the
/// same row: CopyPlan gives a row kChunks lanes and each lane a row per pass, so lane c of a row's
/// kChunks holds the page of that lane group's row in pass c (kPasses <= kChunks). One register a
/// thread, whatever the page size, carried from the lookup to the copies; the copy of pass c takes
/// its page from lane c of its group, a shuffle with a constant source.
template <int NUM_THREADS, int ROWS, typename Layout>
struct TilePages {
  using Plan = CopyPlan<ROWS, Layout::kCols, NUM_THREADS>;
  static_assert(Plan::kActive == NUM_THREADS && !Plan::kRagged && Plan::kPasses <= Plan::kChunks &&
                    32 % Plan::kChunks == 0,
                "a row's lanes hold the pages of all its passes");
  int entry;  // the table entry of this lane's row in pass (lane % kChunks), unclamped
};

/// Reads the table entries of keys [first_key, first_key + ROWS) that the calling warp will copy,
/// a row per lane (rows >= valid_rows: none). One plain load a lane, and nothing here uses its
/// value: the kernel looks a tile's pages up one tile ahead of its copies, so the table's round trip
/// overlaps the tile it computes in between instead of delaying the next copies. (Clamping an
/// entry as it arrives would make the thread wait for the load here.)
template <int NUM_THREADS, int ROWS, typename Layout>
__device__ __forceinline__ TilePages<NUM_THREADS, ROWS, Layout> lookup_tile_pages(const PagedKv& kv, int first_key,
                                                                                  int valid_rows) {
  using Plan = CopyPlan<ROWS, Layout::kCols, NUM_THREADS>;
  const int pass = int(threadIdx.x) % Plan::kChunks;  // the pass whose row this lane looks up
  const int row = int(threadIdx.x) / Plan::kChunks + pass * Plan::kRowsPerPass;
  const bool mine = pass < Plan::kPasses && row < valid_rows;
  return TilePages<NUM_THREADS, ROWS, Layout>{mine ? kv.table_entry(first_key + row) : 0};
}

/// Keys [first_key, first_key + ROWS) of `kv` into k_tile and v_tile by cp.async, from the pages
/// lookup_tile_pages read for the same keys (rows >= valid_rows arrive as zeros, unread). K and V
/// share the pages: key j is in the same page of both pools. Every thread of the warp calls it (the
/// shuffles). The caller commits the group. (COLS as tile::load_tile_async's.) The copies move 16-byte
/// chunks of 16-bit elements: the tiles' Elem (bf16 or fp16) is the pool's, whatever PagedKv's
/// pointers name.
template <int NUM_THREADS, int ROWS, typename Layout, int COLS = Layout::kCols, typename Elem = bf16>
__device__ __forceinline__ void load_paged_kv_async(SmemTile<ROWS, Layout, Elem> k_tile,
                                                    SmemTile<ROWS, Layout, Elem> v_tile, const PagedKv& kv,
                                                    const TilePages<NUM_THREADS, ROWS, Layout>& pages, int first_key,
                                                    int valid_rows) {
  using Plan = typename TilePages<NUM_THREADS, ROWS, Layout>::Plan;
  const int row0 = int(threadIdx.x) / Plan::kChunks, col = (int(threadIdx.x) % Plan::kChunks) * 8;
  static_assert(COLS <= Layout::kCols && COLS % 8 == 0, "whole 16-byte chunks of the tile's rows");
  const uint32_t offset = 2 * Layout::offset(row0, col);
#pragma unroll
  for (int pass = 0; pass < Plan::kPasses; ++pass) {
    const int row = row0 + pass * Plan::kRowsPerPass;
    const bool valid = row < valid_rows;
    const int r = kv.row_in_page(first_key + row);
    const int page = kv.clamped_page(__shfl_sync(0xffffffffu, pages.entry, pass, Plan::kChunks));
    const uint32_t to = tile::pass_offset<Layout, Plan>(offset, 0, pass, row, col);
    // The address arithmetic is most of what paging adds to a tile's instructions, so: one unsigned
    // 32×32 → 64-bit product for the page (clamped, so >= 0), 32-bit math inside it, and no choice of
    // a safe address for rows past valid_rows: their entry is 0, so their address is in page 0.
    const bf16* k_row = kv.k + uint64_t(uint32_t(page)) * uint32_t(kv.k_page) + (r * kv.k_row + col);
    const bf16* v_row = kv.v + uint64_t(uint32_t(page)) * uint32_t(kv.v_page) + (r * kv.v_row + col);
    if (COLS == Layout::kCols || col < COLS) {  // the shuffle above: every lane, whatever its column
      ptx::cp_async_16(k_tile.addr() + to, k_row, valid);
      ptx::cp_async_16(v_tile.addr() + to, v_row, valid);
    }
  }
}
#endif

}  // namespace fa::tile
