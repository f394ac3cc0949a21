// The PTX wrappers of device/ptx/ against CPU models of their documented layouts. Each test runs
// one warp on a tiny problem whose every value is distinct (or an exact small integer), so a
// single misplaced element fails with its lane and register named.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "device/ptx/ldmatrix.h"
#include "device/ptx/mma.h"
#include "device/ptx/swizzle.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

using namespace fa::ptx;
using bf16 = __nv_bfloat16;

// ---- mma.sync m16n8k16 ---------------------------------------------------------------------

// D = A·B + C, A 16×16 row-major, B 16×8 stored as B[k][n], C and D 16×8; one warp. Each lane
// gathers its fragments with the layout functions of mma.h and scatters D the same way.
__global__ void mma_kernel(const float* a, const float* b, const float* c, float* d) {
  const int lane = threadIdx.x;
  uint32_t a_frag[4], b_frag[2];
  for (int r = 0; r < 4; ++r)
    a_frag[r] = pack_bf16x2(a[mma_a_row(lane, 2 * r) * 16 + mma_a_col(lane, 2 * r)],
                            a[mma_a_row(lane, 2 * r + 1) * 16 + mma_a_col(lane, 2 * r + 1)]);
  for (int r = 0; r < 2; ++r)
    b_frag[r] = pack_bf16x2(b[mma_b_row(lane, 2 * r) * 8 + mma_b_col(lane, 2 * r)],
                            b[mma_b_row(lane, 2 * r + 1) * 8 + mma_b_col(lane, 2 * r + 1)]);
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[mma_c_row(lane, i) * 8 + mma_c_col(lane, i)];
  mma_bf16_16816(acc, a_frag, b_frag[0], b_frag[1]);
  for (int i = 0; i < 4; ++i) d[mma_c_row(lane, i) * 8 + mma_c_col(lane, i)] = acc[i];
}

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> buf(host.size());
  buf.upload(host);
  return buf;
}

TEST(PtxMma, FragmentLayoutMatchesCpuMatmul) {
  FA_REQUIRE_GPU();
  // Small integers: every product and sum is exact in bf16 inputs and fp32 accumulators, so the
  // comparison is exact and any misplaced element shows.
  std::vector<float> a(16 * 16), b(16 * 8), c(16 * 8);
  for (int i = 0; i < 16 * 16; ++i) a[i] = float((i * 7) % 11 - 5);
  for (int i = 0; i < 16 * 8; ++i) b[i] = float((i * 5) % 9 - 4);
  for (int i = 0; i < 16 * 8; ++i) c[i] = float(i % 13);
  auto da = upload(a), db = upload(b), dc = upload(c);
  DeviceBuffer<float> dd(16 * 8);
  mma_kernel<<<1, 32>>>(da.get(), db.get(), dc.get(), dd.get());
  FA_CUDA_CHECK(cudaGetLastError());
  std::vector<float> d = dd.download();
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float want = c[m * 8 + n];
      for (int k = 0; k < 16; ++k) want += a[m * 16 + k] * b[k * 8 + n];
      EXPECT_EQ(d[m * 8 + n], want) << "D[" << m << "][" << n << "]";
    }
}

// The layout functions cover every element exactly once (a bijection lanes × registers → tile).
TEST(PtxMma, LayoutFunctionsCoverEachElementOnce) {
  std::vector<int> a(16 * 16, 0), b(16 * 8, 0), c(16 * 8, 0);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) ++a[mma_a_row(lane, i) * 16 + mma_a_col(lane, i)];
    for (int i = 0; i < 4; ++i) ++b[mma_b_row(lane, i) * 8 + mma_b_col(lane, i)];
    for (int i = 0; i < 4; ++i) ++c[mma_c_row(lane, i) * 8 + mma_c_col(lane, i)];
  }
  for (int x : a) EXPECT_EQ(x, 1);
  for (int x : b) EXPECT_EQ(x, 1);
  for (int x : c) EXPECT_EQ(x, 1);
}

