// The warp-tile vocabulary (device/warp_tile.h) and the shared-memory tiles (device/smem_tile.h)
// against CPU models of the documented layouts. Each test runs one warp (one block for the
// block-wide copies) on seeded random data. The kernels only move tiles between global memory and
// registers in register order; where each register sits in the (row, col) tile is decided on the
// host, from mma_c_row/col, mma_a_row/col and "Rows = rows g and g + 8", so a misplaced element, a
// factor applied to the wrong row or a missed mask fails naming its lane, fragment and position.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "device/mask.h"
#include "device/ptx/cp_async.h"
#include "device/ptx/ldmatrix.h"
#include "device/ptx/mma.h"
#include "device/smem_tile.h"
#include "device/warp_tile.h"
#include "tests/gpu/step_suite.h"
#include "tests/gpu/warp_tile_model.h"

namespace fa {
namespace {

using namespace fa::ptx;
using namespace fa::tile;

// The CPU models, the register orders and the tile helpers: tests/gpu/warp_tile_model.h.
using namespace fa::tile_model;

// ---- load_a -------------------------------------------------------------------------------------

constexpr int kQRows = 32;  // two warps' rows: row0 = 16 checks the offset into the tile

template <int K, typename Layout>
__global__ void load_a_kernel(const uint16_t* src, int row0, uint32_t* out) {
  __shared__ uint4 smem[Layout::bytes(kQRows) / 16];
  const SmemTile<kQRows, Layout> tile{reinterpret_cast<bf16*>(smem)};
  fill_tile(tile, src);
  write_frag(out, load_a<K>(tile, row0));
}

template <int K, typename Layout>
void check_load_a(Rng& rng) {
  const std::vector<uint16_t> tile = rng.bf16s(kQRows * K, -4, 4);
  auto dtile = upload(tile);
  DeviceBuffer<uint32_t> dout(kLanes * K / 4);
  for (int row0 : {0, 16}) {
    SCOPED_TRACE(layout_name<Layout>() + ", row0 " + std::to_string(row0));
    dout.poison();
    load_a_kernel<K, Layout><<<1, kLanes>>>(dtile.get(), row0, dout.get());
    finish();
    expect_frag(dout.download(), K, [&](int row, int col) { return tile[(row0 + row) * K + col]; });
  }
}

TEST(WarpTile, LoadAGivesTheTileElementsAtTheAPositions) {
  FA_REQUIRE_GPU();
  Rng rng(101);
  check_load_a<64, PaddedLayout<64>>(rng);
  check_load_a<128, PaddedLayout<128>>(rng);
  check_load_a<64, SwizzledLayout<64>>(rng);
  check_load_a<128, SwizzledLayout<128>>(rng);
}

// ---- mma_qk -------------------------------------------------------------------------------------

template <int D, int N, typename Layout>
__global__ void mma_qk_kernel(const uint16_t* q, const uint16_t* k, float* s) {
  __shared__ uint4 smem[(Layout::bytes(16) + Layout::bytes(N)) / 16];
  const SmemTile<16, Layout> q_tile{reinterpret_cast<bf16*>(smem)};
  const SmemTile<N, Layout> k_tile{q_tile.ptr + 16 * Layout::kRowElems};
  fill_tile(q_tile, q);
  fill_tile(k_tile, k);
  write_acc(s, mma_qk(load_a<D>(q_tile, 0), k_tile));
}

template <int D, int N, typename Layout>
void check_mma_qk(Rng& rng) {
  SCOPED_TRACE(layout_name<Layout>() + ", N " + std::to_string(N));
  const std::vector<uint16_t> q = rng.bf16s(16 * D, -1, 1), k = rng.bf16s(N * D, -1, 1);
  auto dq = upload(q), dk = upload(k);
  DeviceBuffer<float> ds(16 * N);
  ds.poison();
  mma_qk_kernel<D, N, Layout><<<1, kLanes>>>(dq.get(), dk.get(), ds.get());
  finish();
  expect_acc(ds.download(), N, [&](int row, int col, double* tol) { return qk_model(q, k, D, row, col, tol); });
}

TEST(WarpTile, MmaQkIsQTimesKTransposed) {
  FA_REQUIRE_GPU();
  Rng rng(102);
  check_mma_qk<64, 64, PaddedLayout<64>>(rng);
  check_mma_qk<64, 128, PaddedLayout<64>>(rng);
  check_mma_qk<128, 64, PaddedLayout<128>>(rng);
  check_mma_qk<128, 128, PaddedLayout<128>>(rng);
  check_mma_qk<64, 64, SwizzledLayout<64>>(rng);
  check_mma_qk<64, 128, SwizzledLayout<64>>(rng);
  check_mma_qk<128, 64, SwizzledLayout<128>>(rng);
  check_mma_qk<128, 128, SwizzledLayout<128>>(rng);
}

// ---- mma_pv (with to_bf16 making its P) ---------------------------------------------------------

template <int D, int N, typename Layout>
__global__ void mma_pv_kernel(const float* o_in, const float* p, const uint16_t* v, float* o_out) {
  __shared__ uint4 smem[Layout::bytes(N) / 16];
  const SmemTile<N, Layout> v_tile{reinterpret_cast<bf16*>(smem)};
  fill_tile(v_tile, v);
  Acc<D> o = read_acc<D>(o_in);
  mma_pv(o, to_bf16(read_acc<N>(p)), v_tile);
  write_acc(o_out, o);
}

template <int D, int N, typename Layout>
void check_mma_pv(Rng& rng) {
  SCOPED_TRACE(layout_name<Layout>() + ", N " + std::to_string(N));
  const std::vector<float> o_in = rng.floats(16 * D, -1, 1), p = rng.floats(16 * N, 0, 1);
  const std::vector<uint16_t> v = rng.bf16s(N * D, -1, 1);
  auto d_o = upload(to_acc(o_in, D)), dp = upload(to_acc(p, N));
  auto dv = upload(v);
  DeviceBuffer<float> dout(16 * D);
  dout.poison();
  mma_pv_kernel<D, N, Layout><<<1, kLanes>>>(d_o.get(), dp.get(), dv.get(), dout.get());
  finish();
  expect_acc(dout.download(), D,
             [&](int row, int col, double* tol) { return pv_model(o_in, p, v, D, N, row, col, tol); });
}

TEST(WarpTile, MmaPvAddsPTimesV) {
  FA_REQUIRE_GPU();
  Rng rng(103);
  check_mma_pv<64, 128, PaddedLayout<64>>(rng);
  check_mma_pv<128, 64, PaddedLayout<128>>(rng);
  check_mma_pv<64, 128, SwizzledLayout<64>>(rng);
  check_mma_pv<128, 64, SwizzledLayout<128>>(rng);
}

// ---- mma_qk_tiles and mma_pv_tiles (step 09: two row tiles per warp share each K/V fragment) -----

constexpr int kRowTiles = 2;

template <int D, int N, typename Layout>
__global__ void mma_qk_tiles_kernel(const uint16_t* q, const uint16_t* k, float* s) {
  __shared__ uint4 smem[(Layout::bytes(16 + 16 * kRowTiles) + Layout::bytes(N)) / 16];
  const SmemTile<16 + 16 * kRowTiles, Layout> q_tile{reinterpret_cast<bf16*>(smem)};  // row0 = 16 below
  const SmemTile<N, Layout> k_tile{q_tile.ptr + (16 + 16 * kRowTiles) * Layout::kRowElems};
  fill_tile(q_tile, q);
  fill_tile(k_tile, k);
  Acc<N> st[kRowTiles];
  mma_qk_tiles(st, q_tile, 16, k_tile);
  for (int t = 0; t < kRowTiles; ++t) write_acc(s + t * 16 * N, st[t]);
}

template <int D, int N, typename Layout>
void check_mma_qk_tiles(Rng& rng) {
  constexpr int kRows = 16 + 16 * kRowTiles;
  const std::vector<uint16_t> q = rng.bf16s(kRows * D, -1, 1), k = rng.bf16s(N * D, -1, 1);
  auto dq = upload(q), dk = upload(k);
  DeviceBuffer<float> ds(kRowTiles * 16 * N);
  ds.poison();
  mma_qk_tiles_kernel<D, N, Layout><<<1, kLanes>>>(dq.get(), dk.get(), ds.get());
  finish();
  const std::vector<float> all = ds.download();
  for (int t = 0; t < kRowTiles; ++t) {
    SCOPED_TRACE(layout_name<Layout>() + ", N " + std::to_string(N) + ", row tile " + std::to_string(t));
    const std::vector<float> got(all.begin() + t * 16 * N, all.begin() + (t + 1) * 16 * N);
    // Rows of tile t, starting at row0 = 16.
    expect_acc(got, N, [&](int row, int col, double* tol) { return qk_model(q, k, D, 16 + 16 * t + row, col, tol); });
  }
}

TEST(WarpTile, MmaQkTilesIsQTimesKTransposedForEveryRowTile) {
  FA_REQUIRE_GPU();
  Rng rng(121);
  check_mma_qk_tiles<64, 64, SwizzledLayout<64>>(rng);
  check_mma_qk_tiles<64, 128, SwizzledLayout<64>>(rng);
  check_mma_qk_tiles<128, 32, SwizzledLayout<128>>(rng);
  check_mma_qk_tiles<128, 64, SwizzledLayout<128>>(rng);
  check_mma_qk_tiles<64, 64, PaddedLayout<64>>(rng);
}

template <int D, int N, typename Layout>
__global__ void mma_pv_tiles_kernel(const float* o_in, const float* p, const uint16_t* v, float* o_out) {
  __shared__ uint4 smem[Layout::bytes(N) / 16];
  const SmemTile<N, Layout> v_tile{reinterpret_cast<bf16*>(smem)};
  fill_tile(v_tile, v);
  Acc<D> o[kRowTiles];
  FragA<N> pt[kRowTiles];
  for (int t = 0; t < kRowTiles; ++t) {
    o[t] = read_acc<D>(o_in + t * 16 * D);
    pt[t] = to_bf16(read_acc<N>(p + t * 16 * N));
  }
  mma_pv_tiles(o, pt, v_tile);
  for (int t = 0; t < kRowTiles; ++t) write_acc(o_out + t * 16 * D, o[t]);
}

template <int D, int N, typename Layout>
void check_mma_pv_tiles(Rng& rng) {
  std::vector<float> o_raw, p_raw, o_in, p;
  for (int t = 0; t < kRowTiles; ++t) {
    const std::vector<float> ot = rng.floats(16 * D, -1, 1), pt = rng.floats(16 * N, 0, 1);
    const std::vector<float> ot_acc = to_acc(ot, D), pt_acc = to_acc(pt, N);
    o_in.insert(o_in.end(), ot.begin(), ot.end());
    p.insert(p.end(), pt.begin(), pt.end());
    o_raw.insert(o_raw.end(), ot_acc.begin(), ot_acc.end());
    p_raw.insert(p_raw.end(), pt_acc.begin(), pt_acc.end());
  }
  const std::vector<uint16_t> v = rng.bf16s(N * D, -1, 1);
  auto d_o = upload(o_raw), dp = upload(p_raw);
  auto dv = upload(v);
  DeviceBuffer<float> dout(kRowTiles * 16 * D);
  dout.poison();
  mma_pv_tiles_kernel<D, N, Layout><<<1, kLanes>>>(d_o.get(), dp.get(), dv.get(), dout.get());
  finish();
  const std::vector<float> all = dout.download();
  for (int t = 0; t < kRowTiles; ++t) {
    SCOPED_TRACE(layout_name<Layout>() + ", N " + std::to_string(N) + ", row tile " + std::to_string(t));
    const std::vector<float> got(all.begin() + t * 16 * D, all.begin() + (t + 1) * 16 * D);
    expect_acc(got, D,
               [&](int row, int col, double* tol) { return pv_model(o_in, p, v, D, N, t * 16 + row, col, tol); });
  }
}

TEST(WarpTile, MmaPvTilesAddsPTimesVForEveryRowTile) {
  FA_REQUIRE_GPU();
  Rng rng(122);
  check_mma_pv_tiles<64, 64, SwizzledLayout<64>>(rng);
  check_mma_pv_tiles<128, 32, SwizzledLayout<128>>(rng);
  check_mma_pv_tiles<128, 64, SwizzledLayout<128>>(rng);
  check_mma_pv_tiles<64, 128, PaddedLayout<64>>(rng);
}

// ---- to_bf16 ------------------------------------------------------------------------------------

template <int N>
__global__ void to_bf16_kernel(const float* p, uint32_t* out) {
  write_frag(out, to_bf16(read_acc<N>(p)));
}

template <int N>
void check_to_bf16(Rng& rng) {
  SCOPED_TRACE("N " + std::to_string(N));
  std::vector<float> p = rng.floats(16 * N, -4, 4);
  // Every third value exactly halfway between two bf16: only round-half-to-even gets all of them.
  for (size_t i = 0; i < p.size(); i += 3)
    p[i] = std::bit_cast<float>((std::bit_cast<uint32_t>(p[i]) & 0xFFFF0000u) | 0x8000u);
  auto dp = upload(to_acc(p, N));
  DeviceBuffer<uint32_t> dout(kLanes * N / 4);
  dout.poison();
  to_bf16_kernel<N><<<1, kLanes>>>(dp.get(), dout.get());
  finish();
  expect_frag(dout.download(), N, [&](int row, int col) { return bf16_bits(p[row * N + col]); });
}

TEST(WarpTile, ToBf16RoundsAccumulatorsIntoAFragments) {
  FA_REQUIRE_GPU();
  Rng rng(104);
  check_to_bf16<64>(rng);
  check_to_bf16<128>(rng);
}

// ---- apply_mask ---------------------------------------------------------------------------------

template <int N, typename Mask>
__global__ void apply_mask_kernel(const float* s_in, int row0, int col0, Mask mask, float* s_out) {
  Acc<N> s = read_acc<N>(s_in);
  apply_mask(s, row0, col0, mask);
  write_acc(s_out, s);
}

// Returns how many of the 16 rows the mask hides entirely (the callers check their case has some).
template <int N, typename Mask>
int check_apply_mask(Rng& rng, int row0, int col0, Mask mask, const std::string& what) {
  SCOPED_TRACE(what + ", row0 " + std::to_string(row0) + ", col0 " + std::to_string(col0));
  const std::vector<float> s = rng.floats(16 * N, -8, 8);
  int hidden = 0, full_rows = 0;
  for (int row = 0; row < 16; ++row) {
    int row_hidden = 0;
    for (int col = 0; col < N; ++col) row_hidden += !mask(row0 + row, col0 + col);
    hidden += row_hidden;
    full_rows += row_hidden == N;
  }
  EXPECT_GT(hidden, 0) << "the case masks nothing";
  EXPECT_LT(hidden, 16 * N) << "the case masks everything";
  auto ds = upload(to_acc(s, N));
  DeviceBuffer<float> dout(16 * N);
  dout.poison();
  apply_mask_kernel<N, Mask><<<1, kLanes>>>(ds.get(), row0, col0, mask, dout.get());
  finish();
  expect_acc(dout.download(), N, [&](int row, int col, double*) {
    return mask(row0 + row, col0 + col) ? double(s[row * N + col]) : -INFINITY;
  });
  return full_rows;
}

TEST(WarpTile, ApplyMaskHidesExactlyTheMaskedScores) {
  FA_REQUIRE_GPU();
  Rng rng(105);
  check_apply_mask<64>(rng, 5, 64, KeyBound{64 + 37}, "KeyBound, keys past 101");
  check_apply_mask<128>(rng, 200, 128, KeyBound{128 + 77}, "KeyBound, keys past 205");
  // Rows 50..59 see no key at or past 60; rows 60..65 see some.
  EXPECT_EQ(check_apply_mask<64>(rng, 50, 60, CausalMask{1000, true, 0}, "causal, offset 0"), 10);
  // Rows 13..22 see keys up to 50..59, none of the tile's; rows 23..28 see some of the three keys
  // (60..62) that exist.
  EXPECT_EQ(check_apply_mask<64>(rng, 13, 60, CausalMask{63, true, 37}, "causal, offset 37, keys past 63"), 10);
  check_apply_mask<64>(rng, 0, 64, CausalMask{100, false, 0}, "causal off, keys past 100");
}

// ---- row_max ------------------------------------------------------------------------------------

template <int N>
__global__ void row_max_kernel(const float* s, const float* m, float* out) {
  write_rows(out, row_max(read_acc<N>(s), read_rows(m)));
}

template <int N>
void check_row_max(Rng& rng) {
  SCOPED_TRACE("N " + std::to_string(N));
  std::vector<float> s = rng.floats(16 * N, -8, 8), m(16);
  for (int r = 0; r < 16; ++r) m[r] = r % 2 ? rng.uniform(-8, 4) : -INFINITY;
  // Rows 2 and 13: every key masked; row 2 keeps m = -inf, row 13 a max from an earlier tile.
  for (int col = 0; col < N; ++col) s[2 * N + col] = s[13 * N + col] = -INFINITY;
  m[13] = 1.5f;
  m[7] = 20.0f;                                                      // above every score
  for (int col = 0; col < N; col += 3) s[11 * N + col] = -INFINITY;  // some keys masked
  s[14 * N + N - 1] = 9.0f;                                          // the max in lane t = 3's last column
  auto ds = upload(to_acc(s, N)), dm = upload(to_rows(m));
  DeviceBuffer<float> dout(2 * kLanes);
  dout.poison();
  row_max_kernel<N><<<1, kLanes>>>(ds.get(), dm.get(), dout.get());
  finish();
  expect_rows(dout.download(), [&](int, int row, double*) {
    float want = m[row];
    for (int col = 0; col < N; ++col) want = std::fmax(want, s[row * N + col]);
    return double(want);
  });
}

TEST(WarpTile, RowMaxIsTheMaxOverTheWholeRowAndTheRunningMax) {
  FA_REQUIRE_GPU();
  Rng rng(106);
  check_row_max<64>(rng);
  check_row_max<128>(rng);
}

// ---- row_sum + quad_sum -------------------------------------------------------------------------

template <int N>
__global__ void row_sum_kernel(const float* p, const float* x, float* partial, float* full, float* quad) {
  const Rows l = row_sum(read_acc<N>(p));
  write_rows(partial, l);
  write_rows(full, quad_sum(l));
  write_rows(quad, quad_sum(read_rows(x)));
}

template <int N>
void check_row_sum(Rng& rng) {
  SCOPED_TRACE("N " + std::to_string(N));
  const std::vector<float> p = rng.floats(16 * N, 0, 1), x = rng.floats(2 * kLanes, -1, 1);
  auto dp = upload(to_acc(p, N)), dx = upload(x);
  DeviceBuffer<float> dpartial(2 * kLanes), dfull(2 * kLanes), dquad(2 * kLanes);
  dpartial.poison();
  dfull.poison();
  dquad.poison();
  row_sum_kernel<N><<<1, kLanes>>>(dp.get(), dx.get(), dpartial.get(), dfull.get(), dquad.get());
  finish();
  {
    SCOPED_TRACE("row_sum: the lane's columns 8f + 2t, 8f + 2t + 1");
    expect_rows(dpartial.download(), [&](int lane, int row, double* tol) {
      double sum = 0;
      for (int f = 0; f < N / 8; ++f)
        sum += double(p[row * N + 8 * f + 2 * (lane % 4)]) + p[row * N + 8 * f + 2 * (lane % 4) + 1];
      *tol = 1e-5 * sum;
      return sum;
    });
  }
  {
    SCOPED_TRACE("quad_sum(row_sum): the whole row, in all four lanes of the quad");
    expect_rows(dfull.download(), [&](int, int row, double* tol) {
      double sum = 0;
      for (int col = 0; col < N; ++col) sum += p[row * N + col];
      *tol = 1e-5 * sum;
      return sum;
    });
  }
  {
    SCOPED_TRACE("quad_sum: the four lanes' own values");
    expect_rows(dquad.download(), [&](int lane, int row, double* tol) {
      const int r = row / 8;
      double sum = 0, mag = 0;
      for (int j = 0; j < 4; ++j) {
        sum += x[2 * ((lane / 4) * 4 + j) + r];
        mag += std::fabs(x[2 * ((lane / 4) * 4 + j) + r]);
      }
      *tol = 1e-6 * mag;
      return sum;
    });
  }
}

TEST(WarpTile, RowSumPartialsAndQuadSumTotals) {
  FA_REQUIRE_GPU();
  Rng rng(107);
  check_row_sum<64>(rng);
  check_row_sum<128>(rng);
}

// ---- the per-row operations: exp2_offset, rescale_factor, log_sum_exp, safe_inverse -------------

enum class RowsOp { kExp2Offset, kRescaleFactor, kLogSumExp, kSafeInverse };

__global__ void rows_op_kernel(RowsOp op, const float* a, const float* b, float scale_log2, float* out) {
  const Rows x = read_rows(a), y = read_rows(b);
  Rows r = rows(0.0f);
  switch (op) {
    case RowsOp::kExp2Offset:
      r = exp2_offset(x, scale_log2);
      break;
    case RowsOp::kRescaleFactor:
      r = rescale_factor(x, scale_log2, y);
      break;
    case RowsOp::kLogSumExp:
      r = log_sum_exp(x, y, scale_log2);
      break;
    case RowsOp::kSafeInverse:
      r = safe_inverse(x);
      break;
  }
  write_rows(out, r);
}

// op on one value per row (a, and b where the op takes two), every lane's result.
std::vector<float> run_rows_op(RowsOp op, const std::vector<float>& a, const std::vector<float>& b) {
  auto da = upload(to_rows(a)), db = upload(to_rows(b));
  DeviceBuffer<float> dout(2 * kLanes);
  dout.poison();
  rows_op_kernel<<<1, kLanes>>>(op, da.get(), db.get(), kScaleLog2, dout.get());
  finish();
  return dout.download();
}

TEST(WarpTile, Exp2OffsetIsScaledMaxAndZeroForMinusInf) {
  FA_REQUIRE_GPU();
  Rng rng(108);
  std::vector<float> m = rng.floats(16, -8, 8);
  m[0] = m[9] = m[15] = -INFINITY;
  expect_rows(run_rows_op(RowsOp::kExp2Offset, m, m),
              [&](int, int row, double*) { return m[row] == -INFINITY ? 0.0 : double(m[row] * kScaleLog2); });
}

TEST(WarpTile, RescaleFactorIsExp2OfTheMaxStep) {
  FA_REQUIRE_GPU();
  Rng rng(109);
  std::vector<float> m_old = rng.floats(16, -8, 8), offset(16);
  m_old[0] = m_old[9] = m_old[12] = -INFINITY;  // the first tile: alpha = 0
  // The new max: up to 3 higher, the first finite one for rows 0 and 9, unchanged in row 5
  // (alpha = 1), still -inf in row 12 (offset 0, alpha = 0).
  for (int r = 0; r < 16; ++r) {
    float m_new = (r == 0 || r == 9 ? 0.0f : m_old[r]) + rng.uniform(0, 3);
    if (r == 5 || r == 12) m_new = m_old[r];
    offset[r] = m_new == -INFINITY ? 0.0f : m_new * kScaleLog2;  // exp2_offset(m_new)
  }
  expect_rows(run_rows_op(RowsOp::kRescaleFactor, m_old, offset), [&](int, int row, double* tol) {
    const double want = std::exp2(double(m_old[row]) * kScaleLog2 - offset[row]);
    *tol = kExp2Tol * want;
    return want;
  });
}

TEST(WarpTile, LogSumExpIsScaledMaxPlusLogSumAndMinusInfForAnEmptyRow) {
  FA_REQUIRE_GPU();
  Rng rng(110);
  std::vector<float> m = rng.floats(16, -8, 8), l = rng.floats(16, 0.5f, 64);
  m[3] = -INFINITY;  // a row that saw no key
  l[3] = 0;
  l[12] = 0;
  expect_rows(run_rows_op(RowsOp::kLogSumExp, m, l), [&](int, int row, double* tol) {
    if (l[row] == 0) return -double(INFINITY);
    const double want = double(m[row]) * kScaleLog2 * std::log(2.0) + std::log(double(l[row]));
    *tol = 2e-6 * std::fmax(1.0, std::fabs(want));
    return want;
  });
}

TEST(WarpTile, SafeInverseIsOneOverLAndZeroForZero) {
  FA_REQUIRE_GPU();
  Rng rng(111);
  std::vector<float> l = rng.floats(16, 0.01f, 100);
  l[4] = l[13] = 0;
  expect_rows(run_rows_op(RowsOp::kSafeInverse, l, l), [&](int, int row, double* tol) {
    const double want = l[row] > 0 ? 1.0 / l[row] : 0.0;
    *tol = 2.5e-7 * want;
    return want;
  });
}

// ---- exp2_rows ----------------------------------------------------------------------------------

template <int N>
__global__ void exp2_rows_kernel(const float* s, const float* offset, float* p) {
  write_acc(p, exp2_rows(read_acc<N>(s), kScaleLog2, read_rows(offset)));
}

template <int N>
void check_exp2_rows(Rng& rng) {
  SCOPED_TRACE("N " + std::to_string(N));
  std::vector<float> s = rng.floats(16 * N, -8, 8), offset(16);
  for (size_t i = 0; i < s.size(); i += 7) s[i] = -INFINITY;  // masked scores: exactly 0
  for (int col = 0; col < N; ++col) s[6 * N + col] = -INFINITY;
  for (int r = 0; r < 16; ++r) {
    float m = -INFINITY;
    for (int col = 0; col < N; ++col) m = std::fmax(m, s[r * N + col]);
    offset[r] = m == -INFINITY ? 0.0f : m * kScaleLog2;  // row 6 saw no key
  }
  auto ds = upload(to_acc(s, N)), doff = upload(to_rows(offset));
  DeviceBuffer<float> dp(16 * N);
  dp.poison();
  exp2_rows_kernel<N><<<1, kLanes>>>(ds.get(), doff.get(), dp.get());
  finish();
  expect_acc(dp.download(), N, [&](int row, int col, double* tol) {
    const double want = std::exp2(double(s[row * N + col]) * kScaleLog2 - offset[row]);
    *tol = kExp2Tol * want;
    return want;
  });
}

TEST(WarpTile, Exp2RowsIsExp2OfScaledScoreMinusRowOffset) {
  FA_REQUIRE_GPU();
  Rng rng(112);
  check_exp2_rows<64>(rng);
  check_exp2_rows<128>(rng);
}

// ---- rescale ------------------------------------------------------------------------------------

template <int D>
__global__ void rescale_kernel(const float* o_in, const float* alpha, float* o_out) {
  Acc<D> o = read_acc<D>(o_in);
  rescale(o, read_rows(alpha));
  write_acc(o_out, o);
}

template <int D>
void check_rescale(Rng& rng) {
  SCOPED_TRACE("D " + std::to_string(D));
  const std::vector<float> o = rng.floats(16 * D, -2, 2);
  std::vector<float> alpha = rng.floats(16, 0, 1);
  alpha[1] = 0, alpha[10] = 1;
  auto d_o = upload(to_acc(o, D)), dalpha = upload(to_rows(alpha));
  DeviceBuffer<float> dout(16 * D);
  dout.poison();
  rescale_kernel<D><<<1, kLanes>>>(d_o.get(), dalpha.get(), dout.get());
  finish();
  expect_acc(dout.download(), D, [&](int row, int col, double*) { return double(o[row * D + col] * alpha[row]); });
}

TEST(WarpTile, RescaleMultipliesEachRowByItsFactor) {
  FA_REQUIRE_GPU();
  Rng rng(113);
  check_rescale<64>(rng);
  check_rescale<128>(rng);
}

// ---- store_rows, store_row_values ---------------------------------------------------------------

// The destination: a block's 32 rows with kGuard elements of poison either side. Cases (row0,
// valid_rows): a partly valid second warp, a whole first warp, a second warp wholly past N_q.
constexpr int kStoreRows = 32, kGuard = 64;
constexpr std::pair<int, int> kStoreCases[] = {{16, 27}, {0, 16}, {16, 10}};

template <int D>
__global__ void store_rows_kernel(uint16_t* dst, int64_t stride, const float* o, const float* scale, int row0,
                                  int valid_rows) {
  store_rows(reinterpret_cast<bf16*>(dst), stride, read_acc<D>(o), read_rows(scale), row0, valid_rows);
}

template <int D>
void check_store_rows(Rng& rng) {
  const int64_t stride = D + 24;  // columns D..stride-1 of a row are not the tile's
  const std::vector<float> o = rng.floats(16 * D, -2, 2), scale = rng.floats(16, 0.1f, 2);
  auto d_o = upload(to_acc(o, D)), dscale = upload(to_rows(scale));
  const int64_t n = 2 * kGuard + kStoreRows * stride;
  DeviceBuffer<uint16_t> dst(n);
  for (const auto& [row0, valid] : kStoreCases) {
    SCOPED_TRACE("D " + std::to_string(D) + ", row0 " + std::to_string(row0) + ", valid_rows " + std::to_string(valid));
    dst.poison();
    store_rows_kernel<D><<<1, kLanes>>>(dst.get() + kGuard, stride, d_o.get(), dscale.get(), row0, valid);
    finish();
    const std::vector<uint16_t> out = dst.download();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = i - kGuard, row = at / stride, col = at % stride;
      const bool written = at >= 0 && row >= row0 && row < row0 + 16 && row < valid && col < D;
      const uint16_t want = written ? bf16_bits(o[(row - row0) * D + col] * scale[row - row0]) : kPoison16;
      ASSERT_EQ(out[i], want) << "element " << at << " from dst = (" << row << ", " << col << ")"
                              << (written ? "" : ", which must stay untouched");
    }
  }
}

TEST(WarpTile, StoreRowsWritesScaledBf16RowsBelowValidRowsOnly) {
  FA_REQUIRE_GPU();
  Rng rng(114);
  check_store_rows<64>(rng);
  check_store_rows<128>(rng);
}

__global__ void store_row_values_kernel(float* dst, const float* x, int row0, int valid_rows) {
  store_row_values(dst, read_rows(x), row0, valid_rows);
}

TEST(WarpTile, StoreRowValuesWritesOneValuePerValidRow) {
  FA_REQUIRE_GPU();
  Rng rng(115);
  const std::vector<float> x = rng.floats(16, -8, 8);
  auto dx = upload(to_rows(x));
  const int n = 2 * kGuard + kStoreRows;
  DeviceBuffer<float> dst(n);
  for (const auto& [row0, valid] : kStoreCases) {
    SCOPED_TRACE("row0 " + std::to_string(row0) + ", valid_rows " + std::to_string(valid));
    dst.poison();
    store_row_values_kernel<<<1, kLanes>>>(dst.get() + kGuard, dx.get(), row0, valid);
    finish();
    const std::vector<float> out = dst.download();
    for (int i = 0; i < n; ++i) {
      const int row = i - kGuard;
      const bool written = row >= row0 && row < row0 + 16 && row < valid;
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), written ? std::bit_cast<uint32_t>(x[row - row0]) : kPoison32)
          << "element " << row << " from dst" << (written ? "" : ", which must stay untouched");
    }
  }
}

