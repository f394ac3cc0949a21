// XOR swizzle for bf16 tiles in shared memory.
//
// A tile row of HEAD_DIM bf16 is 128, 256 or 512 bytes: a multiple of the 128 bytes that the 32 banks
// of shared memory cover. Stored plainly, the 8 rows one ldmatrix matrix reads (same columns,
// consecutive rows) all start in the same bank → an 8-way bank conflict, 8 times slower.
//
// The fix: split each row into 16-byte chunks (8 bf16) and store logical chunk c of row r at
// physical chunk c ^ (r % 8). Eight consecutive rows read at one logical chunk now hit eight
// different chunk positions of a 128-byte line, i.e. all 32 banks once. The mapping is a
// permutation within each row (so nothing is lost) and the cp.async writes, one chunk per lane,
// stay conflict-free too. No padding, so no shared memory is wasted.
//
//   logical chunk:  0 1 2 3 4 5 6 7         physical position of row r = c ^ r
//   row 0           0 1 2 3 4 5 6 7
//   row 1           1 0 3 2 5 4 7 6
//   row 2           2 3 0 1 6 7 4 5
//   ...             (row 7: 7 6 5 4 3 2 1 0)
#pragma once

#include "device/mask.h"  // FA_HD

namespace fa::ptx {

/// Element offset of (row, col) in a swizzled tile with `row_elems` bf16 per row (a multiple of
/// 64, i.e. at least eight 16-byte chunks). `col` may be anywhere in its chunk.
FA_HD int swizzled_offset(int row, int col, int row_elems) {
  const int chunk = col / 8;
  return row * row_elems + ((chunk ^ (row % 8)) * 8) + col % 8;
}

}  // namespace fa::ptx

namespace fa::ptx {

/// The offset of the same lane's ldmatrix row address `cols` columns further right, where `cols`
/// is a multiple of 16 and the lane's own column is 0 or 8 (its chunk is 0 or 1). Then
/// chunk + cols/8 = chunk ^ (cols/8) and the swizzle XOR commutes with it, so moving right is an
/// XOR with a compile-time constant: no per-block address registers, no per-block arithmetic
/// beyond one LOP3. Works on element or byte offsets (`elem_bytes` = 1 for elements).
FA_HD unsigned swizzle_move_right(unsigned offset, int cols, int elem_bytes = 2) {
  return offset ^ unsigned(cols * elem_bytes);
}

}  // namespace fa::ptx
