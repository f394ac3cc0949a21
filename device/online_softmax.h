// The scalar pieces of the online-softmax recurrence that every fused step shares, and the size of
// a ragged last tile. __host__ __device__, so tests/cpu/online_softmax_test.cpp checks exactly the code
// the kernels run. docs/online_softmax.md derives the recurrence; the kernels spell out the
// update itself (m_new, alpha, p, l_i, o_i, then m_i = m_new) because that order is the lesson.
#pragma once

#include <cmath>
#include <cstdint>

#include "device/mask.h"

namespace fa {

// alpha = exp(m_old - m_new): the factor that moves a running sum l = Σ exp(s_j - m_old) (and the
// running output built from the same weights) onto the new, larger running max m_new.
// m_old = -inf (nothing seen yet) gives 0, which discards the all-zero initial state.
// m_new = -inf means every score seen so far was masked; exp(-inf - (-inf)) would be NaN, and 1
// (nothing to rescale: l and O are still 0) is the value that keeps the state finite.
FA_HD float online_softmax_rescale(float m_old, float m_new) {
  return m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
}

// Rows of the tile that starts at `tile_start` which exist: `block`, except for a last tile that
// sticks out past `n` rows. (For which KV tiles a causal Q tile visits, see device/tiles.h.)
FA_HD int tile_rows(int64_t tile_start, int block, int64_t n) {
  return tile_start + block <= n ? block : int(n - tile_start);
}

}  // namespace fa