// S = A·B as two 16×8 accumulator tiles, turned into an A fragment in registers
// (accumulators_to_a) and multiplied by V: the trick that keeps P out of shared memory.
__global__ void chain_kernel(const float* a, const float* b, const float* v, float* o) {
  const int lane = threadIdx.x;
  uint32_t a_frag[4];
  for (int r = 0; r < 4; ++r)
    a_frag[r] = pack_bf16x2(a[mma_a_row(lane, 2 * r) * 16 + mma_a_col(lane, 2 * r)],
                            a[mma_a_row(lane, 2 * r + 1) * 16 + mma_a_col(lane, 2 * r + 1)]);
  float s[2][4] = {};
  for (int nt = 0; nt < 2; ++nt) {  // b is 16×16: n-tile nt is columns 8nt..8nt+7
    uint32_t b_frag[2];
    for (int r = 0; r < 2; ++r)
      b_frag[r] = pack_bf16x2(b[mma_b_row(lane, 2 * r) * 16 + nt * 8 + mma_b_col(lane, 2 * r)],
                              b[mma_b_row(lane, 2 * r + 1) * 16 + nt * 8 + mma_b_col(lane, 2 * r + 1)]);
    mma_bf16_16816(s[nt], a_frag, b_frag[0], b_frag[1]);
  }
  uint32_t p_frag[4];
  accumulators_to_a(p_frag, s[0], s[1]);
  uint32_t v_frag[2];
  for (int r = 0; r < 2; ++r)
    v_frag[r] = pack_bf16x2(v[mma_b_row(lane, 2 * r) * 8 + mma_b_col(lane, 2 * r)],
                            v[mma_b_row(lane, 2 * r + 1) * 8 + mma_b_col(lane, 2 * r + 1)]);
  float acc[4] = {};
  mma_bf16_16816(acc, p_frag, v_frag[0], v_frag[1]);
  for (int i = 0; i < 4; ++i) o[mma_c_row(lane, i) * 8 + mma_c_col(lane, i)] = acc[i];
}

TEST(PtxMma, AccumulatorsReusedAsAOperand) {
  FA_REQUIRE_GPU();
  // |S| <= 16·2·2 = 64: an integer bf16 holds exactly, so (A·B)·V is exact too.
  std::vector<float> a(16 * 16), b(16 * 16), v(16 * 8);
  for (int i = 0; i < 256; ++i) a[i] = float((i * 3) % 5 - 2);
  for (int i = 0; i < 256; ++i) b[i] = float((i * 7) % 5 - 2);
  for (int i = 0; i < 128; ++i) v[i] = float(i % 7 - 3);
  auto da = upload(a), db = upload(b), dv = upload(v);
  DeviceBuffer<float> dout(16 * 8);
  chain_kernel<<<1, 32>>>(da.get(), db.get(), dv.get(), dout.get());
  FA_CUDA_CHECK(cudaGetLastError());
  std::vector<float> out = dout.download();
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float want = 0;
      for (int j = 0; j < 16; ++j) {
        float s = 0;
        for (int k = 0; k < 16; ++k) s += a[m * 16 + k] * b[k * 16 + j];
        want += s * v[j * 8 + n];
      }
      EXPECT_EQ(out[m * 8 + n], want) << "O[" << m << "][" << n << "]";
    }
}

// ---- ldmatrix --------------------------------------------------------------------------------

// A ROWS × COLS tile of raw 16-bit values (row·COLS + col: all distinct) stored swizzled in shared
// memory; every lane loads the fragments of every 16×16 block with the addressing the kernels
// use, and writes out the raw bits of what it got. Operand 0 = A (Q), 1 = K, 2 = V (.trans).
constexpr int ROWS = 32, COLS = 64;

__global__ void ldmatrix_kernel(const uint16_t* tile_in, uint16_t* out, int operand) {
  __shared__ __align__(128) uint16_t tile[ROWS * COLS];
  const int lane = threadIdx.x;
  for (int i = lane; i < ROWS * COLS; i += 32) {
    const int r = i / COLS, c = i % COLS;
    tile[swizzled_offset(r, c, COLS)] = tile_in[i];
  }
  __syncwarp();
  int row0 = ldsm_a_row(lane), colblock = ldsm_a_colblock(lane);
  if (operand == 1) row0 = ldsm_k_row(lane), colblock = ldsm_k_colblock(lane);
  if (operand == 2) row0 = ldsm_v_row(lane), colblock = ldsm_v_colblock(lane);
  const unsigned off = 2 * swizzled_offset(row0, colblock * 8, COLS);
  for (int rb = 0; rb < ROWS / 16; ++rb)
    for (int cb = 0; cb < COLS / 16; ++cb) {
      const uint32_t addr = smem_u32(tile) + rb * 16 * COLS * 2 + swizzle_move_right(off, cb * 16);
      uint32_t r[4];
      if (operand == 2)
        ldmatrix_x4_trans(r, addr);
      else
        ldmatrix_x4(r, addr);
      for (int i = 0; i < 4; ++i) {
        uint16_t* o = out + (((rb * (COLS / 16) + cb) * 32 + lane) * 4 + i) * 2;
        o[0] = uint16_t(r[i] & 0xFFFF);
        o[1] = uint16_t(r[i] >> 16);
      }
    }
}

