// Step 26's way for dQ to reach its accumulator, against a CPU model: four warps (one warpgroup)
// store their (16, 64) rows of a (64, 64) fp32 product, times a scale, into the swizzled stage
// (store_rows_f32_swizzled), and one thread has the copy engine add the stage's two (64, 32) boxes
// into a (planes, N, D) fp32 array through make_accum_map's tensor map (tma_reduce_add_3d).
// The array starts with random values; the box lands at a column panel, a row and a plane that
// are not the origin, and its last rows reach past N. Every element must then be exactly its old
// value plus the scaled product where the box lands and N clips nothing, and its old value
// everywhere else: a wrong swizzle moves values between columns, a wrong box offset between
// column halves, a missing clip writes into the next plane.
#include <cuda.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <vector>

#include "device/backward_tile.h"
#include "device/ptx/sm90.h"
#include "device/ptx/tma.h"
#include "harness/device_buffer.h"
#include "library/tma.h"
#include "tests/gpu/step_suite.h"
#include "tests/gpu/warp_tile_model.h"

namespace fa {
namespace {

using namespace fa::tile_model;

constexpr int kRows = 64, kCols = 64;  // one warpgroup's product of dQ, as step 26 stages it

// x: four warps' (16, 64) tiles in Acc register order, warp w's at w · 16 · 64.
__global__ void stage_and_reduce_kernel(const float* x, float scale, const __grid_constant__ CUtensorMap map, int col0,
                                        int row0, int plane) {
  __shared__ __align__(1024) float stage[kRows * kCols];  // two (64, 32) boxes
  const int warp = int(threadIdx.x) / 32;
  tile::store_rows_f32_swizzled<kRows>(stage, read_acc<kCols>(x + warp * 16 * kCols), 16 * warp, scale);
  ptx::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int box = 0; box < 2; ++box)
      ptx::tma_reduce_add_3d(&map, col0 + 32 * box, row0, plane,
                             uint32_t(__cvta_generic_to_shared(stage + box * kRows * 32)));
    ptx::bulk_commit_group();
    ptx::bulk_wait_group<0>();
  }
}

void check_stage_and_reduce(Rng& rng, int planes, int n, int d, int col0, int row0, int plane) {
  std::ostringstream trace;
  trace << "array (" << planes << ", " << n << ", " << d << "), box at column " << col0 << ", row " << row0
        << ", plane " << plane;
  SCOPED_TRACE(trace.str());
  constexpr float kScale = 0.25f;  // a power of two: scale · x is exact, one rounding in the add
  const std::vector<float> product = rng.floats(kRows * kCols, -4, 4);  // row-major (64, 64)
  std::vector<float> raw;                                               // the four warps' Acc tiles
  for (int w = 0; w < 4; ++w) {
    const std::vector<float> rows(product.begin() + w * 16 * kCols, product.begin() + (w + 1) * 16 * kCols);
    const std::vector<float> acc = to_acc(rows, kCols);
    raw.insert(raw.end(), acc.begin(), acc.end());
  }
  const std::vector<float> before = rng.floats(planes * n * d, -1, 1);
  auto dx = upload(raw);
  auto darray = upload(before);
  CUtensorMap map;
  const Status st = make_accum_map(&map, darray.get(), planes, n, d, kRows);
  ASSERT_TRUE(st.ok()) << st.message();
  stage_and_reduce_kernel<<<1, 128>>>(dx.get(), kScale, map, col0, row0, plane);
  finish();
  const std::vector<float> got = darray.download();
  for (int p = 0; p < planes; ++p)
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < d; ++c) {
        const int i = (p * n + r) * d + c;
        const bool inside = p == plane && r >= row0 && r < row0 + kRows && c >= col0 && c < col0 + kCols;
        const float want = inside ? before[i] + kScale * product[(r - row0) * kCols + (c - col0)] : before[i];
        ASSERT_EQ(got[i], want) << "plane " << p << ", row " << r << ", column " << c
                                << (inside ? "" : ": outside the box (or clipped), must stay as it was");
      }
}

TEST(BackwardTile, StoreRowsF32SwizzledThenBulkReduceAddsTheScaledProduct) {
  FA_REQUIRE_SM90A();
  Rng rng(261);
  check_stage_and_reduce(rng, 3, 192, 128, 64, 64, 1);  // D = 128: the second column panel, whole rows
  check_stage_and_reduce(rng, 3, 100, 128, 0, 64, 1);   // rows 100..127 past N: clipped, plane 2 untouched
  check_stage_and_reduce(rng, 2, 70, 64, 0, 0, 1);      // D = 64, the last plane, rows 70.. clipped
}

}  // namespace
}  // namespace fa
