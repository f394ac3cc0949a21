// Timing device work with CUDA events: warm-up, an L2 flush before every timed run (so each run
// reads its inputs from HBM, as a real model would), and the median of many runs.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

namespace fa {

struct TimingOptions {
  int warmup = 3;
  int iters = 20;
  bool flush_l2 = true;
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  std::vector<double> samples_ms;
};

// Runs `fn(stream)` warmup + iters times and times each of the last `iters` runs on its own.
// Throws on any CUDA error.
Timing time_on_stream(const std::function<void(cudaStream_t)>& fn, const TimingOptions& opt,
                      cudaStream_t stream = nullptr);

double median(std::vector<double> v);

}  // namespace fa
