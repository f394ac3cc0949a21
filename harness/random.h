// Counter-based random numbers: value i of stream `seed` is a pure function of (seed, i), so the
// host and the device generate the same tensor, in any order, in parallel.
#pragma once

#include <cmath>
#include <cstdint>

#include "device/mask.h"

namespace fa {

// splitmix64 finaliser: a well-mixed 64-bit hash.
FA_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Standard normal sample number `index` of stream `seed` (Box-Muller on two 32-bit uniforms).
FA_HD float normal_at(uint64_t seed, uint64_t index) {
  uint64_t h = mix64(mix64(seed) ^ (index * 0xD1B54A32D192ED03ull));
  float u1 = (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777217.0f);      // (0, 1]
  float u2 = static_cast<float>((h >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);  // [0, 1)
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

}  // namespace fa
