// store_rows into fp32 (device/warp_tile.h), as step 27's splits write their partial outputs to the
// workspace, against the CPU model of the accumulator layout: each value times its row's scale,
// exact in fp32, rows at or past valid_rows and the columns past D untouched, guard regions too.
// The bf16 case is step 04's test (steps/04_fp32_state/tests/warp_tile_test.cu).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "device/warp_tile.h"
#include "harness/device_buffer.h"
#include "tests/gpu/step_suite.h"
#include "tests/gpu/warp_tile_model.h"

namespace fa {
namespace {

using namespace fa::tile;
using namespace fa::tile_model;

constexpr int kRows = 32, kGuard = 64;
// (row0, valid_rows): a partly valid second warp, a whole first warp, a second warp wholly past N_q.
constexpr std::pair<int, int> kCases[] = {{16, 27}, {0, 16}, {16, 10}};

template <int D>
__global__ void store_rows_float_kernel(float* dst, int64_t stride, const float* o, const float* scale, int row0,
                                        int valid_rows) {
  store_rows(dst, stride, read_acc<D>(o), read_rows(scale), row0, valid_rows);
}

template <int D>
void check_store_rows_float(Rng& rng) {
  const int64_t stride = D + 24;  // columns D..stride-1 of a row are not the tile's
  const std::vector<float> o = rng.floats(16 * D, -2, 2), scale = rng.floats(16, 0.1f, 2);
  auto d_o = upload(to_acc(o, D)), dscale = upload(to_rows(scale));
  const int64_t n = 2 * kGuard + kRows * stride;
  DeviceBuffer<float> dst(n);
  for (const auto& [row0, valid] : kCases) {
    SCOPED_TRACE("D " + std::to_string(D) + ", row0 " + std::to_string(row0) + ", valid_rows " + std::to_string(valid));
    dst.poison();
    store_rows_float_kernel<D><<<1, kLanes>>>(dst.get() + kGuard, stride, d_o.get(), dscale.get(), row0, valid);
    finish();
    const std::vector<float> out = dst.download();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = i - kGuard, row = at / stride, col = at % stride;
      const bool written = at >= 0 && row >= row0 && row < row0 + 16 && row < valid && col < D;
      uint32_t bits;
      std::memcpy(&bits, &out[i], sizeof bits);
      if (written)
        ASSERT_EQ(out[i], o[(row - row0) * D + col] * scale[row - row0]) << "dst (" << row << ", " << col << ")";
      else
        ASSERT_EQ(bits, 0xFFFFFFFFu) << "element " << at << " from dst = (" << row << ", " << col
                                     << "), which must stay untouched";
    }
  }
}

TEST(WarpTile, StoreRowsWritesScaledFp32RowsBelowValidRowsOnly) {
  FA_REQUIRE_GPU();
  Rng rng(271);
  check_store_rows_float<64>(rng);
  check_store_rows_float<128>(rng);
}

}  // namespace
}  // namespace fa
