// Launch limits shared by the steps' launchers (host code): the grid's dimensions and the index
// ranges of the tensor-core kernels. A launcher checks them before launching anything, so a refused
// input writes nothing.
#pragma once

#include <cstdint>
#include <string>

#include "fa/params.h"

namespace fa {

// CUDA's grid limits: 2^31 - 1 blocks along x, 65535 along y and z.
constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridYZ = 65535;

// Ok when a grid of (x, y, z) blocks can be launched; otherwise an error that names the limit.
// A launcher calls this before launching anything, so a refused input writes nothing.
inline Status check_grid(int64_t x, int64_t y = 1, int64_t z = 1) {
  if (x >= 1 && x <= kMaxGridX && y >= 1 && y <= kMaxGridYZ && z >= 1 && z <= kMaxGridYZ) return Status::Ok();
  return Status::Unsupported("this step would launch a grid of (" + std::to_string(x) + ", " + std::to_string(y) +
                             ", " + std::to_string(z) + ") blocks; CUDA allows at most (2147483647, 65535, 65535)");
}

/// Launch limits of the tensor-core steps, for their Capabilities (validate checks them): row
/// indices are 32-bit (all memory offsets are 64-bit), and B·H_q spreads over the grid's y and z.
constexpr int64_t kTileMaxSeqlen = (int64_t(1) << 30) - 1;
constexpr int64_t kTileMaxBatchHeads = int64_t(65535) * 65535;

/// Sets a kernel's dynamic shared memory limit to `bytes` (a kernel must opt in above 48 KiB) once
/// per device and kernel, not on every launch: the attribute call costs host time on each call.
/// More than the GPU gives one block is refused as Unsupported, with both numbers.
Status opt_in_shared_memory(const void* kernel, int bytes);

/// Whether `kernel` may be launched early, as a programmatic dependent launch
/// (cudaLaunchAttributeProgrammaticStreamSerialization), on the current device: the GPU is sm_90
/// or later and the kernel's code was compiled for sm_90 or later (its PTX version), so that its
/// ptx::wait_for_prior_grid() is griddepcontrol.wait. A build without sm_90 code runs compute_80
/// PTX on Hopper, JIT-compiled, with no wait: launched early, the kernel could read its
/// predecessor's output while it is written. False when the query fails. Cached per device and kernel.
bool early_launch_allowed(const void* kernel);

/// How many blocks of `kernel` (with `threads` threads and `smem_bytes` of dynamic shared memory)
/// the whole GPU runs at once: a persistent grid's size. Cached per device and configuration.
Status resident_blocks(const void* kernel, int threads, int smem_bytes, int* blocks);

}  // namespace fa