// ---- SmemTile: layouts --------------------------------------------------------------------------

constexpr int kTileRows = 64;

// Every (row, col) of a tile at its own offset inside the tile's bytes, 16-byte chunks kept whole
// (the copies and ldmatrix move 8 consecutive columns as one).
template <typename Layout>
void check_offsets() {
  SCOPED_TRACE(layout_name<Layout>());
  std::vector<int> hits(Layout::bytes(kTileRows) / 2, 0);
  for (int row = 0; row < kTileRows; ++row)
    for (int col = 0; col < Layout::kCols; ++col) {
      const int at = Layout::offset(row, col);
      ASSERT_TRUE(at >= 0 && at < int(hits.size())) << "(" << row << ", " << col << ") at " << at;
      ASSERT_EQ(++hits[at], 1) << "(" << row << ", " << col << ") shares offset " << at;
      ASSERT_EQ(at, Layout::offset(row, col / 8 * 8) + col % 8) << "(" << row << ", " << col << ") leaves its chunk";
    }
}

TEST(SmemTile, OffsetPlacesEveryElementOnceInWholeChunks) {
  check_offsets<PaddedLayout<64>>();
  check_offsets<PaddedLayout<128>>();
  check_offsets<SwizzledLayout<64>>();
  check_offsets<SwizzledLayout<128>>();
}

