// Shared-memory tiles of the tensor-core steps: how a (ROWS, COLS) bf16 tile is laid out in shared
// memory, and how a block fills one from global memory. A tile's element type is part of its type
// (SmemTile's Elem: bf16 unless asked, fp16 for the production forwards' fp16 kernels), so that the
// products that read it (device/warp_tile.h) pick their instruction from the tile; layouts and
// copies are in bytes of 16-bit elements and the same for both.
//
// A layout answers two questions for the warp-tile operations (device/warp_tile.h):
//   offset(row, col)            element offset of (row, col) from the tile's start
//   move(lane_bytes, rb, cb)    byte offset of a lane's ldmatrix row address in the 16×16 block
//                               (rb, cb), given its byte offset `lane_bytes` in block (0, 0)
// `move` is a compile-time step for constant rb and cb, so a kernel computes each lane's address
// once, before its loop: in the padded layout every ldmatrix inside the loop then addresses with
// an immediate offset; in the swizzled one, each 16-column step is one XOR (a register per step,
// also computed before the loop) and each 16-row step an immediate.
//
// Three layouts; the first two free of bank conflicts for ldmatrix (8 lanes read 8 rows × 16
// bytes at the same logical columns; those 8 rows must fall on 8 different 16-byte bank groups):
//
//   PaddedLayout<COLS>    rows of COLS + 8 elements: row r starts 16·r bytes further round the
//                         128-byte bank cycle. Simple arithmetic; costs 16 bytes per row. Step 04.
//   SwizzledLayout<COLS>  rows of exactly COLS elements, logical 16-byte chunk c of row r stored at
//                         chunk c ^ (r % 8) (device/ptx/swizzle.h). No padding, so a deeper ring of
//                         tiles fits; moving right is an XOR. Step 08.
//   WgmmaLayout<ROWS, COLS>  what wgmma's 128-byte swizzle reads (device/ptx/wgmma.h): the tile
//                         cut into panels of 64 columns, each panel ROWS rows of 128 bytes, the
//                         same XOR inside each row. For COLS = 64 it is SwizzledLayout<64>. Step 11.
//                         At COLS = 32 and 96 (Part VI) the last panel is half used.
//
// Every layout also says `kRowPitch`: how many elements one row down is, at a fixed column.
// And three ways to fill a tile, all zero-filling rows past the tensor's end (a ragged last
// tile holds zeros: never stale data, never the NaN that 0 × NaN would spread through P·V):
//
//   load_tile        16-byte loads into registers, then 16-byte shared stores. The block must
//                    wait for them (a __syncthreads) before anyone reads the tile. Step 04.
//   load_tile_async  cp.async: the copy runs in the background while the block computes; the
//                    caller commits and waits on groups (device/ptx/cp_async.h). Step 08.
//   load_tile_tma    the copy engine: ONE thread issues a copy per 64-column panel of a
//                    WgmmaLayout tile, and an mbarrier says when the bytes have landed
//                    (device/ptx/tma.h, library/tma.h). Rows past N come from the tensor map's
//                    bounds, not from a `valid_rows`. Step 12.
#pragma once

#include <cstdint>
#include <type_traits>

#include "device/mask.h"  // FA_HD
#include "device/ptx/cp_async.h"
#include "device/ptx/swizzle.h"
#include "device/ptx/tma.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace fa::tile {

/// Rows padded by 16 bytes: row stride COLS + 8 elements.
template <int COLS>
struct PaddedLayout {
  static_assert(COLS % 16 == 0, "tile rows are whole 16×16 blocks");
  static constexpr int kCols = COLS;
  static constexpr bool kSwizzled = false;
  static constexpr int kRowElems = COLS + 8;  // the 8 extra bf16 = 16 bytes shift each row's banks
  static constexpr int kRowPitch = kRowElems;
  FA_HD static constexpr int offset(int row, int col) { return row * kRowElems + col; }
  FA_HD static constexpr unsigned move(unsigned lane_bytes, int rb, int cb) {
    return lane_bytes + unsigned(rb * 16 * kRowElems * 2 + cb * 32);
  }
  /// Bytes of a tile of `rows` rows.
  FA_HD static constexpr int bytes(int rows) { return rows * kRowElems * 2; }
};

