// The copy engine's tile copy (device/ptx/tma.h, device/smem_tile.h's load_tile_tma) with the
// course's tensor maps (library/tma.h) and mbarriers (device/ptx/mbarrier.h), against the layout
// wgmma reads. One thread copies a (ROWS, D) tile of one (batch, head) of a (B, H, N, D) tensor,
// in the (B, N, H, D) storage order, at a row start whose tile runs past N; every thread then
// checks each element of the shared tile at WgmmaLayout::offset(row, col): the tensor's value,
// or zero past N. A wrong box, a wrong stride order, a missing swizzle or a wrong panel offset
// puts values in the wrong place; an mbarrier that completed early leaves the poison in place.
// Run twice on the same barrier, the second time with parity 1, for the phase bit. At D = 32 and
// 96 the tile's last panel is half used (Part VI): its box reaches past the tensor's last column,
// and the 32 columns past it must arrive as zeros, their bytes counted by the mbarrier like the rest.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device/ptx/mbarrier.h"
#include "device/ptx/sm90.h"  // fence_proxy_async_shared
#include "device/smem_tile.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "library/tma.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

using namespace fa::tile;
constexpr int kB = 2, kH = 3, kN = 150, kRows = 64;

struct Maps {
  CUtensorMap map;
};

// bad[0] counts the mismatches of both copies (rows `row0` and `row1` of head h, batch b).
template <int D>
__global__ void tma_kernel(const __grid_constant__ Maps maps, int b, int h, int row0, int row1,
                           const bf16* __restrict__ src, int64_t seq_stride, int64_t head_stride, int64_t batch_stride,
                           int* bad) {
  extern __shared__ uint4 smem[];
  __shared__ uint64_t full;
  using Layout = WgmmaLayout<kRows, D>;
  constexpr int kCols = Layout::kRowElems;  // the columns the tile holds: D, or 128 at D = 96
  const SmemTile<kRows, Layout> tile{aligned_for_wgmma(smem)};
  const uint32_t bar = uint32_t(__cvta_generic_to_shared(&full));
  for (int i = int(threadIdx.x); i < kRows * kCols; i += blockDim.x) tile.ptr[i] = __float2bfloat16(-777.0f);  // poison
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(bar, 1);
    ptx::fence_mbarrier_init();
  }
  ptx::fence_proxy_async_shared();  // the poison (generic proxy) before the copy engine's writes
  __syncthreads();
  for (int pass = 0; pass < 2; ++pass) {
    const int row = pass == 0 ? row0 : row1;
    if (threadIdx.x == 0) {
      ptx::mbarrier_arrive_expect_tx(bar, Layout::bytes(kRows));
      load_tile_tma(tile, &maps.map, row, h, b, bar);
    }
    ptx::mbarrier_wait(bar, pass);  // the barrier's phase `pass` completes with this copy
    for (int i = int(threadIdx.x); i < kRows * kCols; i += blockDim.x) {
      const int r = i / kCols, c = i % kCols;
      const float want =
          row + r < kN && c < D
              ? __bfloat162float(src[b * batch_stride + h * head_stride + int64_t(row + r) * seq_stride + c])
              : 0.0f;
      if (__bfloat162float(tile.ptr[Layout::offset(r, c)]) != want) atomicAdd(bad, 1);
    }
    __syncthreads();  // everyone has read this copy before the next one overwrites it
  }
}

template <int D>
void check_tma() {
  FA_REQUIRE_SM90A();
  const Strides st = bnhd_strides(kH, kN, D);  // (B, N, H, D) storage: rows H·D apart
  std::vector<bf16> host(size_t(kB) * kN * kH * D);
  for (size_t i = 0; i < host.size(); ++i) host[i] = __float2bfloat16(float(int(i % 509) - 254));  // exact in bf16
  DeviceBuffer<bf16> src(host.size());
  src.upload(host);
  DeviceBuffer<int> bad(1);
  FA_CUDA_CHECK(cudaMemset(bad.get(), 0, sizeof(int)));
  Maps maps;
  const Status made = make_tile_map(&maps.map, "src", src.get(), kB, kH, kN, D, st, kRows);
  ASSERT_TRUE(made.ok()) << made.message();
  const int smem = kWgmmaAlignment + WgmmaLayout<kRows, D>::bytes(kRows);
  FA_CUDA_CHECK(cudaFuncSetAttribute(tma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Batch 1, head 2: rows 64..127 (inside), then 128..191 (22 rows past N = 150: zeros).
  tma_kernel<D><<<1, 128, smem>>>(maps, 1, 2, 64, 128, src.get(), st.seq, st.head, st.batch, bad.get());
  FA_CUDA_CHECK(cudaGetLastError());
  EXPECT_EQ(bad.download()[0], 0) << "elements of the shared tile that are not the tensor's (or zero past N and "
                                     "past the last column)";
}

TEST(Tma, BnhdTileD64IntoWgmmaLayout) {
  check_tma<64>();
}
TEST(Tma, BnhdTileD128IntoWgmmaLayout) {
  check_tma<128>();
}
TEST(Tma, BnhdTileD96IntoAHalfUsedPanel) {
  check_tma<96>();
}
TEST(Tma, BnhdTileD32IntoAHalfUsedPanel) {
  check_tma<32>();
}

// A broadcast (stride 0 over a dimension longer than 1) is refused with a message, not encoded
// (the H200's driver encodes it, but nothing here shows the copy reading it right); a zero stride
// on a dimension of size 1 is never stepped along and is fine.
TEST(Tma, ZeroStrideIsRefusedClearly) {
  FA_REQUIRE_GPU();
  DeviceBuffer<bf16> src(size_t(kN) * 64);
  CUtensorMap map;
  Strides st = bhnd_strides(kH, kN, 64);
  st.head = 0;
  const Status s = make_tile_map(&map, "k", src.get(), 1, kH, kN, 64, st, kRows);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("TMA cannot describe k: its head stride is 0"), std::string::npos) << s.message();
  st.batch = 0;  // B = 1: never stepped along
  st.head = kN * 64;
  EXPECT_TRUE(make_tile_map(&map, "k", src.get(), 1, kH, kN, 64, st, kRows).ok());
}

}  // namespace
}  // namespace fa
