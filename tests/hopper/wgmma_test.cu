// The wgmma operations of device/warpgroup_tile.h against a CPU product, on the tiles and
// shapes step 11 uses. Two warpgroups (256 threads) each compute their 64 rows:
//   QK: S = Q·Kᵀ, Q (128, D) and K (N, D) in WgmmaLayout tiles (K-major descriptors);
//   PV: O = O0 + P·V, P (128, N) in registers as each warp's FragA, V (N, D) MN-major;
//   AtB (the backward's dQ = dS·K): warpgroup w computes the (64, 64) block (a_panel, b_panel)
//   = (w % A panels, w / A panels) of Aᵀ·B, A (K, ACOLS) and B (K, BCOLS) both MN-major.
// Every thread writes each accumulator element where the warp-tile layout says it belongs
// (mma_c_row / mma_c_col of its warp's 16 rows). A wrong descriptor field (LBO, SBO, swizzle),
// a wrong K step, a wrong panel offset or a wrong accumulator layout puts values in the wrong
// place and fails by position; D = 128 and N = 128 are there for the second 64-column panel.
// Each product runs in both forms: descriptors built per k-step from addresses, and (step 33's
// `by_addition`) built once and advanced by adding the k-step's offset; the CPU model is the same.
// A wrong offset in the added form (a panel step, a 32-byte column step, bytes not divided by 16)
// reads the wrong 16 columns or rows and fails by position like the first.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "device/warpgroup_tile.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "harness/random.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

using namespace fa::tile;
constexpr int kRows = 128, kThreads = 256;

template <int D, int N>
constexpr int smem_bytes() {
  return 1024 + 2 * (kRows * D + N * D);
}

// out (128, N) fp32 = Q·Kᵀ.
template <int D, int N, bool BY_ADDITION>
__global__ void qk_kernel(const bf16* q, const bf16* k, float* out) {
  extern __shared__ uint4 smem[];
  bf16* base = aligned_for_wgmma(smem);
  const SmemTile<kRows, WgmmaLayout<kRows, D>> q_tile{base};
  const SmemTile<N, WgmmaLayout<N, D>> k_tile{base + kRows * D};
  load_tile<kThreads>(q_tile, q, D, kRows);
  load_tile<kThreads>(k_tile, k, D, N);
  ptx::fence_proxy_async_shared();  // ordinary stores, read next by the tensor cores
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  Acc<N> s;
  wgmma_begin(s);
  if constexpr (BY_ADDITION)
    mma_qk_async(by_addition, s, q_tile, 64 * (warp / 4), k_tile);
  else
    mma_qk_async(s, q_tile, 64 * (warp / 4), k_tile);
  ptx::wgmma_commit();
  wait_for<0>(s);
  for (int f = 0; f < N / 8; ++f)
    for (int e = 0; e < 4; ++e)
      out[(16 * warp + ptx::mma_c_row(lane, e)) * N + 8 * f + ptx::mma_c_col(lane, e)] = s.c[f][e];
}

// out (128, D) fp32 = o0 + P·V, P read from global memory into each warp's FragA.
template <int D, int N, bool BY_ADDITION>
__global__ void pv_kernel(const float* p_in, const bf16* v, const float* o0, float* out) {
  extern __shared__ uint4 smem[];
  bf16* base = aligned_for_wgmma(smem);
  const SmemTile<N, WgmmaLayout<N, D>> v_tile{base};
  load_tile<kThreads>(v_tile, v, D, N);
  ptx::fence_proxy_async_shared();
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  auto at = [&](int f, int e, int cols) {
    return (16 * warp + ptx::mma_c_row(lane, e)) * cols + 8 * f + ptx::mma_c_col(lane, e);
  };
  Acc<N> p_f;
  for (int f = 0; f < N / 8; ++f)
    for (int e = 0; e < 4; ++e) p_f.c[f][e] = p_in[at(f, e, N)];
  FragA<N> p = to_bf16(p_f);
  Acc<D> o;
  for (int f = 0; f < D / 8; ++f)
    for (int e = 0; e < 4; ++e) o.c[f][e] = o0[at(f, e, D)];
  wgmma_begin(o, p);
  if constexpr (BY_ADDITION)
    mma_pv_async(by_addition, o, p, v_tile);
  else
    mma_pv_async(o, p, v_tile);
  ptx::wgmma_commit();
  wait_for<0>(o);
  for (int f = 0; f < D / 8; ++f)
    for (int e = 0; e < 4; ++e) out[at(f, e, D)] = o.c[f][e];
}