// move(lane_bytes, rb, cb) for every lane's ldmatrix row of the three operands, from a first row
// row0 that is a multiple of 16 (load_a of a later warp's rows), against the offset it stands for.
template <typename Layout>
void check_move() {
  SCOPED_TRACE(layout_name<Layout>());
  const char* names[] = {"A (Q)", "B from K", "B from V"};
  for (int op = 0; op < 3; ++op)
    for (int lane = 0; lane < kLanes; ++lane) {
      const int row = op == 0 ? ldsm_a_row(lane) : op == 1 ? ldsm_k_row(lane) : ldsm_v_row(lane);
      const int col = 8 * (op == 0 ? ldsm_a_colblock(lane) : op == 1 ? ldsm_k_colblock(lane) : ldsm_v_colblock(lane));
      for (int row0 : {0, 16, 48}) {
        const unsigned lane_bytes = 2 * unsigned(Layout::offset(row0 + row, col));
        for (int rb = 0; rb < 4; ++rb)
          for (int cb = 0; cb < Layout::kCols / 16; ++cb)
            ASSERT_EQ(Layout::move(lane_bytes, rb, cb),
                      2 * unsigned(Layout::offset(row0 + row + 16 * rb, col + 16 * cb)))
                << names[op] << ", lane " << lane << ", row0 " << row0 << ", block (" << rb << ", " << cb << ")";
      }
    }
}

