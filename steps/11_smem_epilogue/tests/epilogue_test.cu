// The epilogue of step 11: stage_rows (device/warp_tile.h) puts a warp's two row tiles of O,
// scaled per row and rounded to bf16, into a swizzled shared-memory tile, and copy_rows_out
// (device/smem_tile.h) writes them to global memory in 16-byte chunks. One warp, D = 64 and 128,
// a row stride wider than D (the gap must stay poisoned) and a row count that ends inside the
// warp's 32 rows (rows past it must stay poisoned). Every value is an integer times a power of
// two, exact in bf16, so any misplaced element fails by its exact position.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "device/ptx/mma.h"
#include "device/smem_tile.h"
#include "device/warp_tile.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

using namespace fa::tile;

constexpr int kRows = 32;  // one warp's rows: two 16-row mma tiles
constexpr uint16_t kPoison16 = 0xFFFF;

FA_HD float value(int row, int col) {
  return float((row * 7 + col * 3) % 61 + 1);
}
FA_HD float row_scale(int row) {
  return 1.0f / float(1 << (row % 4));
}

template <int D>
__global__ void epilogue_kernel(bf16* out, int64_t stride, int valid_rows) {
  __shared__ __align__(128) bf16 smem[kRows * D];
  const SmemTile<kRows, SwizzledLayout<D>> tile{smem};
  const int lane = int(threadIdx.x);
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    Acc<D> o;
#pragma unroll
    for (int f = 0; f < D / 8; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) o.c[f][e] = value(16 * t + ptx::mma_c_row(lane, e), 8 * f + ptx::mma_c_col(lane, e));
    const Rows scale{{row_scale(16 * t + rows_row(lane, 0)), row_scale(16 * t + rows_row(lane, 1))}};
    stage_rows(tile, o, scale, 16 * t);
  }
  __syncwarp();
  copy_rows_out<kRows>(tile, 0, out, stride, valid_rows);
}

template <int D>
void check(int64_t stride, int valid_rows) {
  DeviceBuffer<uint16_t> out(size_t(kRows) * stride);
  out.poison();
  epilogue_kernel<D><<<1, 32>>>(reinterpret_cast<bf16*>(out.get()), stride, valid_rows);
  FA_CUDA_CHECK(cudaGetLastError());
  const std::vector<uint16_t> got = out.download();
  for (int row = 0; row < kRows; ++row)
    for (int col = 0; col < stride; ++col) {
      const uint16_t g = got[size_t(row) * stride + col];
      if (row < valid_rows && col < D) {
        const float want = value(row, col) * row_scale(row);  // exact in bf16
        ASSERT_EQ(std::bit_cast<float>(uint32_t(g) << 16), want) << "D=" << D << " row " << row << " col " << col;
      } else {
        ASSERT_EQ(g, kPoison16) << "D=" << D << " row " << row << " col " << col << " was written"
                                << (row >= valid_rows ? " (past the valid rows)" : " (in the gap between rows)");
      }
    }
}

TEST(SmemEpilogue, StagesAndCopiesOutEveryRow_D64) {
  FA_REQUIRE_GPU();
  check<64>(64 + 24, kRows);
}
TEST(SmemEpilogue, StagesAndCopiesOutEveryRow_D128) {
  FA_REQUIRE_GPU();
  check<128>(128 + 40, kRows);
}
TEST(SmemEpilogue, StopsAtTheLastValidRow) {
  FA_REQUIRE_GPU();
  check<64>(64, 19);
  check<128>(128 + 8, 5);
  check<128>(128, 0);
}

}  // namespace
}  // namespace fa
