// What the production backwards share (kernels/bwd_mma.cu, kernels/bwd_hopper.cu): the two small
// kernels around the main one and the order of the launches. Only the main kernel differs
// between mma.sync and Hopper.
//
//   1. preprocess   D_i = rowsum(dO_i ∘ O_i), and the LSE in exp2 units, per query row; dQ's
//                   accumulator zeroed; with sinks, their gradient from D and the LSE (sink_grad)
//   2. main kernel  dK, dV per KV tile; dQ added into its fp32 accumulator
//   3. convert      dQ = the accumulator, rounded to the gradients' type (bf16 or fp16)
//
// and two pieces of the main kernels that do not depend on how they multiply:
//   load_work_item  the cp.async copies of one work item (a Q tile of one query head): Q, dO, and
//                   its rows' LSE and D
//   DqTurn          the deterministic mode's turnstile around a block's dQ additions
//
// Everything they need beyond the call's tensors is the caller's workspace
// (include/fa/params.h, backward_workspace): no allocation inside the call.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "device/ptx/cp_async.h"
#include "device/ptx/mma.h"   // exp2_approx
#include "device/ptx/sm90.h"  // named_barrier_sync
#include "device/ptx/sync.h"
#include "device/row_slice.h"
#include "device/smem_tile.h"
#include "fa/registry.h"
#include "kernels/launch.h"
#include "library/cuda_status.h"
#include "library/launch_limits.h"

