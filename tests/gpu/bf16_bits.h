// bf16 on the host, as bits: for tests that build tensors byte by byte (the warp-tile model, the
// paged and packed KV tests).
#pragma once

#include <bit>
#include <cstdint>

namespace fa::testing {

// fp32 → bf16 bits rounded to nearest, ties to even (finite x): the CPU model of pack_bf16x2.
inline uint16_t bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_float(uint16_t bits) {
  return std::bit_cast<float>(uint32_t(bits) << 16);
}

}  // namespace fa::testing
