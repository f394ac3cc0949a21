// Stand-in device pointers for the CPU tests of validation (no GPU): 16 TiB apart, so that two of
// them never overlap, and never dereferenced.
#pragma once

#include <cstdint>

namespace fa {

inline void* stand_in(uintptr_t slot) {
  return reinterpret_cast<void*>(slot << 44);
}

}  // namespace fa
