// The median of a set of timings: what the tuner and the benchmark both report (robust to the
// odd slow run on a shared GPU, unlike the mean).
#pragma once

#include <algorithm>
#include <vector>

namespace fa {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace fa
