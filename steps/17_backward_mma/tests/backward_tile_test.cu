// The backward's warp-tile vocabulary (device/backward_tile.h) against CPU models of the fragment
// layout, like step 04's tests of the forward's: one warp, seeded random data, register order in
// and out (tests/gpu/warp_tile_model.h), so a misplaced element fails naming its lane, fragment
// and (row, column). The per-query values are per COLUMN here: a warp's rows are its keys.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
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

// ---- exp2_cols: Pᵀ = 2^(c·Sᵀ − lse₂[col]) -------------------------------------------------------

template <int N>
__global__ void exp2_cols_kernel(const float* s, const float* lse2, float* p) {
  __shared__ float cols[N];
  for (int i = lane_id(); i < N; i += kLanes) cols[i] = lse2[i];
  __syncwarp();
  write_acc(p, exp2_cols(read_acc<N>(s), kScaleLog2, cols));
}

template <int N>
void check_exp2_cols(Rng& rng) {
  SCOPED_TRACE("N " + std::to_string(N));
  std::vector<float> s = rng.floats(16 * N, -8, 8), lse2 = rng.floats(N, -1, 2);
  for (size_t i = 0; i < s.size(); i += 7) s[i] = -INFINITY;  // masked scores: exactly 0
  lse2[5] = INFINITY;  // a query that saw no key in the forward: its whole column is 0, not NaN
  auto ds = upload(to_acc(s, N)), dl = upload(lse2);
  DeviceBuffer<float> dp(16 * N);
  dp.poison();
  exp2_cols_kernel<N><<<1, kLanes>>>(ds.get(), dl.get(), dp.get());
  finish();
  expect_acc(dp.download(), N, [&](int row, int col, double* tol) {
    const double x = double(s[row * N + col]) * kScaleLog2 - lse2[col];
    const double want = std::isnan(x) ? 0.0 : std::exp2(x);  // −inf − (+inf) = −inf; never −inf − −inf here
    *tol = kExp2Tol * want;
    return want;
  });
}

TEST(BackwardTile, Exp2ColsIsExp2OfScaledScoreMinusTheColumnsLse) {
  FA_REQUIRE_GPU();
  Rng rng(171);
  check_exp2_cols<16>(rng);
  check_exp2_cols<32>(rng);
  check_exp2_cols<64>(rng);
}

// ---- ds_cols: dSᵀ = Pᵀ ∘ (dPᵀ − D[col]) ---------------------------------------------------------

template <int N>
__global__ void ds_cols_kernel(const float* p, const float* dp, const float* delta, float* ds) {
  __shared__ float cols[N];
  for (int i = lane_id(); i < N; i += kLanes) cols[i] = delta[i];
  __syncwarp();
  write_acc(ds, ds_cols(read_acc<N>(p), read_acc<N>(dp), cols));
}

template <int N>
void check_ds_cols(Rng& rng) {
  SCOPED_TRACE("N " + std::to_string(N));
  const std::vector<float> p = rng.floats(16 * N, 0, 1), dp = rng.floats(16 * N, -3, 3), delta = rng.floats(N, -1, 1);
  auto d_p = upload(to_acc(p, N)), d_dp = upload(to_acc(dp, N)), d_delta = upload(delta);
  DeviceBuffer<float> out(16 * N);
  out.poison();
  ds_cols_kernel<N><<<1, kLanes>>>(d_p.get(), d_dp.get(), d_delta.get(), out.get());
  finish();
  // One subtraction and one product in fp32, the model's own order: bit for bit.
  expect_acc(out.download(), N,
             [&](int row, int col, double*) { return double(p[row * N + col] * (dp[row * N + col] - delta[col])); });
}

TEST(BackwardTile, DsColsIsPTimesDpMinusTheColumnsD) {
  FA_REQUIRE_GPU();
  Rng rng(172);
  check_ds_cols<16>(rng);
  check_ds_cols<32>(rng);
  check_ds_cols<64>(rng);
}

