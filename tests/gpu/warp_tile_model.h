// The CPU side of the warp-tile tests: models of the documented fragment layouts
// (device/warp_tile.h), the register orders in which test kernels read and write tiles, and the
// CPU models of the tensor-core products, shared by step 04's vocabulary tests and step 17's
// backward-vocabulary tests.
#pragma once

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "device/ptx/mma.h"
#include "tests/gpu/bf16_bits.h"
#include "device/smem_tile.h"
#include "device/warp_tile.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"

namespace fa::tile_model {

using namespace fa::ptx;
using namespace fa::tile;
using bf16 = __nv_bfloat16;

constexpr int kLanes = 32;
constexpr float kScaleLog2 = 0.18033688f;  // log2(e) / sqrt(64): the c of 2^(c·s − c·m)
// |got − want| of a tensor-core product, relative to Σ|terms|: that sum bounds the error of any
// fp32 summation order (the mma's order is not specified); a misplaced term is ~1/D of it.
constexpr double kMmaTol = 1e-4;
// ex2.approx is good to about 2 ulp, plus the rounding of its fp32 argument (|arg| < 4 here).
constexpr double kExp2Tol = 2e-6;
constexpr uint16_t kPoison16 = 0xFFFF;  // DeviceBuffer::poison: a NaN nothing computes
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;

// ---- host: bf16 bits, random data, comparisons --------------------------------------------------

using fa::testing::bf16_bits;  // tests/gpu/bf16_bits.h
using fa::testing::bf16_float;

class Rng {
 public:
  explicit Rng(uint32_t seed) : gen_(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  std::vector<float> floats(int n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& x : v) x = uniform(lo, hi);
    return v;
  }
  // Bits of bf16 values: tensor-core inputs that the CPU model reads exactly.
  std::vector<uint16_t> bf16s(int n, float lo, float hi) {
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) x = bf16_bits(uniform(lo, hi));
    return v;
  }

 private:
  std::mt19937 gen_;
};

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> buf(host.size());
  buf.upload(host);
  return buf;
}

// A launch or execution error becomes an exception, which fails the test.
inline void finish() {
  FA_CUDA_CHECK(cudaGetLastError());
  FA_CUDA_CHECK(cudaDeviceSynchronize());
}

// Bit for bit where tol is 0 or want is not finite (so -inf, +0 and -0 are told apart), else
// |got − want| <= tol.
inline ::testing::AssertionResult close(float got, double want, double tol) {
  const bool ok = tol == 0 || !std::isfinite(want)
                      ? std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(float(want))
                      : std::fabs(double(got) - want) <= tol;
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << ", want " << want << " (tolerance " << tol << ")";
}

template <typename Layout>
inline std::string layout_name() {
  const bool padded = std::is_same_v<Layout, PaddedLayout<Layout::kCols>>;
  return std::string(padded ? "PaddedLayout<" : "SwizzledLayout<") + std::to_string(Layout::kCols) + ">";
}

// ---- register order: how the test kernels read and write tiles ----------------------------------
//
// Acc<COLS>:  element e of fragment f of lane `lane` at (lane · COLS/8 + f) · 4 + e.
// FragA<K>:   register j of fragment kk of lane `lane` at (lane · K/16 + kk) · 4 + j.
// Rows:       entry r of lane `lane` at 2 · lane + r.

inline int acc_index(int lane, int f, int e, int cols) {
  return (lane * (cols / 8) + f) * 4 + e;
}

// A row-major (16, cols) matrix in Acc register order, through the documented C layout.
inline std::vector<float> to_acc(const std::vector<float>& m, int cols) {
  std::vector<float> raw(m.size());
  for (int lane = 0; lane < kLanes; ++lane)
    for (int f = 0; f < cols / 8; ++f)
      for (int e = 0; e < 4; ++e)
        raw[acc_index(lane, f, e, cols)] = m[mma_c_row(lane, e) * cols + 8 * f + mma_c_col(lane, e)];
  return raw;
}

// One value per row of the 16 → Rows register order: every lane of a quad holds its rows' values.
inline std::vector<float> to_rows(const std::vector<float>& per_row) {
  std::vector<float> raw(2 * kLanes);
  for (int lane = 0; lane < kLanes; ++lane)
    for (int r = 0; r < 2; ++r) raw[2 * lane + r] = per_row[lane / 4 + 8 * r];
  return raw;
}

// Every element of an Acc<cols> against model(row, col, &tol), stopping at the first mismatch.
template <typename Model>
inline void expect_acc(const std::vector<float>& raw, int cols, Model model) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int f = 0; f < cols / 8; ++f)
      for (int e = 0; e < 4; ++e) {
        const int row = mma_c_row(lane, e), col = 8 * f + mma_c_col(lane, e);
        double tol = 0;
        const double want = model(row, col, &tol);
        ASSERT_TRUE(close(raw[acc_index(lane, f, e, cols)], want, tol))
            << "lane " << lane << " fragment " << f << " element " << e << " = (" << row << ", " << col << ")";
      }
}

