// GQA packing (step 28): the query heads that share a KV head become the rows of one Q tile, so a
// block reads each K/V tile once for all of them. Packed row r of the block's group stands for
// query i = r / pack of head h0 + r % pack: the heads of one query position sit next to each other,
// so a tile's rows span as few query positions as possible, and with them its causal range of
// keys. Everything here is __host__ __device__ so the CPU tests check the code the kernel runs.
#pragma once

#include <cstdint>

#include "device/mask.h"

namespace fa {

/// The address of packed row r in a tensor whose heads are `head_stride` and whose query rows are
/// `seq_stride` elements apart, from `base`, the group's first head at query 0: Q, O, the LSE and
/// the split partials all go through one of these.
template <typename T>
struct PackedRows {
  T* base;
  int64_t head_stride, seq_stride;
  int pack;  // query heads per packed row group: G under GQA, 1 when not packed
  FA_HD T* operator()(int r) const { return base + int64_t(r % pack) * head_stride + int64_t(r / pack) * seq_stride; }
};

/// The query position of packed row r.
FA_HD int packed_query(int r, int pack) {
  return r / pack;
}

/// The queries of the packed tile of rows [m_start, m_start + block_m) cut at n_rows: first,
/// first + 1, .., first + count − 1. The tile's KV range is theirs (kv_tile_end(first, count, ..)).
struct QueryRange {
  int first, count;
};
FA_HD QueryRange packed_tile_queries(int m_start, int block_m, int n_rows, int pack) {
  const int last_row = (m_start + block_m < n_rows ? m_start + block_m : n_rows) - 1;
  return {packed_query(m_start, pack), packed_query(last_row, pack) - packed_query(m_start, pack) + 1};
}

/// CausalMask on packed rows: row r is query r / pack.
struct PackedCausalMask {
  int n_kv;
  bool causal;
  int offset;
  int pack;
  FA_HD PackedCausalMask(int n_kv_, bool causal_, int64_t offset_, int pack_)
      : n_kv(n_kv_), causal(causal_), offset(int(offset_)), pack(pack_) {}
  FA_HD bool operator()(int row, int col) const {
    return (col < n_kv) & (!causal | (col <= packed_query(row, pack) + offset));
  }
};

/// WindowMask (device/mask.h: the causal flag and a sliding window) on packed rows: row r is query
/// r / pack. The production decode kernel's.
struct PackedWindowMask {
  WindowMask mask;
  int pack;
  FA_HD bool operator()(int row, int col) const { return mask(packed_query(row, pack), col); }
};

}  // namespace fa