// out (ACOLS, BCOLS) fp32 = Aᵀ·B, A (K, ACOLS) and B (K, BCOLS): each warpgroup its own 64 × 64 block.
template <int K, int ACOLS, int BCOLS, bool BY_ADDITION>
__global__ void at_b_kernel(const bf16* a, const bf16* b, float* out) {
  extern __shared__ uint4 smem[];
  bf16* base = aligned_for_wgmma(smem);
  const SmemTile<K, WgmmaLayout<K, ACOLS>> a_tile{base};
  const SmemTile<K, WgmmaLayout<K, BCOLS>> b_tile{base + K * ACOLS};
  load_tile<kThreads>(a_tile, a, ACOLS, K);
  load_tile<kThreads>(b_tile, b, BCOLS, K);
  ptx::fence_proxy_async_shared();
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, wg = warp / 4;
  const int a_panel = wg % (ACOLS / 64), b_panel = wg / (ACOLS / 64);
  Acc<64> d;
  wgmma_begin(d);
  if constexpr (BY_ADDITION)
    mma_at_b_async(by_addition, d, a_tile, a_panel, b_tile, b_panel);
  else
    mma_at_b_async(d, a_tile, a_panel, b_tile, b_panel);
  ptx::wgmma_commit();
  wait_for<0>(d);
  for (int f = 0; f < 8; ++f)
    for (int e = 0; e < 4; ++e)
      out[(64 * a_panel + 16 * (warp % 4) + ptx::mma_c_row(lane, e)) * BCOLS + 64 * b_panel + 8 * f +
          ptx::mma_c_col(lane, e)] = d.c[f][e];
}

float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = round_bf16(normal_at(seed, i));  // exact in bf16: the CPU sees what the GPU sees
  return x;
}

std::vector<bf16> to_device_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16(x[i]);
  return y;
}

template <int D, int N, bool BY_ADDITION = false>
void check_qk() {
  FA_REQUIRE_SM90A();
  const std::vector<float> q = random_values(kRows * D, 11 + D + N), k = random_values(N * D, 23 + D + N);
  DeviceBuffer<bf16> dq(q.size()), dk(k.size());
  DeviceBuffer<float> dout(kRows * N);
  dq.upload(to_device_bf16(q));
  dk.upload(to_device_bf16(k));
  dout.poison();
  FA_CUDA_CHECK(cudaFuncSetAttribute(qk_kernel<D, N, BY_ADDITION>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     smem_bytes<D, N>()));
  qk_kernel<D, N, BY_ADDITION><<<1, kThreads, smem_bytes<D, N>()>>>(dq.get(), dk.get(), dout.get());
  FA_CUDA_CHECK(cudaGetLastError());
  const std::vector<float> out = dout.download();
  for (int m = 0; m < kRows; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0, scale = 0;
      for (int d = 0; d < D; ++d) {
        want += double(q[m * D + d]) * k[n * D + d];
        scale += std::fabs(double(q[m * D + d]) * k[n * D + d]);
      }
      ASSERT_NEAR(out[m * N + n], want, 1e-5 * scale + 1e-6) << "S[" << m << "][" << n << "]";
    }
}

template <int D, int N, bool BY_ADDITION = false>
void check_pv() {
  FA_REQUIRE_SM90A();
  const std::vector<float> p = random_values(kRows * N, 31 + D + N), v = random_values(N * D, 37 + D + N),
                           o0 = random_values(kRows * D, 41 + D + N);
  DeviceBuffer<float> dp(p.size()), do0(o0.size()), dout(kRows * D);
  DeviceBuffer<bf16> dv(v.size());
  dp.upload(p);
  do0.upload(o0);
  dv.upload(to_device_bf16(v));
  dout.poison();
  FA_CUDA_CHECK(cudaFuncSetAttribute(pv_kernel<D, N, BY_ADDITION>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     smem_bytes<D, N>()));
  pv_kernel<D, N, BY_ADDITION><<<1, kThreads, smem_bytes<D, N>()>>>(dp.get(), dv.get(), do0.get(), dout.get());
  FA_CUDA_CHECK(cudaGetLastError());
  const std::vector<float> out = dout.download();
  for (int m = 0; m < kRows; ++m)
    for (int d = 0; d < D; ++d) {
      double want = o0[m * D + d], scale = std::fabs(want);
      for (int n = 0; n < N; ++n) {
        want += double(p[m * N + n]) * v[n * D + d];
        scale += std::fabs(double(p[m * N + n]) * v[n * D + d]);
      }
      ASSERT_NEAR(out[m * D + d], want, 1e-5 * scale + 1e-6) << "O[" << m << "][" << d << "]";
    }
}

