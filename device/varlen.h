// Variable-length sequences (step 31): a batch packed end to end, sequence b's rows starting at
// cu_seqlens[b]. Each block finds its sequence's first row and length here; the offsets are in
// device memory, out of the host's sight, so they are clamped to the tensor (never a wild read) and
// the length to the call's longest (the grid is sized for it).
#pragma once

#include <cstdint>

#include "device/mask.h"  // FA_HD

namespace fa {

/// One sequence's rows in a packed tensor: rows first .. first + length − 1.
struct SequenceRows {
  int64_t first;
  int length;
};

/// Sequence b's rows from B + 1 offsets `cu` into a tensor of `total` rows, at most `longest` of them.
FA_HD SequenceRows sequence_rows(const int32_t* cu, int64_t b, int64_t total, int64_t longest) {
  const int64_t first = cu[b] < 0 ? 0 : (cu[b] > total ? total : int64_t(cu[b]));
  int64_t length = int64_t(cu[b + 1]) - first;
  length = length < 0 ? 0 : length;
  length = length > longest ? longest : length;
  length = length > total - first ? total - first : length;
  return {first, int(length)};
}

}  // namespace fa
