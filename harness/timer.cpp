#include "harness/timer.h"

#include <algorithm>
#include <stdexcept>

#include "harness/cuda_check.h"
#include "harness/device_buffer.h"

namespace fa {

namespace {

// The timed runs' start and stop events, destroyed however the timing ends (a step that throws).
struct EventPairs {
  std::vector<cudaEvent_t> events;
  explicit EventPairs(int pairs) : events(2 * size_t(pairs), nullptr) {
    for (cudaEvent_t& e : events) FA_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~EventPairs() {
    for (cudaEvent_t e : events)
      if (e != nullptr) cudaEventDestroy(e);
  }
  EventPairs(const EventPairs&) = delete;
  EventPairs& operator=(const EventPairs&) = delete;
  cudaEvent_t start(int i) const { return events[2 * size_t(i)]; }
  cudaEvent_t stop(int i) const { return events[2 * size_t(i) + 1]; }
};

}  // namespace

Timing time_on_stream(const std::function<void(cudaStream_t)>& fn, const TimingOptions& opt, cudaStream_t stream) {
  if (opt.iters < 1) throw std::invalid_argument("timing needs at least one timed run (iters >= 1)");
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  int l2_bytes = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  // Writing twice the L2 size evicts everything the previous run left there.
  DeviceBuffer<char> flush(opt.flush_l2 ? size_t(2) * size_t(std::max(l2_bytes, 1 << 20)) : 0);

  for (int i = 0; i < opt.warmup; ++i) fn(stream);
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));

  // Every timed run is queued behind one spin kernel that outlasts the host's queueing, and the
  // host waits only once, after the last: the GPU never idles between runs. Waiting after each run
  // instead leaves it idle for a few microseconds before the next, and on an H200 a long kernel
  // launched after such a gap ran up to 12 % slower, by a different amount each repeat (measured on
  // a Hopper step, D = 128, N = 4k and 16k) — while SDPA in scripts/compare.py was timed queued.
  const EventPairs ev(opt.iters);
  spin_on_stream(kQueueSpinMs, stream);
  for (int i = 0; i < opt.iters; ++i) {
    if (opt.flush_l2) FA_CUDA_CHECK(cudaMemsetAsync(flush.get(), i & 0xFF, flush.bytes(), stream));
    FA_CUDA_CHECK(cudaEventRecord(ev.start(i), stream));
    fn(stream);
    FA_CUDA_CHECK(cudaEventRecord(ev.stop(i), stream));
  }
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));
  Timing t;
  for (int i = 0; i < opt.iters; ++i) {
    float ms = 0;
    FA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start(i), ev.stop(i)));
    t.samples_ms.push_back(ms);
  }
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