/// Unpadded rows with the XOR swizzle of device/ptx/swizzle.h.
template <int COLS>
struct SwizzledLayout {
  static_assert(COLS % 64 == 0, "the swizzle needs rows of at least 8 chunks of 16 bytes");
  static constexpr bool kSwizzled = true;
  // move() XORs the column step into the whole byte offset: right only if a row is 2^k bytes.
  static_assert((COLS & (COLS - 1)) == 0, "rows must be a power of two elements long");
  static constexpr int kCols = COLS;
  static constexpr int kRowElems = COLS;
  static constexpr int kRowPitch = COLS;
  FA_HD static int offset(int row, int col) { return ptx::swizzled_offset(row, col, COLS); }
  // 16 rows down keeps r % 8 and so the swizzle: a plain add. 16 columns right is 2 chunks; for a
  // lane whose own chunk is 0 or 1 that is an XOR (ptx::swizzle_move_right).
  FA_HD static constexpr unsigned move(unsigned lane_bytes, int rb, int cb) {
    return ptx::swizzle_move_right(lane_bytes, cb * 16) + unsigned(rb * 16 * COLS * 2);
  }
  FA_HD static constexpr int bytes(int rows) { return rows * COLS * 2; }
};

/// The mma.sync production kernels' layout for tiles of COLS-element rows: the swizzle where a row
/// is a power of two of at least 128 bytes (64, 128, 256 elements), padded rows otherwise (32, 96,
/// 192: 80, 208 and 400 bytes, each 8 rows on 8 different 16-byte bank groups, as ldmatrix needs).
template <int COLS>
using MmaTileLayout =
    std::conditional_t<COLS % 64 == 0 && (COLS & (COLS - 1)) == 0, SwizzledLayout<COLS>, PaddedLayout<COLS>>;

/// Panels of 64 columns, each (ROWS, 64) with the XOR swizzle: wgmma's 128-byte swizzle. COLS = 32
/// and 96 (Part VI's head dims) take one and two panels and use half of the last: the copy engine
/// fills its 32 columns past the tensor's last with zeros, and the products read them as such
/// (P·V's N stays whole panels: O holds kRowElems columns, of which the first COLS are stored).
template <int ROWS, int COLS>
struct WgmmaLayout {
  static_assert(COLS % 32 == 0 && ROWS % 8 == 0, "whole or half 64-column panels of whole 8-row swizzle atoms");
  static constexpr int kCols = COLS;
  static constexpr int kRows = ROWS;
  static constexpr bool kSwizzled = true;
  static constexpr int kPanels = (COLS + 63) / 64;
  static constexpr int kPanelElems = ROWS * 64;   // one (ROWS, 64) panel
  static constexpr int kRowElems = kPanels * 64;  // a tile of r rows holds r · kRowElems elements
  static constexpr int kRowPitch = 64;            // one row down, inside a panel
  FA_HD static int offset(int row, int col) {
    return (col / 64) * kPanelElems + ptx::swizzled_offset(row, col % 64, 64);
  }
  FA_HD static constexpr int bytes(int rows) { return rows * kRowElems * 2; }
};