// ---- store_transposed: a warp's (16, N) tile into rows 0..N, columns col0..col0+16 of a tile ------

constexpr int kKeys = 64;  // the (queries, keys) tile's width: four warps of 16 keys

template <int N>
__global__ void store_transposed_kernel(const float* x, int col0, uint16_t* out) {
  using Layout = SwizzledLayout<kKeys>;
  __shared__ uint4 smem[Layout::bytes(N) / 16];
  const SmemTile<N, Layout> tile{reinterpret_cast<bf16*>(smem)};
  uint16_t* raw = reinterpret_cast<uint16_t*>(tile.ptr);
  for (int i = lane_id(); i < N * Layout::kRowElems; i += kLanes) raw[i] = kPoison16;
  __syncwarp();
  store_transposed(tile, read_acc<N>(x), col0);
  __syncwarp();
  for (int i = lane_id(); i < N * kKeys; i += kLanes) out[i] = raw[Layout::offset(i / kKeys, i % kKeys)];
}

template <int N>
void check_store_transposed(Rng& rng) {
  const std::vector<float> x = rng.floats(16 * N, -4, 4);
  auto dx = upload(to_acc(x, N));
  DeviceBuffer<uint16_t> out(N * kKeys);
  for (int col0 : {0, 16, 48}) {
    SCOPED_TRACE("N " + std::to_string(N) + ", col0 " + std::to_string(col0));
    out.poison();
    store_transposed_kernel<N><<<1, kLanes>>>(dx.get(), col0, out.get());
    finish();
    const std::vector<uint16_t> got = out.download();
    for (int row = 0; row < N; ++row)
      for (int col = 0; col < kKeys; ++col) {
        const bool mine = col >= col0 && col < col0 + 16;  // x's row col − col0, column row
        const uint16_t want = mine ? bf16_bits(x[(col - col0) * N + row]) : kPoison16;
        ASSERT_EQ(got[row * kKeys + col], want) << "tile (" << row << ", " << col << ")"
                                                << (mine ? "" : ", which is another warp's and must stay untouched");
      }
  }
}

TEST(BackwardTile, StoreTransposedWritesTheWarpsColumnsOnly) {
  FA_REQUIRE_GPU();
  Rng rng(173);
  check_store_transposed<16>(rng);
  check_store_transposed<32>(rng);
}

// ---- mma_pv_cols: O += P·V[:, c0 .. c0 + C) ------------------------------------------------------

template <int C, int N, int D>
__global__ void mma_pv_cols_kernel(const float* o_in, const float* p, const uint16_t* v, int c0, float* o_out) {
  using Layout = SwizzledLayout<D>;
  __shared__ uint4 smem[Layout::bytes(N) / 16];
  const SmemTile<N, Layout> v_tile{reinterpret_cast<bf16*>(smem)};
  fill_tile(v_tile, v);
  Acc<C> o = read_acc<C>(o_in);
  mma_pv_cols(o, to_bf16(read_acc<N>(p)), v_tile, c0);
  write_acc(o_out, o);
}

template <int C, int N, int D>
void check_mma_pv_cols(Rng& rng) {
  const std::vector<float> o_in = rng.floats(16 * C, -1, 1), p = rng.floats(16 * N, -1, 1);
  const std::vector<uint16_t> v = rng.bf16s(N * D, -1, 1);
  auto d_o = upload(to_acc(o_in, C)), dp = upload(to_acc(p, N));
  auto dv = upload(v);
  DeviceBuffer<float> dout(16 * C);
  for (int c0 = 0; c0 + C <= D; c0 += C) {
    SCOPED_TRACE("C " + std::to_string(C) + ", N " + std::to_string(N) + ", D " + std::to_string(D) + ", c0 " +
                 std::to_string(c0));
    dout.poison();
    mma_pv_cols_kernel<C, N, D><<<1, kLanes>>>(d_o.get(), dp.get(), dv.get(), c0, dout.get());
    finish();
    expect_acc(dout.download(), C, [&](int row, int col, double* tol) {
      double sum = o_in[row * C + col], mag = std::fabs(sum);
      for (int j = 0; j < N; ++j) {
        const double t = double(bf16_float(bf16_bits(p[row * N + j]))) * bf16_float(v[j * D + c0 + col]);
        sum += t;
        mag += std::fabs(t);
      }
      *tol = kMmaTol * mag;
      return sum;
    });
  }
}

