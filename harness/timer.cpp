#include "harness/timer.h"

#include <algorithm>
#include <stdexcept>

#include "harness/cuda_check.h"
#include "harness/device_buffer.h"

namespace fa {

Timing time_on_stream(const std::function<void(cudaStream_t)>& fn, const TimingOptions& opt, cudaStream_t stream) {
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  int l2_bytes = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  // Writing twice the L2 size evicts everything the previous run left there.
  DeviceBuffer<char> flush(opt.flush_l2 ? size_t(2) * size_t(std::max(l2_bytes, 1 << 20)) : 0);

  for (int i = 0; i < opt.warmup; ++i) fn(stream);
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));

  cudaEvent_t start, stop;
  FA_CUDA_CHECK(cudaEventCreate(&start));
  FA_CUDA_CHECK(cudaEventCreate(&stop));
  Timing t;
  for (int i = 0; i < opt.iters; ++i) {
    if (opt.flush_l2) FA_CUDA_CHECK(cudaMemsetAsync(flush.get(), i & 0xFF, flush.bytes(), stream));
    FA_CUDA_CHECK(cudaEventRecord(start, stream));
    fn(stream);
    FA_CUDA_CHECK(cudaEventRecord(stop, stream));
    FA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    t.samples_ms.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  t.median_ms = median(t.samples_ms);
  t.min_ms = *std::min_element(t.samples_ms.begin(), t.samples_ms.end());
  t.max_ms = *std::max_element(t.samples_ms.begin(), t.samples_ms.end());
  return t;
}

Timing time_step(const StepInfo& step, const AttentionParams& p, const TimingOptions& opt, cudaStream_t stream) {
  return time_on_stream(
      [&](cudaStream_t s) {
        Status st = step.forward(p, s);
        if (!st.ok()) throw std::runtime_error(st.message());
      },
      opt, stream);
}

TimingOptions fit_to_budget(TimingOptions opt, double probe_ms, double budget_ms, int min_iters) {
  if (budget_ms <= 0 || !(probe_ms > 0)) return opt;
  const double fits = budget_ms / probe_ms;  // runs the budget pays for
  const int floor_iters = std::min(std::max(min_iters, 1), opt.iters);
  opt.iters = int(std::clamp(fits, double(floor_iters), double(opt.iters)));
  if (opt.warmup > 0) opt.warmup = int(std::clamp(fits / 4, 1.0, double(opt.warmup)));
  return opt;
}

}  // namespace fa