// Each thread copies 16-byte chunks; all NUM_THREADS threads together copy ROWS_PER_PASS rows per
// pass. As ROWS_PER_PASS is a multiple of 8, a thread's chunk has the same swizzle in every pass
// and its shared offset steps by a constant. Where a row's chunks do not divide the threads (12 at
// D = 96, 24 at D = 192), the threads past the last whole row of a pass copy nothing (kActive), and
// where the passes overrun the tile the last one stops at ROWS (kRagged): a padded layout's offset
// is linear in the row, so any number of rows a pass keeps the constant step; the swizzle's needs a
// multiple of 8. Both are compile-time facts: the lessons' tiles compile as they did.
template <int ROWS, int COLS, int NUM_THREADS>
struct CopyPlan {
  static constexpr int kChunks = COLS / 8;  // 16-byte chunks per row
  static constexpr int kRowsPerPass = NUM_THREADS / kChunks;
  static constexpr int kActive = kRowsPerPass * kChunks;  // the threads that copy
  static constexpr int kPasses = (ROWS + kRowsPerPass - 1) / kRowsPerPass;
  static constexpr bool kRagged = ROWS % kRowsPerPass != 0;
  static_assert(kRowsPerPass >= 1, "at least a row per pass");
  /// Whether thread `thread` copies a chunk in the pass where its row is `row` (from the tile's
  /// first; thread t's row in pass p is t / kChunks + p·kRowsPerPass, its column t % kChunks · 8).
  FA_HD static constexpr bool copies(int thread, int row) {
    return (kActive == NUM_THREADS || thread < kActive) && (!kRagged || row < ROWS);
  }
};

/// Whether a layout's offsets step by a constant from pass to pass of a plan: linear in the row (not
/// kSwizzled), or whole groups of 8 rows a pass (the swizzle's period).
template <typename Layout, typename Plan>
constexpr bool kPlanFits = !Layout::kSwizzled || Plan::kRowsPerPass % 8 == 0;

/// The shared address (or offset) of the chunk a thread copies in pass `pass`, its row `row`: a
/// constant step from its first pass's (`first`) where the plan fits the layout. Else (a swizzled
/// tile copied 4 or 2 rows a pass: 256-column rows over 128 threads, the decode kernel's at D = 192)
/// the swizzle repeats every 8 / kRowsPerPass passes: `base` plus the offset of the thread's row in
/// the first passes of that period, stepped by 8 rows.
template <typename Layout, typename Plan>
FA_HD uint32_t pass_offset(uint32_t first, uint32_t base, int pass, int row, int col) {
  if constexpr (kPlanFits<Layout, Plan>) {
    return first + pass * Plan::kRowsPerPass * Layout::kRowPitch * 2;
  } else {
    static_assert(8 % Plan::kRowsPerPass == 0, "the swizzle's period a whole number of passes");
    constexpr int kPeriod = 8 / Plan::kRowsPerPass;
    const int row0 = row - pass * Plan::kRowsPerPass;  // the thread's row in pass 0
    return base + uint32_t(2 * Layout::offset(row0 + (pass % kPeriod) * Plan::kRowsPerPass, col) +
                           (pass / kPeriod) * 8 * Layout::kRowPitch * 2);
  }
}

/// wgmma reads its swizzle atoms (8 rows of 128 bytes) from 1024-byte boundaries: a kernel with
/// WgmmaLayout tiles allocates this much more dynamic shared memory and starts at aligned_for_wgmma.
constexpr int kWgmmaAlignment = 1024;

#if defined(__CUDACC__)

using bf16 = __nv_bfloat16;
using fp16 = __half;

/// The first 1024-byte boundary at or after `smem` (dynamic shared memory is only 16-byte aligned),
/// as a pointer to Elem.
template <typename Elem = bf16>
__device__ __forceinline__ Elem* aligned_for_wgmma(void* smem) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(smem));
  return reinterpret_cast<Elem*>(static_cast<char*>(smem) +
                                 (kWgmmaAlignment - addr % kWgmmaAlignment) % kWgmmaAlignment);
}

/// A (ROWS, Layout::kCols) tile of Elem (bf16 or fp16) in shared memory: a pointer to its element
/// (0, 0) and the layout the warp-tile operations address it with.
template <int ROWS, typename Layout, typename Elem = bf16>
struct SmemTile {
  static constexpr int kRows = ROWS;
  using layout = Layout;
  using elem = Elem;
  Elem* ptr;
  __device__ __forceinline__ uint32_t addr() const { return static_cast<uint32_t>(__cvta_generic_to_shared(ptr)); }
};

