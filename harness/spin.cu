#include <stdexcept>

#include "harness/cuda_check.h"
#include "harness/timer.h"

namespace fa {
namespace {

// One thread that waits until `ns` nanoseconds of the GPU's global timer have passed.
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

void spin_on_stream(double ms, cudaStream_t stream) {
  if (!(ms >= 0 && ms <= 1000)) throw std::invalid_argument("spin_on_stream: 0 to 1000 ms");
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(ms * 1e6));
  FA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fa