// Two warpgroups cover (ACOLS / 64) × (BCOLS / 64) = 2 blocks: the backward's two cases, dSᵀ with
// two query panels against K at D = 64 (a_panel = warpgroup), and one query panel against K at
// D = 128 (b_panel = warpgroup).
template <int K, int ACOLS, int BCOLS, bool BY_ADDITION = false>
void check_at_b() {
  FA_REQUIRE_SM90A();
  static_assert((ACOLS / 64) * (BCOLS / 64) == kThreads / 128, "one 64 × 64 block per warpgroup");
  constexpr int smem = 1024 + 2 * K * (ACOLS + BCOLS);
  const std::vector<float> a = random_values(K * ACOLS, 43 + ACOLS), b = random_values(K * BCOLS, 47 + BCOLS);
  DeviceBuffer<bf16> da(a.size()), db(b.size());
  DeviceBuffer<float> dout(ACOLS * BCOLS);
  da.upload(to_device_bf16(a));
  db.upload(to_device_bf16(b));
  dout.poison();
  FA_CUDA_CHECK(cudaFuncSetAttribute(at_b_kernel<K, ACOLS, BCOLS, BY_ADDITION>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  at_b_kernel<K, ACOLS, BCOLS, BY_ADDITION><<<1, kThreads, smem>>>(da.get(), db.get(), dout.get());
  FA_CUDA_CHECK(cudaGetLastError());
  const std::vector<float> out = dout.download();
  for (int m = 0; m < ACOLS; ++m)
    for (int n = 0; n < BCOLS; ++n) {
      double want = 0, scale = 0;
      for (int k = 0; k < K; ++k) {
        want += double(a[k * ACOLS + m]) * b[k * BCOLS + n];
        scale += std::fabs(double(a[k * ACOLS + m]) * b[k * BCOLS + n]);
      }
      ASSERT_NEAR(out[m * BCOLS + n], want, 1e-5 * scale + 1e-6) << "(AᵀB)[" << m << "][" << n << "]";
    }
}

TEST(Wgmma, AtBK128A128B64) {
  check_at_b<128, 128, 64>();
}
TEST(Wgmma, AtBK128A64B128) {
  check_at_b<128, 64, 128>();
}

TEST(Wgmma, QkD64N64) {
  check_qk<64, 64>();
}
TEST(Wgmma, QkD64N128) {
  check_qk<64, 128>();
}
TEST(Wgmma, QkD128N64) {
  check_qk<128, 64>();
}
TEST(Wgmma, QkD128N128) {
  check_qk<128, 128>();
}
TEST(Wgmma, PvD64N64) {
  check_pv<64, 64>();
}
TEST(Wgmma, PvD64N128) {
  check_pv<64, 128>();
}
TEST(Wgmma, PvD128N64) {
  check_pv<128, 64>();
}
TEST(Wgmma, PvD128N128) {
  check_pv<128, 128>();
}

// The by-addition forms (step 33), on the same shapes.
TEST(Wgmma, ByAdditionAtBK128A128B64) {
  check_at_b<128, 128, 64, true>();
}
TEST(Wgmma, ByAdditionAtBK128A64B128) {
  check_at_b<128, 64, 128, true>();
}
TEST(Wgmma, ByAdditionQkD64N64) {
  check_qk<64, 64, true>();
}
TEST(Wgmma, ByAdditionQkD128N64) {
  check_qk<128, 64, true>();
}
TEST(Wgmma, ByAdditionQkD128N128) {
  check_qk<128, 128, true>();
}
TEST(Wgmma, ByAdditionPvD64N64) {
  check_pv<64, 64, true>();
}
TEST(Wgmma, ByAdditionPvD128N64) {
  check_pv<128, 64, true>();
}
TEST(Wgmma, ByAdditionPvD128N128) {
  check_pv<128, 128, true>();
}

}  // namespace
}  // namespace fa