/// The tile `index` tiles of this shape after `t` (ring buffers, K and V side by side).
/// A WgmmaLayout tile holds ROWS · kRowElems elements too (whole panels), so the arithmetic is the same.
template <int ROWS, typename Layout, typename Elem>
__device__ __forceinline__ SmemTile<ROWS, Layout, Elem> next_tile(SmemTile<ROWS, Layout, Elem> t, int index) {
  return {t.ptr + index * ROWS * Layout::kRowElems};
}

/// The same tile, its address opaque to the compiler from this point: address arithmetic derived
/// from it is computed after this point, where it is used. In a loop over tiles that stay put (the
/// backward's K, V and dSᵀ), it stops the compiler from hoisting every wgmma descriptor of a
/// product (D / 16 of them, 64 bits each) out of the loop into registers the accumulators need
/// (step 24: 136 bytes of spill without it).
template <int ROWS, typename Layout, typename Elem>
__device__ __forceinline__ SmemTile<ROWS, Layout, Elem> opaque(SmemTile<ROWS, Layout, Elem> t) {
  asm volatile("" : "+l"(t.ptr));
  return t;
}

/// Rows [SUB·index, SUB·index + SUB) of a tile, as a tile of their own (SUB a multiple of 8, so the
/// swizzle's row pattern, r % 8, is the same in the view: a plain pointer offset).
template <int SUB, int ROWS, typename Layout, typename Elem>
__device__ __forceinline__ SmemTile<SUB, Layout, Elem> row_block(SmemTile<ROWS, Layout, Elem> t, int index) {
  static_assert(SUB % 8 == 0 && ROWS % SUB == 0, "whole 8-row groups of the tile");
  static_assert(Layout::kRowPitch == Layout::kRowElems, "rows one after another (not a panelled layout)");
  return {t.ptr + index * SUB * Layout::kRowElems};
}

/// Fills `tile` with rows [0, ROWS) of a matrix of the tile's element type at `src` (rows `stride`
/// elements apart), through registers: 16-byte global loads, then 16-byte shared stores. Rows >=
/// valid_rows are written as zeros and not read. The caller synchronises the block before the tile
/// is read. (Elem comes from the tile alone: `src` converts to it, so a caller's pointer type never
/// picks another instantiation.)
template <int NUM_THREADS, int ROWS, typename Layout, typename Elem>
__device__ __forceinline__ void load_tile(SmemTile<ROWS, Layout, Elem> tile, const std::type_identity_t<Elem>* src,
                                          int64_t stride, int valid_rows) {
  using Plan = CopyPlan<ROWS, Layout::kCols, NUM_THREADS>;
  static_assert(kPlanFits<Layout, Plan>, "a swizzled tile needs whole groups of 8 rows a pass");
  const int row0 = int(threadIdx.x) / Plan::kChunks, col = (int(threadIdx.x) % Plan::kChunks) * 8;
  Elem* dst0 = tile.ptr + Layout::offset(row0, col);
  uint4 chunk[Plan::kPasses];  // all loads first, then all stores: the loads overlap each other
#pragma unroll
  for (int pass = 0; pass < Plan::kPasses; ++pass) {
    const int row = row0 + pass * Plan::kRowsPerPass;
    chunk[pass] = Plan::copies(int(threadIdx.x), row) && row < valid_rows
                      ? *reinterpret_cast<const uint4*>(src + row * stride + col)
                      : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int pass = 0; pass < Plan::kPasses; ++pass)
    if (Plan::copies(int(threadIdx.x), row0 + pass * Plan::kRowsPerPass))
      *reinterpret_cast<uint4*>(dst0 + pass * Plan::kRowsPerPass * Layout::kRowPitch) = chunk[pass];
}

