// Step 23's two new warp-tile operations (device/backward_tile.h) against the CPU model of the
// fragment layout, as step 17's BackwardTile tests do for the backward's first vocabulary: one warp,
// seeded random data, in both layouts step 23 gives Pᵀ and dSᵀ (64 swizzled columns at BLOCK_M =
// 64, 32 padded ones at BLOCK_M = 32).
//   store_tile_rows  a warp's (16, N) tile into shared memory as it is: Pᵀ and dSᵀ
//   load_a_trans     the A fragments of a tile's transpose: dS for dQ = dS·K, read from dSᵀ
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "device/backward_tile.h"
#include "device/smem_tile.h"
#include "device/warp_tile.h"
#include "harness/device_buffer.h"
#include "tests/gpu/step_suite.h"
#include "tests/gpu/warp_tile_model.h"

namespace fa {
namespace {

using namespace fa::tile_model;

// ---- store_tile_rows: a warp's (16, N) tile into rows row0.., columns col0.. of a tile ----------

template <int N, typename Layout>
__global__ void store_tile_rows_kernel(const float* x, int row0, int col0, uint16_t* out) {
  constexpr int kRows = 32, kCols = Layout::kCols;
  __shared__ uint4 smem[Layout::bytes(kRows) / 16];
  const SmemTile<kRows, Layout> tile{reinterpret_cast<bf16*>(smem)};
  uint16_t* raw = reinterpret_cast<uint16_t*>(tile.ptr);
  for (int i = lane_id(); i < kRows * Layout::kRowElems; i += kLanes) raw[i] = kPoison16;
  __syncwarp();
  store_tile_rows(tile, read_acc<N>(x), row0, col0);
  __syncwarp();
  for (int i = lane_id(); i < kRows * kCols; i += kLanes) out[i] = raw[Layout::offset(i / kCols, i % kCols)];
}

template <int N, typename Layout>
void check_store_tile_rows(Rng& rng) {
  constexpr int kRows = 32, kCols = Layout::kCols;
  const std::vector<float> x = rng.floats(16 * N, -4, 4);
  auto dx = upload(to_acc(x, N));
  DeviceBuffer<uint16_t> out(kRows * kCols);
  for (auto [row0, col0] : {std::pair{0, 0}, {16, 0}, {16, kCols - N}, {0, kCols > N ? 8 : 0}}) {
    SCOPED_TRACE(layout_name<Layout>() + ", N " + std::to_string(N) + ", row0 " + std::to_string(row0) + ", col0 " +
                 std::to_string(col0));
    out.poison();
    store_tile_rows_kernel<N, Layout><<<1, kLanes>>>(dx.get(), row0, col0, out.get());
    finish();
    const std::vector<uint16_t> got = out.download();
    for (int row = 0; row < kRows; ++row)
      for (int col = 0; col < kCols; ++col) {
        const bool mine = row >= row0 && row < row0 + 16 && col >= col0 && col < col0 + N;
        const uint16_t want = mine ? bf16_bits(x[(row - row0) * N + col - col0]) : kPoison16;
        ASSERT_EQ(got[row * kCols + col], want)
            << "tile (" << row << ", " << col << ")" << (mine ? "" : ", outside the warp's block: must stay untouched");
      }
  }
}

TEST(BackwardTile, StoreTileRowsWritesTheWarpsBlockAsItIs) {
  FA_REQUIRE_GPU();
  Rng rng(176);
  check_store_tile_rows<16, SwizzledLayout<64>>(rng);
  check_store_tile_rows<32, SwizzledLayout<64>>(rng);
  check_store_tile_rows<16, PaddedLayout<32>>(rng);
}

// ---- load_a_trans: A fragments of rows col0.. of the transpose of a (K, COLS) tile --------------

template <int K, typename Layout>
__global__ void load_a_trans_kernel(const uint16_t* src, int col0, uint32_t* out) {
  __shared__ uint4 smem[Layout::bytes(K) / 16];
  const SmemTile<K, Layout> tile{reinterpret_cast<bf16*>(smem)};
  fill_tile(tile, src);
  write_frag(out, load_a_trans<K>(tile, col0));
}

template <int K, typename Layout>
void check_load_a_trans(Rng& rng) {
  constexpr int kCols = Layout::kCols;
  const std::vector<uint16_t> x = rng.bf16s(K * kCols, -4, 4);  // X: (K, kCols) row-major
  auto dx = upload(x);
  DeviceBuffer<uint32_t> dout(kLanes * K / 4);
  for (int col0 = 0; col0 < kCols; col0 += 16) {
    SCOPED_TRACE(layout_name<Layout>() + ", K " + std::to_string(K) + ", col0 " + std::to_string(col0));
    dout.poison();
    load_a_trans_kernel<K, Layout><<<1, kLanes>>>(dx.get(), col0, dout.get());
    finish();
    expect_frag(dout.download(), K, [&](int row, int col) { return x[col * kCols + col0 + row]; });  // Xᵀ(row, col)
  }
}

TEST(BackwardTile, LoadATransGivesTheTransposesElementsAtTheAPositions) {
  FA_REQUIRE_GPU();
  Rng rng(177);
  check_load_a_trans<64, SwizzledLayout<64>>(rng);
  check_load_a_trans<128, SwizzledLayout<64>>(rng);
  check_load_a_trans<64, PaddedLayout<32>>(rng);
  check_load_a_trans<128, PaddedLayout<32>>(rng);
}

}  // namespace
}  // namespace fa
