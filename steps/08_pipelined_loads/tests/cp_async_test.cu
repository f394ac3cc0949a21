// The cp.async wrapper of device/ptx/cp_async.h (the copy step 08 pipelines its loads with):
// rows copied into a swizzled tile, rows past the end zero-filled without being read.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "device/ptx/cp_async.h"
#include "device/ptx/ldmatrix.h"
#include "device/ptx/swizzle.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

using namespace fa::ptx;

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> buf(host.size());
  buf.upload(host);
  return buf;
}

// ---- cp.async ---------------------------------------------------------------------------------

// 128 threads copy a (16, 64) tile with a row stride of 72 elements; rows >= valid are zero-filled.
__global__ void cp_async_kernel(const uint16_t* src, int valid, uint16_t* out) {
  __shared__ __align__(128) uint16_t tile[16 * 64];
  for (int c = threadIdx.x; c < 16 * 8; c += blockDim.x) {
    const int row = c / 8, col = (c % 8) * 8;
    const bool ok = row < valid;
    cp_async_16(smem_u32(tile + swizzled_offset(row, col, 64)), src + (ok ? row * 72 + col : 0), ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * 64; i += blockDim.x) out[i] = tile[swizzled_offset(i / 64, i % 64, 64)];
}

TEST(PtxCpAsync, CopiesRowsAndZeroFillsThePastTheEndOnes) {
  FA_REQUIRE_GPU();
  std::vector<uint16_t> src(16 * 72);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint16_t(1000 + i);
  auto dsrc = upload(src);
  DeviceBuffer<uint16_t> dout(16 * 64);
  dout.poison();
  cp_async_kernel<<<1, 128>>>(dsrc.get(), 11, dout.get());
  FA_CUDA_CHECK(cudaGetLastError());
  auto out = dout.download();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 64; ++c)
      ASSERT_EQ(out[r * 64 + c], r < 11 ? src[r * 72 + c] : 0) << "row " << r << " col " << c;
}

}  // namespace
}  // namespace fa