TEST(SmemTile, MoveIsTheOffsetOfTheBlockFurther) {
  check_move<PaddedLayout<64>>();
  check_move<PaddedLayout<128>>();
  check_move<SwizzledLayout<64>>();
  check_move<SwizzledLayout<128>>();
}

// ---- SmemTile: load_tile, load_tile_async -------------------------------------------------------

constexpr int kCopyThreads = 128;
constexpr uint16_t kSourceNaN = 0x7FC1;  // a NaN unlike the poison: a row or column read that must not be
constexpr int kValidRows = 45;

// Two tiles (the copy goes into the second, through next_tile) and a guard after them.
template <typename Layout>
constexpr int kCopySmemElems = Layout::bytes(2 * kTileRows) / 2 + kGuard;

// The block poisons its shared memory, copies rows of src into tile 1, then writes out the tile
// through Layout::offset, and the whole shared memory as it is after the copy.
template <typename Layout, bool kAsync>
__global__ void load_tile_kernel(const uint16_t* src, int64_t stride, int valid_rows, uint16_t* tile_out,
                                 uint16_t* smem_out) {
  constexpr int kElems = kCopySmemElems<Layout>;
  __shared__ uint4 smem[kElems / 8];
  uint16_t* s = reinterpret_cast<uint16_t*>(smem);
  for (int i = threadIdx.x; i < kElems; i += blockDim.x) s[i] = kPoison16;
  __syncthreads();
  const SmemTile<kTileRows, Layout> tile = next_tile(SmemTile<kTileRows, Layout>{reinterpret_cast<bf16*>(s)}, 1);
  const bf16* g = reinterpret_cast<const bf16*>(src);
  if constexpr (kAsync) {
    load_tile_async<kCopyThreads>(tile, g, stride, valid_rows);
    cp_async_commit();
    cp_async_wait<0>();
  } else {
    load_tile<kCopyThreads>(tile, g, stride, valid_rows);
  }
  __syncthreads();
  const uint16_t* t = reinterpret_cast<const uint16_t*>(tile.ptr);
  for (int i = threadIdx.x; i < kTileRows * Layout::kCols; i += blockDim.x)
    tile_out[i] = t[Layout::offset(i / Layout::kCols, i % Layout::kCols)];
  for (int i = threadIdx.x; i < kElems; i += blockDim.x) smem_out[i] = s[i];
}