// Every entry of every lane's Rows against model(lane, row, &tol).
template <typename Model>
inline void expect_rows(const std::vector<float>& raw, Model model) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int r = 0; r < 2; ++r) {
      const int row = lane / 4 + 8 * r;
      double tol = 0;
      const double want = model(lane, row, &tol);
      ASSERT_TRUE(close(raw[2 * lane + r], want, tol)) << "lane " << lane << " entry " << r << " = row " << row;
    }
}

// Every bf16 of every lane's FragA<k> against want(row, col): element i (register i/2, low half
// first) of fragment kk is (mma_a_row(lane, i), 16·kk + mma_a_col(lane, i)).
template <typename Want>
inline void expect_frag(const std::vector<uint32_t>& raw, int k, Want want) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int kk = 0; kk < k / 16; ++kk)
      for (int i = 0; i < 8; ++i) {
        const uint32_t reg = raw[(lane * (k / 16) + kk) * 4 + i / 2];
        const uint16_t got = uint16_t(i % 2 ? reg >> 16 : reg & 0xFFFFu);
        const int row = mma_a_row(lane, i), col = 16 * kk + mma_a_col(lane, i);
        ASSERT_EQ(got, want(row, col)) << "lane " << lane << " fragment " << kk << " element " << i << " = (" << row
                                       << ", " << col << ")";
      }
}

// The CPU models of the two products, with the tolerance kMmaTol·Σ|terms| (see kMmaTol).
// S[row, col] = Σ_d Q[qrow, d]·K[col, d] for row-major bf16 bits Q (rows of D) and K (N, D).
inline double qk_model(const std::vector<uint16_t>& q, const std::vector<uint16_t>& k, int d_dim, int qrow, int col,
                       double* tol) {
  double sum = 0, mag = 0;
  for (int d = 0; d < d_dim; ++d) {
    const double x = double(bf16_float(q[qrow * d_dim + d])) * bf16_float(k[col * d_dim + d]);
    sum += x;
    mag += std::fabs(x);
  }
  *tol = kMmaTol * mag;
  return sum;
}

// O[row, col] + Σ_j bf16(P[row, j])·V[j, col] for row-major float O (rows of D), P (rows of N) and
// bf16 bits V (N, D).
inline double pv_model(const std::vector<float>& o, const std::vector<float>& p, const std::vector<uint16_t>& v,
                       int d_dim, int n, int row, int col, double* tol) {
  double sum = o[row * d_dim + col], mag = std::fabs(sum);
  for (int j = 0; j < n; ++j) {
    const double x = double(bf16_float(bf16_bits(p[row * n + j]))) * bf16_float(v[j * d_dim + col]);
    sum += x;
    mag += std::fabs(x);
  }
  *tol = kMmaTol * mag;
  return sum;
}

// ---- device: tiles in and out in register order -------------------------------------------------

template <int COLS>
__device__ Acc<COLS> read_acc(const float* raw) {
  const int lane = lane_id();
  Acc<COLS> t;
#pragma unroll
  for (int f = 0; f < COLS / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) t.c[f][e] = raw[(lane * (COLS / 8) + f) * 4 + e];
  return t;
}

template <int COLS>
inline __device__ void write_acc(float* raw, const Acc<COLS>& t) {
  const int lane = lane_id();
#pragma unroll
  for (int f = 0; f < COLS / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) raw[(lane * (COLS / 8) + f) * 4 + e] = t.c[f][e];
}

template <int K>
inline __device__ void write_frag(uint32_t* raw, const FragA<K>& a) {
  const int lane = lane_id();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) raw[(lane * (K / 16) + kk) * 4 + j] = a.a[kk][j];
}

inline __device__ Rows read_rows(const float* raw) {
  const int lane = lane_id();
  return {{raw[2 * lane], raw[2 * lane + 1]}};
}

inline __device__ void write_rows(float* raw, Rows x) {
  const int lane = lane_id();
  raw[2 * lane] = x.r[0];
  raw[2 * lane + 1] = x.r[1];
}

// A row-major (ROWS, Layout::kCols) bf16 matrix into a shared tile, element by element through
// Layout::offset: the warp-op tests do not depend on load_tile, which has tests of its own.
template <int ROWS, typename Layout>
inline __device__ void fill_tile(SmemTile<ROWS, Layout> tile, const uint16_t* src) {
  uint16_t* dst = reinterpret_cast<uint16_t*>(tile.ptr);
  for (int i = lane_id(); i < ROWS * Layout::kCols; i += kLanes)
    dst[Layout::offset(i / Layout::kCols, i % Layout::kCols)] = src[i];
  __syncwarp();
}

}  // namespace fa::tile_model