/// The same copy with cp.async: nothing passes through registers and the call returns at once.
/// The copies join the thread's current cp.async group (close it with ptx::cp_async_commit).
/// COLS < Layout::kCols: the rows in memory are COLS elements (the decode kernel's D = 32, 96 and
/// 192 in tiles of 64, 128 and 256 columns); the tile's columns past them are not written, and its
/// readers never read them.
template <int NUM_THREADS, int ROWS, typename Layout, typename Elem, int COLS = Layout::kCols>
__device__ __forceinline__ void load_tile_async(SmemTile<ROWS, Layout, Elem> tile,
                                                const std::type_identity_t<Elem>* src, int64_t stride, int valid_rows) {
  using Plan = CopyPlan<ROWS, Layout::kCols, NUM_THREADS>;
  static_assert(COLS <= Layout::kCols && COLS % 8 == 0, "whole 16-byte chunks of the tile's rows");
  // Many passes (16 at 256 columns over 128 threads): the stride opaque from here, so that the
  // passes' row · stride are computed at each call instead of hoisted into registers for all of them.
  if constexpr (!kPlanFits<Layout, Plan>) asm volatile("" : "+l"(stride));
  const int row0 = int(threadIdx.x) / Plan::kChunks, col = (int(threadIdx.x) % Plan::kChunks) * 8;
  const uint32_t smem0 = tile.addr() + 2 * Layout::offset(row0, col);
#pragma unroll
  for (int pass = 0; pass < Plan::kPasses; ++pass) {
    const int row = row0 + pass * Plan::kRowsPerPass;
    const bool valid = row < valid_rows;
    const Elem* g = src + (valid ? row * stride + col : 0);
    if (Plan::copies(int(threadIdx.x), row) && (COLS == Layout::kCols || col < COLS))
      ptx::cp_async_16(pass_offset<Layout, Plan>(smem0, tile.addr(), pass, row, col), g, valid);
  }
}

/// load_tile_async with each row from its own address: row_src(row) is where row `row` starts
/// (step 28's packed rows come from several heads). Rows >= valid_rows arrive as zeros, unread.
/// (load_tile_async is not written as a call of this: with a stride functor the compiler schedules
/// it differently, and every step from 04 on would change its instructions.) (COLS as
/// load_tile_async's.)
template <int NUM_THREADS, int ROWS, typename Layout, typename Elem, int COLS = Layout::kCols, typename RowSrc>
__device__ __forceinline__ void load_rows_async(SmemTile<ROWS, Layout, Elem> tile, const RowSrc& row_src,
                                                int valid_rows) {
  using Plan = CopyPlan<ROWS, Layout::kCols, NUM_THREADS>;
  static_assert(Plan::kActive == NUM_THREADS && !Plan::kRagged, "every thread a chunk of whole rows in every pass");
  static_assert(COLS <= Layout::kCols && COLS % 8 == 0, "whole 16-byte chunks of the tile's rows");
  const int row0 = int(threadIdx.x) / Plan::kChunks, col = (int(threadIdx.x) % Plan::kChunks) * 8;
  const uint32_t smem0 = tile.addr() + 2 * Layout::offset(row0, col);
#pragma unroll
  for (int pass = 0; pass < Plan::kPasses; ++pass) {
    const int row = row0 + pass * Plan::kRowsPerPass;
    const bool valid = row < valid_rows;
    if (COLS == Layout::kCols || col < COLS)
      ptx::cp_async_16(pass_offset<Layout, Plan>(smem0, tile.addr(), pass, row, col), row_src(valid ? row : 0) + col,
                       valid);
  }
}

/// Rows [row, row + ROWS) of head `head`, batch `batch` of the tensor that `map` describes (a
/// library/tma.h map with boxes of ROWS rows), into a WgmmaLayout tile by the copy engine: one
/// box per 64-column panel, all completing on the mbarrier at `bar`, which must expect
/// ROWS · kRowElems · 2 bytes (a box's columns past the tensor's arrive as zeros and count). Called
/// by one thread.
template <int ROWS, int COLS, typename Elem>
__device__ __forceinline__ void load_tile_tma(SmemTile<ROWS, WgmmaLayout<ROWS, COLS>, Elem> tile, const void* map,
                                              int row, int head, int batch, uint32_t bar) {
#pragma unroll
  for (int panel = 0; panel < WgmmaLayout<ROWS, COLS>::kPanels; ++panel)
    ptx::tma_load_4d(tile.addr() + panel * ROWS * 128, map, panel * 64, row, head, batch, bar);
}

