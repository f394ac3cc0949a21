// The production kernels' Sequences policies: where sequence b's rows are, and how many it has.
//
//   Batched  (B, H, N, D) tensors: sequence b is batch entry b, with N_q queries and N_kv keys.
//   Packed   (total, H, D) tensors, sequences end to end (step 31's varlen): sequence b's rows
//            and lengths from cu_seqlens_q and cu_seqlens_kv (device/varlen.h), each up to the
//            call's longest.
//
// A kernel compiles one instantiation per policy and its host side picks by the call
// (cu_seqlens_q set or not), so that a batched call carries no packed-sequence code in its loops:
// the Hopper forward's batched instantiations keep step 16's instruction counts.
#pragma once

#include "device/varlen.h"
#include "fa/params.h"

namespace fa::kernels {

struct Batched {
  static constexpr bool kPacked = false;
  FA_HD static SequenceRows queries(const AttentionParams& p, int64_t) { return {0, int(p.seqlen_q)}; }
  FA_HD static SequenceRows keys(const AttentionParams& p, int64_t) { return {0, int(p.seqlen_kv)}; }
};

struct Packed {
  static constexpr bool kPacked = true;
  FA_HD static SequenceRows queries(const AttentionParams& p, int64_t b) {
    return sequence_rows(p.cu_seqlens_q, b, p.total_q, p.seqlen_q);
  }
  FA_HD static SequenceRows keys(const AttentionParams& p, int64_t b) {
    return sequence_rows(p.cu_seqlens_kv, b, p.total_kv, p.seqlen_kv);
  }
};

}  // namespace fa::kernels