TEST(BackwardTile, MmaPvColsTakesItsSliceOfV) {
  FA_REQUIRE_GPU();
  Rng rng(174);
  check_mma_pv_cols<64, 64, 64>(rng);    // D = 64: one warp, the whole width
  check_mma_pv_cols<32, 64, 64>(rng);    // ... or two slices
  check_mma_pv_cols<32, 64, 128>(rng);   // D = 128, four slices of 32: the BLOCK_M = 16 config
  check_mma_pv_cols<128, 64, 128>(rng);  // the whole width
}

// ---- atomic_add_rows: dst[(row0 + r)·stride + col0 + c] += scale·x[r][c], rows < valid_rows -------

// X2: atomic_add_rows_x2, the same sum with two columns per vector atomic (step 21 on).
template <int C, bool X2>
__global__ void atomic_add_rows_kernel(float* dst, int64_t stride, const float* x, float scale, int row0, int col0,
                                       int valid_rows) {
  if constexpr (X2)
    atomic_add_rows_x2(dst, stride, read_acc<C>(x), scale, row0, col0, valid_rows);
  else
    atomic_add_rows(dst, stride, read_acc<C>(x), scale, row0, col0, valid_rows);
}

template <int C, bool X2 = false>
void check_atomic_add_rows(Rng& rng) {
  const int64_t stride = 2 * C + 8;  // columns outside [col0, col0 + C) are not the warp's
  constexpr int kRows = 48;
  const std::vector<float> x = rng.floats(16 * C, -2, 2), base = rng.floats(int(kRows * stride), -1, 1);
  const float scale = 0.125f;  // a power of two: scale·x is exact, so each sum is one fp32 addition
  auto dx = upload(to_acc(x, C));
  DeviceBuffer<float> dst(kRows * stride);
  for (auto [row0, col0, valid] : {std::tuple{0, 0, kRows}, std::tuple{16, C, kRows}, std::tuple{32, 8, 37}}) {
    SCOPED_TRACE("C " + std::to_string(C) + ", row0 " + std::to_string(row0) + ", col0 " + std::to_string(col0) +
                 ", valid rows " + std::to_string(valid));
    dst.upload(base);
    atomic_add_rows_kernel<C, X2><<<1, kLanes>>>(dst.get(), stride, dx.get(), scale, row0, col0, valid);
    finish();
    const std::vector<float> got = dst.download();
    for (int row = 0; row < kRows; ++row)
      for (int col = 0; col < stride; ++col) {
        const bool added = row >= row0 && row < row0 + 16 && row < valid && col >= col0 && col < col0 + C;
        const float want =
            added ? base[row * stride + col] + scale * x[(row - row0) * C + (col - col0)] : base[row * stride + col];
        ASSERT_EQ(got[row * stride + col], want)
            << "dst (" << row << ", " << col << ")" << (added ? "" : ", which must stay untouched");
      }
  }
}

TEST(BackwardTile, AtomicAddRowsAddsTheScaledTileBelowValidRowsOnly) {
  FA_REQUIRE_GPU();
  Rng rng(175);
  check_atomic_add_rows<32>(rng);
  check_atomic_add_rows<64>(rng);
}

TEST(BackwardTile, AtomicAddRowsX2AddsTheSameSumTwoColumnsAtATime) {
  FA_REQUIRE_GPU();
  Rng rng(176);
  check_atomic_add_rows<32, true>(rng);
  check_atomic_add_rows<64, true>(rng);
}

}  // namespace
}  // namespace fa