/// Rows [first_row, ROWS) of a WgmmaLayout tile set to zero by `threads` threads (this one is
/// `thread` of them), 16 bytes at a time. The swizzle permutes 16-byte chunks inside a row's 128
/// bytes of a panel, so a row's bytes are the same 128 whatever the swizzle: no offsets to undo.
/// A TMA tile's rows that its tensor map did not clip (a packed sequence's neighbour) are cleared
/// this way; the caller fences for the async proxy and meets the other writers before wgmma reads.
template <int ROWS, int COLS, typename Elem>
__device__ __forceinline__ void zero_rows(SmemTile<ROWS, WgmmaLayout<ROWS, COLS>, Elem> tile, int first_row, int thread,
                                          int threads) {
  constexpr unsigned kChunks = ROWS * WgmmaLayout<ROWS, COLS>::kPanels * 8;  // 16-byte chunks: 8 per row of each panel
  // Opaque from here: the index arithmetic stays inside the caller's rare branch instead of being
  // hoisted out of its loops into registers that it would have to spill.
  unsigned c = unsigned(thread);
  asm volatile("" : "+r"(c));
  for (; c < kChunks; c += unsigned(threads)) {
    const unsigned row = c / 8 % ROWS;
    if (int(row) >= first_row) reinterpret_cast<uint4*>(tile.ptr + c / 8 * 64)[c % 8] = uint4{0, 0, 0, 0};
  }
}

/// Rows [0, rows) of a WgmmaLayout tile copied to global memory (row r to dst + r·row_stride), 16
/// bytes at a time by `threads` threads (this one is `thread` of them): what a TMA store of the
/// tile would write, had its tensor map ended after `rows` rows. The caller has met the tile's
/// writers at a barrier; the tile may be written again once every copier has met the next one.
template <int ROWS, int COLS, typename Elem>
__device__ __forceinline__ void store_tile_rows(SmemTile<ROWS, WgmmaLayout<ROWS, COLS>, Elem> tile,
                                                std::type_identity_t<Elem>* dst, int64_t row_stride, int rows,
                                                int thread, int threads) {
  constexpr int kRowChunks = COLS / 8;  // 16-byte chunks per row
  for (int c = thread; c < rows * kRowChunks; c += threads) {
    const int row = c / kRowChunks, col = c % kRowChunks * 8;
    *reinterpret_cast<uint4*>(dst + row * row_stride + col) =
        *reinterpret_cast<const uint4*>(tile.ptr + WgmmaLayout<ROWS, COLS>::offset(row, col));
  }
}

/// The other direction (step 16): the copy engine writes a WgmmaLayout tile to the box of
/// ROWS rows at (row, head, batch) of the tensor map `map`, one box per 64-column panel; rows
/// past the tensor's N are not written. Called by one thread, after every thread that wrote
/// the tile has fenced (ptx::fence_proxy_async_shared) and met it at a barrier; the caller
/// commits the stores into a group and waits on it before the tile is written again.
template <int ROWS, int COLS, typename Elem>
__device__ __forceinline__ void store_tile_tma(SmemTile<ROWS, WgmmaLayout<ROWS, COLS>, Elem> tile, const void* map,
                                               int row, int head, int batch) {
#pragma unroll
  for (int panel = 0; panel < WgmmaLayout<ROWS, COLS>::kPanels; ++panel)  // columns past the tensor's: clipped
    ptx::tma_store_4d(map, panel * 64, row, head, batch, tile.addr() + panel * ROWS * 128);
}

#endif  // __CUDACC__

}  // namespace fa::tile
