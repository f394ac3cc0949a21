// The production kernels' Epilogue policies: how a warp's 16 finished rows of O (normalised, and
// rounded to the call's element type, bf16 or fp16: Out's Elem) and their LSE leave the kernel.
//
//   RegisterStore  16-bit pairs straight from the accumulators to global memory (steps 10 and 15);
//                  rows past N_q are not written.
//   TmaStore       through the consumer warpgroup's swizzled tile in shared memory and one TMA
//                  store per 64-column panel (step 16); rows past N_q are clipped by O's tensor
//                  map. Hopper only; finish() waits for the last store before the block exits.
//                  A packed (varlen) tensor's map does not end where a sequence does: the rows
//                  past it are the next sequence's, so a warpgroup whose rows run past its
//                  sequence's end (`direct`) copies its existing rows from the tile itself.
//
// Both write LSE = scale·m + ln(l) (−inf for a row that saw no key) from the registers. An
// epilogue reads the fields of `Out` it needs; the kernel fills them where step 16 computed them
// (an unused field costs nothing: it is never materialised).
//
//   PackedStore    the decode kernel's (kernels/fwd_decode.cu): a GQA-packed tile's rows each to
//                  their own (head, query) address (device/gqa_pack.h), as bf16 into O or, for a
//                  split, as fp32 into the workspace's partial O; the LSE (or the partial LSE) beside.
#pragma once

#include <cstdint>
#include <type_traits>

#include "device/gqa_pack.h"
#include "device/ptx/sm90.h"
#include "device/ptx/tma.h"
#include "device/smem_tile.h"
#include "device/warp_tile.h"

namespace fa::kernels {

/// No shared-memory tile: the register epilogue's Out.
struct NoTile {};

/// Where a warp's rows go. `OTile`: the SmemTile type of a consumer's O tile (TmaStore), or NoTile;
/// `Elem`: O's element type (bf16 or fp16), which the rounding of each value follows.
template <class OTile = NoTile, typename Elem = tile::bf16>
struct Out {
  Elem* o = nullptr;         // O's row for the Q tile's first row (RegisterStore; TmaStore when direct)
  int64_t o_row_stride = 0;  // elements from one row of O to the next
  float* lse = nullptr;      // LSE's entry for the Q tile's first row; nullptr: no LSE
  int row0 = 0;              // the warp's first row in the Q tile
  int valid_rows = 0;        // rows of the Q tile that exist: N_q − m_start
  // TmaStore only: the warpgroup's tile, the warp's first row in it, the warpgroup's named
  // barrier, O's tensor map and the tile's box (row, head, batch).
  OTile tile{};
  bool direct = false;  // the warpgroup's rows end inside the map (a packed sequence's last tile): no TMA
  int tile_row0 = 0;
  int barrier = 0;
  const void* map = nullptr;
  int map_row = 0, head = 0, batch = 0;
};

#if defined(__CUDACC__)

/// LSE from the registers, one lane per row: the part every epilogue shares.
template <class OTile, typename Elem>
__device__ __forceinline__ void store_lse(const Out<OTile, Elem>& out, tile::Rows m_i, tile::Rows l, float scale_log2) {
  if (out.lse != nullptr)
    tile::store_row_values(out.lse, tile::log_sum_exp(m_i, l, scale_log2), out.row0, out.valid_rows);
}

struct RegisterStore {
  static constexpr bool kSmemTile = false;  // needs no O tile in shared memory
  static constexpr const char* kName = "O=registers";
  template <int D, class OTile, typename Elem>
  __device__ __forceinline__ static void store(const Out<OTile, Elem>& out, const tile::Acc<D>& o_i, tile::Rows m_i,
                                               tile::Rows l, float scale_log2) {
    tile::store_rows(out.o, out.o_row_stride, o_i, tile::safe_inverse(l), out.row0, out.valid_rows);
    store_lse(out, m_i, l, scale_log2);
  }
  __device__ __forceinline__ static void finish() {}
};

/// Where a packed tile's rows go: row r of the tile (from m_start) is packed row m_start + r of the
/// group, whose O row is o(m_start + r) and LSE lse(m_start + r) (lse.base == nullptr: no LSE).
template <typename T>
struct PackedOut {
  PackedRows<T> o;
  PackedRows<float> lse;
  int m_start = 0;     // the tile's first packed row
  int row0 = 0;        // the warp's first row in the tile
  int valid_rows = 0;  // packed rows of the tile that exist
};

struct PackedStore {
  template <int D, typename T>
  __device__ __forceinline__ static void store(const PackedOut<T>& out, const tile::Acc<D>& o_i, tile::Rows m_i,
                                               tile::Rows l, float scale_log2) {
    tile::store_rows(o_i, tile::safe_inverse(l), out.row0, out.valid_rows,
                     [&](int row) { return out.o(out.m_start + row); });
    if (out.lse.base != nullptr)
      tile::store_row_values(tile::log_sum_exp(m_i, l, scale_log2), out.row0, out.valid_rows,
                             [&](int row) { return out.lse(out.m_start + row); });
  }
};

struct TmaStore {
  static constexpr bool kSmemTile = true;  // one (64, D) tile per consumer warpgroup
  static constexpr const char* kName = "O=smem";
  /// Called by all 128 threads of a consumer warpgroup. Its first thread waits until its previous
  /// store has read the tile (only the issuing thread can ask; the named barrier tells the other
  /// 127); the warpgroup writes, fences the writes for the copy engine, meets again, and the first
  /// thread issues the store.
  template <int D, class OTile, typename Elem>
  __device__ __forceinline__ static void store(const Out<OTile, Elem>& out, const tile::Acc<D>& o_i, tile::Rows m_i,
                                               tile::Rows l, float scale_log2) {
    static_assert(std::is_same_v<typename OTile::elem, Elem>, "O's tile holds O's element type");
    const bool leader = threadIdx.x % 128 == 0;  // the consumer's thread that issues its O stores
    if (leader) ptx::bulk_wait_group_read<0>();
    ptx::named_barrier_sync(out.barrier, 128);
    tile::store_rows_to_tile(out.tile, o_i, tile::safe_inverse(l), out.tile_row0);
    ptx::fence_proxy_async_shared();  // the writes above, before the copy engine's reads
    ptx::named_barrier_sync(out.barrier, 128);
    if (out.direct) {  // the same for the whole warpgroup; its first row is row0 − tile_row0 of the Q tile
      const int wg_row0 = out.row0 - out.tile_row0;
      tile::store_tile_rows(out.tile, out.o + wg_row0 * out.o_row_stride, out.o_row_stride, out.valid_rows - wg_row0,
                            int(threadIdx.x % 128), 128);
    } else if (leader) {
      tile::store_tile_tma(out.tile, out.map, out.map_row, out.head, out.batch);
      ptx::bulk_commit_group();
    }
    store_lse(out, m_i, l, scale_log2);
  }
  /// The block's shared memory must outlive the copy engine's last read of it, and O's writes
  /// must be done before the kernel is.
  __device__ __forceinline__ static void finish() {
    if (threadIdx.x % 128 == 0) ptx::bulk_wait_group<0>();
  }
};

#endif  // __CUDACC__

}  // namespace fa::kernels