template <typename Layout, bool kAsync>
void check_load_tile(Rng& rng) {
  SCOPED_TRACE(layout_name<Layout>() + (kAsync ? ", load_tile_async" : ", load_tile"));
  constexpr int kCols = Layout::kCols, kElems = kCopySmemElems<Layout>;
  const int64_t stride = kCols + 24;
  // Rows at and past valid_rows, and the columns past the tile's, are NaN: never to be read.
  std::vector<uint16_t> src(kTileRows * stride, kSourceNaN);
  for (int row = 0; row < kValidRows; ++row)
    for (int col = 0; col < kCols; ++col) src[row * stride + col] = bf16_bits(rng.uniform(-4, 4));
  auto dsrc = upload(src);
  DeviceBuffer<uint16_t> dtile(kTileRows * kCols), dsmem(kElems);
  dtile.poison();
  dsmem.poison();
  load_tile_kernel<Layout, kAsync><<<1, kCopyThreads>>>(dsrc.get(), stride, kValidRows, dtile.get(), dsmem.get());
  finish();
  const std::vector<uint16_t> tile = dtile.download(), smem = dsmem.download();
  for (int row = 0; row < kTileRows; ++row)
    for (int col = 0; col < kCols; ++col)
      ASSERT_EQ(tile[row * kCols + col], row < kValidRows ? src[row * stride + col] : uint16_t(0))
          << "tile (" << row << ", " << col << ")" << (row < kValidRows ? "" : ", past valid_rows: zero");
  // Nothing else in shared memory is written: tile 0, the padding, the guard.
  std::vector<bool> in_tile(kElems, false);
  for (int row = 0; row < kTileRows; ++row)
    for (int col = 0; col < kCols; ++col) in_tile[Layout::bytes(kTileRows) / 2 + Layout::offset(row, col)] = true;
  for (int i = 0; i < kElems; ++i) {
    if (in_tile[i]) continue;
    ASSERT_EQ(smem[i], kPoison16) << "shared element " << i << " is not the tile's, yet written";
  }
}

TEST(SmemTile, LoadTileCopiesValidRowsAndZeroFillsTheRest) {
  FA_REQUIRE_GPU();
  Rng rng(116);
  check_load_tile<PaddedLayout<64>, false>(rng);
  check_load_tile<PaddedLayout<128>, false>(rng);
  check_load_tile<SwizzledLayout<64>, false>(rng);
  check_load_tile<SwizzledLayout<128>, false>(rng);
}

TEST(SmemTile, LoadTileAsyncCopiesValidRowsAndZeroFillsTheRest) {
  FA_REQUIRE_GPU();
  Rng rng(117);
  check_load_tile<PaddedLayout<64>, true>(rng);
  check_load_tile<PaddedLayout<128>, true>(rng);
  check_load_tile<SwizzledLayout<64>, true>(rng);
  check_load_tile<SwizzledLayout<128>, true>(rng);
}

}  // namespace
}  // namespace fa
