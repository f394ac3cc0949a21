// Variable-length sequences (step 31): a batch packed end to end, sequence b's rows starting at
// cu_seqlens[b]. Each block finds its sequence's first row and length here; the offsets are in
// device memory, out of the host's sight, so they are clamped to the tensor (never a wild read) and
// the length to the call's longest (the grid is sized for it).
#pragma once

#include <cstdint>

#include "device/mask.h"  // FA_HD
#include "fa/params.h"

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

/// Sequence b's causal diagonal: key j visible to its query i when j <= i + offset; 0 aligned top-left,
/// its own N_kv − N_q bottom-right (AttentionParams::causal_offset() for one sequence's lengths).
FA_HD int64_t sequence_causal_offset(const AttentionParams& p, int64_t n_q, int64_t n_kv) {
  return p.causal_align == CausalAlign::bottom_right ? n_kv - n_q : 0;
}

/// Where sequence b starts in a tensor of strides `s`: at its first packed row with varlen, else at
/// batch entry b.
FA_HD int64_t sequence_offset(const Strides& s, int64_t b, const SequenceRows& seq, bool varlen) {
  return varlen ? seq.first * s.seq : b * s.batch;
}

/// The LSE of query i of sequence b and query head h in call p's LSE: (H_q, total_q) with varlen,
/// rows packed like Q's; else (B, H_q, N_q).
FA_HD int64_t lse_offset(const AttentionParams& p, int64_t b, int64_t h, const SequenceRows& seq, int64_t i,
                         bool varlen) {
  return varlen ? h * p.total_q + seq.first + i : (b * p.heads_q + h) * p.seqlen_q + i;
}

}  // namespace fa
