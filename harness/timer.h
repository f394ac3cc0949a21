// Timing device work with CUDA events: warm-up, an L2 flush before every timed run (so each run
// reads its inputs from HBM, as a real model would), and the median of many runs. time_step is the
// one way a course step is timed: fa2 bench, its ladder preset and fa2 run all call it.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

#include "fa/registry.h"
#include "library/median.h"  // median()

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

// Runs `fn(stream)` warmup + iters times and times each of the last `iters` runs on its own: all
// of them queued back to back behind a spin kernel (spin_on_stream), each after its L2 flush, as
// scripts/compare.py times PyTorch. Throws on any CUDA error.
Timing time_on_stream(const std::function<void(cudaStream_t)>& fn, const TimingOptions& opt,
                      cudaStream_t stream = nullptr);

// How long the spin in front of the timed runs lasts: far longer than the host takes to queue
// them (a few microseconds a run), so none of them waits on the host.
constexpr double kQueueSpinMs = 10.0;

// Queues one kernel that keeps the GPU busy for `ms` milliseconds.
void spin_on_stream(double ms, cudaStream_t stream);

// Times `step.forward(p)`; a step that refuses `p` throws std::runtime_error with its message.
Timing time_step(const StepInfo& step, const AttentionParams& p, const TimingOptions& opt,
                 cudaStream_t stream = nullptr);

// A sweep point whose single run takes `probe_ms` gets fewer runs when `iters` of them would take
// longer than `budget_ms`: a 600 ms kernel's median is as steady over 5 runs as a 0.5 ms kernel's
// over 30, and the slow steps would otherwise dominate the whole sweep. Never fewer than
// `min_iters` timed runs (nor more than asked); warm-ups shrink to a quarter of the budget, keeping at
// least one if any were asked for. budget_ms <= 0 or an unknown probe (<= 0) keeps `opt`.
TimingOptions fit_to_budget(TimingOptions opt, double probe_ms, double budget_ms, int min_iters = 5);

}  // namespace fa
