// Index logic shared by the kernels, the references and the FLOP counter. Everything here is
// __host__ __device__ so the CPU tests check exactly the code the kernels run.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif

namespace fa {

// Ceiling division for positive sizes.
FA_HD int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Causal visibility: query row i sees key column j when j <= i + offset, where offset is 0 for
// top-left alignment and N_kv - N_q for bottom-right (AttentionParams::causal_offset()).
FA_HD bool causal_visible(int64_t i, int64_t j, int64_t offset) {
  return j <= i + offset;
}

// Number of keys query row i can see: all N_kv without the mask; with it, the prefix
// [0, i + offset], clamped to [0, N_kv]. Zero means a fully masked row (O = 0, LSE = -inf).
FA_HD int64_t visible_keys(int64_t i, int64_t n_kv, bool causal, int64_t offset) {
  if (!causal) return n_kv;
  int64_t n = i + offset + 1;
  return n < 0 ? 0 : (n > n_kv ? n_kv : n);
}

// A sliding window (flash-attn's window_size = (left, right), −1 = unbounded on that side): query
// row i sees key j when i + offset − left <= j <= i + offset + right, the offset as for causal.
FA_HD bool window_visible(int64_t i, int64_t j, int64_t offset, int64_t left, int64_t right) {
  return (left < 0 || j >= i + offset - left) && (right < 0 || j <= i + offset + right);
}

// Everything a call's mask hides or shows, for the references: the causal flag and the window.
FA_HD bool key_visible(int64_t i, int64_t j, int64_t offset, bool causal, int64_t left, int64_t right) {
  return (!causal || causal_visible(i, j, offset)) && window_visible(i, j, offset, left, right);
}

// The same as one interval: the keys [begin, end) of [0, n_kv) that query row i sees under the
// causal flag and the window (begin == end: none). visible_keys is the causal case's end. The GPU
// reference and the FLOP count walk it; a CPU test proves it equal to key_visible, key by key.
struct KeyRange {
  int64_t begin, end;
};
FA_HD KeyRange visible_key_range(int64_t i, int64_t n_kv, int64_t offset, bool causal, int64_t left, int64_t right) {
  int64_t begin = 0, end = visible_keys(i, n_kv, causal, offset);
  if (right >= 0 && i + offset + right + 1 < end) end = i + offset + right + 1 < 0 ? 0 : i + offset + right + 1;
  if (left >= 0 && i + offset - left > 0) begin = i + offset - left < n_kv ? i + offset - left : n_kv;
  return {begin, end > begin ? end : begin};
}

// Masks as policies: a callable mask(row, col) that is true when query row `row` may see key
// `col`. The warp-tile operation apply_mask (device/warp_tile.h) sets every hidden score to -inf
// before the row max, so the max and the sum run over visible keys only. A new mask (a sliding
// window, a document boundary) is one more policy here; the kernels do not change.

// The policies compare in 32 bits: the tensor-core kernels index query rows and keys with int
// (N_q, N_kv < 2^30, library/launch_limits.h), so row + offset fits too, and 64-bit compares
// would double the instructions of every masked tile. The references use causal_visible above.

// Keys past N_kv do not exist: a ragged last K/V tile.
struct KeyBound {
  int n_kv;
  FA_HD bool operator()(int /*row*/, int col) const { return col < n_kv; }
};

// Keys past N_kv, and with `causal` the keys after the diagonal (causal_visible's rule).
struct CausalMask {
  int n_kv;
  bool causal;
  int offset;  // AttentionParams::causal_offset(), |offset| < 2^30
  FA_HD CausalMask(int n_kv_, bool causal_, int64_t offset_) : n_kv(n_kv_), causal(causal_), offset(int(offset_)) {}
  // Bitwise, not short-circuit: both compares are cheap, and branch-free code keeps the per-element
  // test in predicates instead of materialising each boolean in a register.
  FA_HD bool operator()(int row, int col) const { return (col < n_kv) & (!causal | (col <= row + offset)); }
};

// Keys past N_kv, and the keys outside a row's band: the causal flag and a sliding window together
// (step 38), row + lo <= col <= row + hi, key_visible's rule in two compares. An unbounded side is
// a bound no row reaches (±2^30: rows and keys are below 2^30, library/launch_limits.h).
struct WindowMask {
  int n_kv, lo, hi;
  FA_HD WindowMask(int n_kv_, bool causal, int64_t offset, int64_t left, int64_t right) : n_kv(n_kv_) {
    const int64_t big = int64_t(1) << 30;
    int64_t h = right < 0 ? big : offset + right;
    if (causal && offset < h) h = offset;
    const int64_t l = left < 0 ? -big : offset - left;
    lo = int(l < -big ? -big : l);
    hi = int(h > big ? big : h);
  }
  FA_HD bool operator()(int row, int col) const { return (col < n_kv) & (col >= row + lo) & (col <= row + hi); }
};

// Key/value head read by query head h under grouped-query attention.
FA_HD int64_t kv_head_of(int64_t h, int64_t heads_q, int64_t heads_kv) {
  return h / (heads_q / heads_kv);
}

}  // namespace fa
