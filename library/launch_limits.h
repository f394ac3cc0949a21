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
  return Status::Error("this step would launch a grid of (" + std::to_string(x) + ", " + std::to_string(y) + ", " +
                       std::to_string(z) + ") blocks; CUDA allows at most (2147483647, 65535, 65535)");
}

/// Launch limits of the tensor-core steps: row indices are 32-bit (all memory offsets are 64-bit),
/// B·H_q spreads over the grid's y and z (at most 65535² pairs). An error Status names the limit.
inline Status check_tile_limits(const AttentionParams& p, int block_m) {
  constexpr int64_t kMaxRows = int64_t(1) << 30;
  if (p.seqlen_q >= kMaxRows || p.seqlen_kv >= kMaxRows)
    return Status::Error("invalid attention input: N_q and N_kv must be below 2^30 (got N_q=" +
                         std::to_string(p.seqlen_q) + ", N_kv=" + std::to_string(p.seqlen_kv) + ")");
  if (p.batch * p.heads_q > int64_t(65535) * 65535)
    return Status::Error("invalid attention input: B·H_q must be at most 65535² (got " +
                         std::to_string(p.batch * p.heads_q) + ")");
  (void)block_m;  // N_q < 2^30 keeps N_q / block_m far below the grid's x limit
  return Status::Ok();
}

/// Sets a kernel's dynamic shared memory limit to `bytes` (a kernel must opt in above 48 KiB) once
/// per device and kernel, not on every launch: the attribute call costs host time on each call.
Status opt_in_shared_memory(const void* kernel, int bytes);

}  // namespace fa
