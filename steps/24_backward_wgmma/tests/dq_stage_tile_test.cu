// Step 24's two new operations for dQ (device/backward_tile.h) against a CPU model, as step 23's
// tests do for its operations: seeded random data, poisoned memory around what may be written.
//   store_rows_f32      a warp's (16, C) fp32 tile into rows row0.. of a plain fp32 shared tile
//   atomic_add_tile_x4  a (ROWS, COLS) fp32 shared tile (or the sum of several) added into global
//                       rows, rows at or past valid_rows skipped
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <vector>

#include "device/backward_tile.h"
#include "harness/device_buffer.h"
#include "tests/gpu/step_suite.h"
#include "tests/gpu/warp_tile_model.h"

namespace fa {
namespace {

using namespace fa::tile_model;

// ---- store_rows_f32: the warp's (16, C) tile into rows row0 .. row0 + 15 of a (32, PITCH) tile ---

constexpr float kPoisonF = -12345.0f;  // what the tile holds outside the warp's block

template <int C, int PITCH>
__global__ void store_rows_f32_kernel(const float* x, int row0, float* out) {
  constexpr int kRows = 32;
  __shared__ float tile[kRows * PITCH];
  for (int i = lane_id(); i < kRows * PITCH; i += kLanes) tile[i] = kPoisonF;
  __syncwarp();
  store_rows_f32(tile, PITCH, read_acc<C>(x), row0);
  __syncwarp();
  for (int i = lane_id(); i < kRows * PITCH; i += kLanes) out[i] = tile[i];
}

template <int C, int PITCH>
void check_store_rows_f32(Rng& rng) {
  constexpr int kRows = 32;
  const std::vector<float> x = rng.floats(16 * C, -4, 4);  // the warp's tile, row-major
  auto dx = upload(to_acc(x, C));
  DeviceBuffer<float> out(kRows * PITCH);
  for (int row0 : {0, 16}) {
    std::ostringstream trace;
    trace << "C " << C << ", pitch " << PITCH << ", row0 " << row0;
    SCOPED_TRACE(trace.str());
    store_rows_f32_kernel<C, PITCH><<<1, kLanes>>>(dx.get(), row0, out.get());
    finish();
    const std::vector<float> got = out.download();
    for (int row = 0; row < kRows; ++row)
      for (int col = 0; col < PITCH; ++col) {
        const bool mine = row >= row0 && row < row0 + 16 && col < C;
        const float want = mine ? x[(row - row0) * C + col] : kPoisonF;
        ASSERT_EQ(got[row * PITCH + col], want)
            << "tile (" << row << ", " << col << ")" << (mine ? "" : ", outside the warp's block: must stay untouched");
      }
  }
}

TEST(BackwardTile, StoreRowsF32WritesTheWarpsRowsAsTheyAre) {
  FA_REQUIRE_GPU();
  Rng rng(241);
  check_store_rows_f32<64, 72>(rng);  // step 24's dQ stage: 64 columns, rows of 64 + 8 floats
  check_store_rows_f32<32, 40>(rng);
}

// ---- atomic_add_tile_x4: dst[r·stride + c] += scale · Σ_k tile_k[r·pitch + c], r < valid_rows ----

template <int ROWS, int COLS, int THREADS, int SUMMANDS>
__global__ void atomic_add_tile_kernel(const float* src, int pitch, float* dst, int64_t stride, float scale,
                                       int valid_rows) {
  extern __shared__ float tiles[];  // SUMMANDS × (ROWS, pitch)
  for (int i = int(threadIdx.x); i < SUMMANDS * ROWS * pitch; i += THREADS) tiles[i] = src[i];
  __syncthreads();
  atomic_add_tile_x4<ROWS, COLS, THREADS, SUMMANDS>(dst, stride, tiles, pitch, scale, valid_rows, int(threadIdx.x),
                                                    ROWS * pitch);
}

template <int ROWS, int COLS, int THREADS, int SUMMANDS>
void check_atomic_add_tile(Rng& rng, int valid_rows) {
  constexpr int kPitch = COLS + 8, kStride = COLS + 12;  // dst rows longer than the tile's: a gap each
  constexpr float kScale = 0.125f;                       // a power of two: the CPU's sum is exact
  std::ostringstream trace;
  trace << "(" << ROWS << ", " << COLS << "), " << THREADS << " threads, " << SUMMANDS << " summand(s), valid rows "
        << valid_rows;
  SCOPED_TRACE(trace.str());
  const std::vector<float> src = rng.floats(SUMMANDS * ROWS * kPitch, -4, 4);
  const std::vector<float> before = rng.floats(ROWS * kStride, -1, 1);  // what dst holds already
  auto dsrc = upload(src);
  auto ddst = upload(before);
  atomic_add_tile_kernel<ROWS, COLS, THREADS, SUMMANDS><<<1, THREADS, SUMMANDS * ROWS * kPitch * sizeof(float)>>>(
      dsrc.get(), kPitch, ddst.get(), kStride, kScale, valid_rows);
  finish();
  const std::vector<float> got = ddst.download();
  for (int row = 0; row < ROWS; ++row)
    for (int col = 0; col < kStride; ++col) {
      float want = before[row * kStride + col];
      if (row < valid_rows && col < COLS) {
        float sum = 0.0f;  // in the kernel's order: summand 0, then 1, ...
        for (int k = 0; k < SUMMANDS; ++k) sum += src[(k * ROWS + row) * kPitch + col];
        want += kScale * sum;
      }
      ASSERT_EQ(got[row * kStride + col], want)
          << "dst (" << row << ", " << col << ")"
          << (row < valid_rows && col < COLS ? "" : ": a skipped row or a gap, must stay as it was");
    }
}

TEST(BackwardTile, AtomicAddTileX4AddsTheScaledTileIntoValidRowsOnly) {
  FA_REQUIRE_GPU();
  Rng rng(242);
  check_atomic_add_tile<64, 64, 128, 1>(rng, 64);  // step 24 at D = 128: one warpgroup's product
  check_atomic_add_tile<64, 64, 128, 1>(rng, 37);  // the ragged last Q tile
  check_atomic_add_tile<64, 64, 256, 2>(rng, 64);  // step 24 at D = 64: the sum of both warpgroups'
  check_atomic_add_tile<64, 64, 256, 2>(rng, 5);
}

}  // namespace
}  // namespace fa
