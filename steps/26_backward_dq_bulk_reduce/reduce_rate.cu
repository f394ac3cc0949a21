// fa_reduce_rate: how fast can fp32 additions reach global memory from every SM? Step 26's
// measurement. One block per SM, each adding a (64, 128) fp32 tile (32 KB) from shared memory
// into global memory `iters` times, in three ways:
//   atomics      every thread 8 × 16-byte atomicAdd (REDG.E.ADD.F32x4), values read from shared
//   tensor       one thread: 4 × cp.reduce.async.bulk.tensor of a (64, 32) box (step 26's way)
//   bulk         one thread: 1 × cp.reduce.async.bulk of the 32 KB, contiguous
// with each block adding into a region of its own, and with 8 blocks sharing each region (as 8 KV
// tiles add into the same rows of dQ). Prints GB/s of additions, over the GPU and per SM.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "device/ptx/sm90.h"
#include "device/ptx/tma.h"
#include "library/tma.h"

namespace {

constexpr int kRows = 64, kCols = 128, kTile = kRows * kCols;
constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

template <int MODE>
__global__ void __launch_bounds__(kThreads)
    add_kernel(float* dst, int iters, int share, const __grid_constant__ CUtensorMap map) {
  extern __shared__ __align__(1024) float stage[];
  for (int i = int(threadIdx.x); i < kTile; i += kThreads) stage[i] = 1.0f;
  fa::ptx::fence_proxy_async_shared();
  __syncthreads();
  const int region = int(blockIdx.x) / share;
  float* const mine = dst + size_t(region) * kTile;
  for (int it = 0; it < iters; ++it) {
    if constexpr (MODE == 0) {
#pragma unroll
      for (int k = 0; k < kTile / 4 / kThreads; ++k) {
        const int chunk = k * kThreads + int(threadIdx.x);
        atomicAdd(reinterpret_cast<float4*>(mine) + chunk, reinterpret_cast<const float4*>(stage)[chunk]);
      }
    } else if (threadIdx.x == 0) {
      if constexpr (MODE == 1) {
        for (int box = 0; box < kCols / 32; ++box)
          fa::ptx::tma_reduce_add_3d(&map, 32 * box, 0, region, smem_u32(stage + box * kRows * 32));
      } else {
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(mine),
                     "r"(smem_u32(stage)), "r"(kTile * 4)
                     : "memory");
      }
      fa::ptx::bulk_commit_group();
      fa::ptx::bulk_wait_group_read<2>();  // up to three tiles in flight
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) fa::ptx::bulk_wait_group<0>();
}

}  // namespace

int main() {
  int sms = 0, cc_major = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0);
  if (sms == 0 || cc_major != 9) {
    std::printf("fa_reduce_rate needs a GPU of compute capability 9.0 (sm_90a code)\n");
    return 1;
  }
  const int iters = 400, blocks = sms;
  float* dst = nullptr;
  cudaMalloc(&dst, size_t(blocks) * kTile * sizeof(float));
  CUtensorMap map;
  if (fa::Status st = fa::make_accum_map(&map, dst, blocks, kRows, kCols, kRows); !st.ok()) {
    std::printf("%s\n", st.message().c_str());
    return 1;
  }
  const char* names[] = {"atomics (16-byte, every thread)", "tensor reduce (4 boxes of (64, 32))",
                         "bulk reduce (32 KB, contiguous)"};
  void (*kernels[])(float*, int, int, CUtensorMap) = {add_kernel<0>, add_kernel<1>, add_kernel<2>};
  std::printf("| way | blocks per region | ms | GB/s, GPU | GB/s per SM |\n|---|---|---|---|---|\n");
  for (int share : {1, 8})
    for (int m = 0; m < 3; ++m) {
      cudaFuncSetAttribute(kernels[m], cudaFuncAttributeMaxDynamicSharedMemorySize, kTile * 4);
      kernels[m]<<<blocks, kThreads, kTile * 4>>>(dst, 10, share, map);  // warm-up
      cudaEvent_t start, stop;
      cudaEventCreate(&start);
      cudaEventCreate(&stop);
      cudaEventRecord(start);
      kernels[m]<<<blocks, kThreads, kTile * 4>>>(dst, iters, share, map);
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, start, stop);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
        std::printf("%s: %s\n", names[m], cudaGetErrorString(e));
        return 1;
      }
      const double gbs = double(blocks) * iters * kTile * sizeof(float) / ms / 1e6;
      std::printf("| %s | %d | %.3f | %.0f | %.1f |\n", names[m], share, ms, gbs, gbs / sms);
    }
  return 0;
}