namespace fa::kernels::bwd_common {
namespace {

using bf16 = __nv_bfloat16;

// The two streaming kernels (the preprocess and the convert) move whole rows of (B, H_q, N_q,
// HEAD_DIM) tensors and do almost no arithmetic: their time is their bytes over the memory's rate
// (step 25). A quad of four lanes per row (device/row_slice.h), 16-byte accesses; a block is
// kStreamRows rows of one (batch, query head), grid = (⌈N_q / kStreamRows⌉, B·H_q over y and z).
constexpr int kStreamThreads = 256;
constexpr int kStreamRows = kStreamThreads / kRowLanes;  // 64 rows per block

inline dim3 stream_grid(const AttentionParams& p) {
  const int64_t bh = p.batch * p.heads_q;  // y holds up to 65535 (batch, head) pairs, z the rest
  return dim3(unsigned(cdiv(p.seqlen_q, kStreamRows)), unsigned(std::min<int64_t>(bh, kMaxGridYZ)),
              unsigned(cdiv(bh, kMaxGridYZ)));
}

// 1. D_i = rowsum(dO_i ∘ O_i) in fp32, a quad per query row, into the workspace's contiguous
// (B, H_q, N_q) array; dQ's fp32 accumulator row zeroed in the same pass (the main kernel adds
// into it). Beside D, the row's LSE in exp2 units (LSE·log2 e, and +inf for a row that saw no key,
// so that its P is 0 and not NaN), which the main kernel copies as it is.
// T: the element type of O and dO (bf16, or fp16 where the build has it).
template <int HEAD_DIM, typename T = bf16>
__global__ void __launch_bounds__(kStreamThreads)
    preprocess_kernel(const BackwardParams bp, float* delta, float* lse2, float* dq_accum) {
  const AttentionParams& p = bp.fwd;
  const int64_t bh = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  if (bh >= p.batch * p.heads_q) return;  // the few spare blocks of the last z slice
  const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
  const int n_q = int(p.seqlen_q), lane = row_lane();
  const int row_in_head = int(blockIdx.x) * kStreamRows + int(threadIdx.x) / kRowLanes;
  const bool valid = row_in_head < n_q;
  // A quad past N_q computes on the head's last row and stores nothing: row_sum's shuffles need
  // the whole warp.
  const int64_t i = valid ? row_in_head : n_q - 1;
  float o[row_slice_size<HEAD_DIM>()], d_o[row_slice_size<HEAD_DIM>()];
  load_row_slice(static_cast<const T*>(p.o) + b * p.o_stride.batch + h * p.o_stride.head + i * p.o_stride.seq, lane, o);
  load_row_slice(static_cast<const T*>(bp.d_o) + b * bp.do_stride.batch + h * bp.do_stride.head + i * bp.do_stride.seq,
                 lane, d_o);
  const float sum = row_sum(dot_slice(o, d_o));
  if (!valid) return;
  const int64_t row = bh * n_q + i;
  const float zero[row_slice_size<HEAD_DIM>()] = {};
  store_row_slice(dq_accum + row * HEAD_DIM, lane, zero);
  if (lane == 0) {
    delta[row] = sum;
    const float lse = p.lse[row];
    lse2[row] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

// 1b. With sinks: dsinks[h] = −Σ_{b, i} 2^(c₂·sink − lse₂_i)·D_i over head h's rows of every batch
// entry (c₂ = log₂ e: the sink is a logit), from the preprocess's D and LSE copy. One block per
// head, each thread a fixed stride of the rows, then a fixed tree: the same sum, bit for bit, on
// every run (no atomics), so the deterministic mode needs nothing more.
constexpr int kSinkThreads = 256;
__global__ void __launch_bounds__(kSinkThreads)
    sink_grad_kernel(const BackwardParams bp, const float* delta, const float* lse2) {
  const AttentionParams& p = bp.fwd;
  const int64_t h = blockIdx.x, n_q = p.seqlen_q;
  const float sink2 = p.sinks[h] * kLog2e;
  float sum = 0.0f;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t row0 = (b * p.heads_q + h) * n_q;
    for (int64_t i = threadIdx.x; i < n_q; i += kSinkThreads)
      sum += ptx::exp2_approx(sink2 - lse2[row0 + i]) * delta[row0 + i];
  }
  __shared__ float partial[kSinkThreads];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kSinkThreads / 2; width > 0; width /= 2) {
    if (int(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) bp.dsinks[h] = -partial[0];
}

// 3. dQ from its fp32 accumulator (contiguous (B, H_q, N_q, D)) into the caller's dQ (T), a quad
// per row.
template <int HEAD_DIM, typename T = bf16>
__global__ void __launch_bounds__(kStreamThreads) convert_dq_kernel(const BackwardParams bp, const float* dq_accum) {
  const AttentionParams& p = bp.fwd;
  const int64_t bh = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  const int64_t i = int64_t(blockIdx.x) * kStreamRows + threadIdx.x / kRowLanes;
  if (bh >= p.batch * p.heads_q || i >= p.seqlen_q) return;
  const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
  float dq[row_slice_size<HEAD_DIM>()];
  load_row_slice(dq_accum + (bh * p.seqlen_q + i) * HEAD_DIM, row_lane(), dq);
  store_row_slice(static_cast<T*>(bp.dq) + b * bp.dq_stride.batch + h * bp.dq_stride.head + i * bp.dq_stride.seq,
                  row_lane(), dq);
}

/// Issues the copies of one work item, query head h's Q tile m_block of batch b: its Q and dO rows
/// into q_t and do_t (rows past N_q as zeros: their scores are masked, so their P is 0), and its
/// rows' LSE (exp2 units) and D into lse_d, BLOCK_M floats each, LSE first. All NUM_THREADS
/// threads call it; the copies join their current cp.async group. The mma.sync backward's (step 23's
/// copies); the Hopper backward loads through a producer warp (step 34).
template <int NUM_THREADS, int BLOCK_M, typename Layout, typename Elem>
__device__ __forceinline__ void load_work_item(const BackwardParams& bp, int64_t b, int64_t h, int m_block,
                                               tile::SmemTile<BLOCK_M, Layout, Elem> q_t,
                                               tile::SmemTile<BLOCK_M, Layout, Elem> do_t, float* lse_d,
                                               const float* lse2, const float* delta) {
  const AttentionParams& params = bp.fwd;
  const int n_q = int(params.seqlen_q), m_start = m_block * BLOCK_M;
  const Elem* q_head = static_cast<const Elem*>(params.q) + b * params.q_stride.batch + h * params.q_stride.head;
  const Elem* do_head = static_cast<const Elem*>(bp.d_o) + b * bp.do_stride.batch + h * bp.do_stride.head;
  tile::load_tile_async<NUM_THREADS>(q_t, q_head + int64_t(m_start) * params.q_stride.seq, params.q_stride.seq,
                                     min(BLOCK_M, n_q - m_start));
  tile::load_tile_async<NUM_THREADS>(do_t, do_head + int64_t(m_start) * bp.do_stride.seq, bp.do_stride.seq,
                                     min(BLOCK_M, n_q - m_start));
  const int64_t row0 = (b * params.heads_q + h) * n_q + m_start;
  for (int i = int(threadIdx.x); i < 2 * BLOCK_M; i += NUM_THREADS) {
    const int r = i % BLOCK_M;
    const bool valid = m_start + r < n_q;
    const float* src = (i < BLOCK_M ? lse2 : delta) + (valid ? row0 + r : 0);
    ptx::cp_async_4(uint32_t(__cvta_generic_to_shared(lse_d + i)), src, valid);
  }
}

/// The deterministic mode's turn on a Q tile's dQ (step 18's turnstiles): the KV tiles that see a
/// Q tile are first, first + 1, ..., some last one (first = 0 but under a sliding window: the Mask's
/// kv_tile_first), so block n_block's turn is n_block − first. wait() before the
/// block's additions (one thread spins with acquire, then the threads that add pass a barrier);
/// pass() after them (a barrier, then one thread releases the next turn). Each element of dQ then
/// receives its additions in the same order on every run. Without DETERMINISTIC, both are empty.
/// The threads that add are the whole block (BARRIER_THREADS = 0: __syncthreads, thread 0 holds the
/// turn), or, in a warp-specialised kernel, BARRIER_THREADS of them meeting at named barrier
/// BARRIER_ID, their first (thread LEADER) holding the turn.
template <bool DETERMINISTIC, int BARRIER_ID = 0, int BARRIER_THREADS = 0, int LEADER = 0>
struct DqTurn {
  int* turnstile;
  int turn;
  __device__ __forceinline__ static void barrier() {
    if constexpr (BARRIER_THREADS == 0)
      __syncthreads();
    else
      ptx::named_barrier_sync(BARRIER_ID, BARRIER_THREADS);
  }
  __device__ __forceinline__ void wait() const {
    if constexpr (DETERMINISTIC) {
      if (threadIdx.x == LEADER)
        while (ptx::ld_acquire_gpu(turnstile) != turn) {
        }
      barrier();  // every thread that adds is after the acquire
    }
  }
  __device__ __forceinline__ void pass() const {
    if constexpr (DETERMINISTIC) {
      barrier();  // every warp's additions are issued before the turn is passed on
      if (threadIdx.x == LEADER) ptx::st_release_gpu(turnstile, turn + 1);
    }
  }
};

// The backward's grids: the main kernel's B·H_kv along y. The streaming kernels' B·H_q over y and z
// holds up to 65535², the bound validate() already puts on B·H_q (Capabilities::max_batch_heads).
Status check_backward_grids(const AttentionParams& p) {
  if (p.batch * p.heads_kv > kMaxGridYZ)
    return Status::Unsupported("the backward's grid holds B·H_kv up to 65535 (got " +
                               std::to_string(p.batch * p.heads_kv) + ")");
  return Status::Ok();
}

/// The workspace's parts (include/fa/params.h): dQ's fp32 accumulator, D, the turnstiles, and the
/// LSE in exp2 units.
struct Buffers {
  float* dq_accum;
  float* delta;
  int* turnstiles;
  float* lse2;
};

/// Zeroes the deterministic mode's turnstiles, runs the preprocess (which zeroes dQ's accumulator), then
/// `main(buffers)` (which launches the main kernel and returns its Status), then the convert. The
/// caller checks everything that can refuse the call (shared memory, grids) before: once this
/// starts, the caller's dQ, dK and dV are being written.
template <int HEAD_DIM, typename T = bf16, typename Main>
Status run(const BackwardParams& bp, cudaStream_t stream, Main&& main) {
  const AttentionParams& p = bp.fwd;
  const BackwardWorkspace ws = backward_workspace(p);
  char* const base = static_cast<char*>(bp.workspace);
  const Buffers buffers{reinterpret_cast<float*>(base + ws.dq_accum), reinterpret_cast<float*>(base + ws.delta),
                        reinterpret_cast<int*>(base + ws.turnstiles), reinterpret_cast<float*>(base + ws.lse2)};
  if (bp.deterministic)
    FA_CUDA_RETURN(cudaMemsetAsync(buffers.turnstiles, 0, ws.turnstile_count * sizeof(int), stream));
  preprocess_kernel<HEAD_DIM, T>
      <<<stream_grid(p), kStreamThreads, 0, stream>>>(bp, buffers.delta, buffers.lse2, buffers.dq_accum);
  FA_LAUNCH_RETURN();
  if (p.sinks) {
    sink_grad_kernel<<<unsigned(p.heads_q), kSinkThreads, 0, stream>>>(bp, buffers.delta, buffers.lse2);
    FA_LAUNCH_RETURN();
  }
  if (Status st = main(buffers); !st.ok()) return st;
  convert_dq_kernel<HEAD_DIM, T><<<stream_grid(p), kStreamThreads, 0, stream>>>(bp, buffers.dq_accum);
  FA_LAUNCH_RETURN();
  return Status::Ok();
}

}  // namespace
}  // namespace fa::kernels::bwd_common