std::vector<uint16_t> run_ldmatrix(int operand, std::vector<uint16_t>* tile) {
  tile->resize(ROWS * COLS);
  for (int i = 0; i < ROWS * COLS; ++i) (*tile)[i] = uint16_t(i);
  auto din = upload(*tile);
  DeviceBuffer<uint16_t> dout(size_t(ROWS / 16) * (COLS / 16) * 32 * 8);
  ldmatrix_kernel<<<1, 32>>>(din.get(), dout.get(), operand);
  FA_CUDA_CHECK(cudaGetLastError());
  return dout.download();
}

// Loads tile `operand` through ldmatrix and checks every (16×16 block, lane, element) against
// the tile element `source(rb, cb, lane, e)` names, as {row, col}: the fragment layout under test.
// Element e of a lane's 8 is register e/2, half e%2.
template <class Source>
void expect_fragments(int operand, Source source) {
  std::vector<uint16_t> tile;  // (ROWS, COLS), row-major
  const std::vector<uint16_t> out = run_ldmatrix(operand, &tile);
  for (int rb = 0; rb < ROWS / 16; ++rb)
    for (int cb = 0; cb < COLS / 16; ++cb)
      for (int lane = 0; lane < 32; ++lane)
        for (int e = 0; e < 8; ++e) {
          const auto [row, col] = source(rb, cb, lane, e);
          ASSERT_EQ(out[((size_t(rb) * (COLS / 16) + cb) * 32 + lane) * 8 + e], tile[row * COLS + col])
              << "block (" << rb << "," << cb << ") lane " << lane << " element " << e;
        }
}

TEST(PtxLdmatrix, QTileGivesAFragments) {
  FA_REQUIRE_GPU();
  expect_fragments(0, [](int rb, int cb, int lane, int e) {
    return std::pair{rb * 16 + mma_a_row(lane, e), cb * 16 + mma_a_col(lane, e)};
  });
}

TEST(PtxLdmatrix, KTileGivesBFragmentsOfQKt) {
  FA_REQUIRE_GPU();
  // Tile rows = keys, cols = head dim. Registers 0,1: the B fragment of key tile 0 (keys 0-7);
  // registers 2,3: key tile 1. B is (k = head dim) × (n = key): element i is K[key = n][dim = k].
  expect_fragments(1, [](int rb, int cb, int lane, int e) {
    const int tile_n = e / 4, i = e % 4;
    return std::pair{rb * 16 + tile_n * 8 + mma_b_col(lane, i), cb * 16 + mma_b_row(lane, i)};
  });
}

TEST(PtxLdmatrix, VTileTransposedGivesBFragmentsOfPV) {
  FA_REQUIRE_GPU();
  // Tile rows = keys, cols = head dim. Registers 0,1: the B fragment of dim tile 0; registers
  // 2,3: dim tile 1. B is (k = key) × (n = head dim): element i is V[key = k][dim = n].
  expect_fragments(2, [](int rb, int cb, int lane, int e) {
    const int tile_d = e / 4, i = e % 4;
    return std::pair{rb * 16 + mma_b_row(lane, i), cb * 16 + tile_d * 8 + mma_b_col(lane, i)};
  });
}

// ---- exp2 ----------------------------------------------------------------------------------------

__global__ void exp2_kernel(const float* x, float* y, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = exp2_approx(x[i]);
}

TEST(PtxExp2, MatchesExp2AndMapsMinusInfToZero) {
  FA_REQUIRE_GPU();
  std::vector<float> x;
  for (float v = -30.f; v <= 30.f; v += 0.37f) x.push_back(v);
  x.push_back(-INFINITY);
  x.push_back(-200.f);  // below the fp32 range: flushes to 0
  auto dx = upload(x);
  DeviceBuffer<float> dy(x.size());
  exp2_kernel<<<1, 128>>>(dx.get(), dy.get(), int(x.size()));
  FA_CUDA_CHECK(cudaGetLastError());
  auto y = dy.download();
  for (size_t i = 0; i + 2 < x.size(); ++i) EXPECT_NEAR(y[i], std::exp2(double(x[i])), 4e-7 * std::exp2(double(x[i])));
  EXPECT_EQ(y[x.size() - 2], 0.0f);
  EXPECT_EQ(y[x.size() - 1], 0.0f);
}

}  // namespace
}  // namespace fa
