// Step 06 — autotuning: the tile sizes and the pipeline depth become template parameters, a
// small compile-time list of configurations is built per head dim, and a run-time tuner times
// every configuration the GPU can run the first time it sees a problem key, then reuses the winner.
//
// What changed since step 05:
//  - BLOCK_M, BLOCK_N and STAGES come from a Config type; warps = BLOCK_M / 16 (each warp still
//    owns 16 query rows). The kernel body is unchanged.
//  - kConfigs64 / kConfigs128: four configurations per head dim (CI compiles all of them, so the
//    list stays short). Those needing more shared memory than the GPU allows per block are
//    filtered out at run time (e.g. 99 KiB on sm_86/sm_89, 227 KiB on sm_90).
//  - choose_config(): FA_AUTOTUNE=0 → a documented heuristic; otherwise the cache (memory, then
//    the file FA_AUTOTUNE_CACHE) by a key of shape, GPU and build id; on a miss, every valid
//    config is timed on SCRATCH output buffers (the caller's O is only written by the winner).
//  - The build id (a hash of this file's path and compile time) is part of the key: a rebuilt
//    kernel never reuses timings of the old one (seed bug #10, stale autotune cache).
// What it costs: four kernels per head dim to compile, and the first call of each new shape runs
// every configuration six times before it returns (about 0.2 s at B = 1, H = 16, N = 16k, D = 128).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/autotune.h"
#include "common/cuda_check.h"
#include "common/mask.h"
#include "common/ptx/cp_async.h"
#include "common/ptx/ldmatrix.h"
#include "common/ptx/mma.h"
#include "common/ptx/swizzle.h"
#include "common/tiles.h"
#include "fa/registry.h"
#include "fa/steps.h"

namespace fa::step06 {
namespace {

using bf16 = __nv_bfloat16;
using namespace fa::ptx;

// One kernel configuration: query rows per block, keys per K/V tile, K/V tiles in flight.
template <int BLOCK_M_, int BLOCK_N_, int STAGES_>
struct Config {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int STAGES = STAGES_;
  static constexpr int NUM_WARPS = BLOCK_M / 16;  // each warp owns 16 query rows
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  // Shared memory: the Q tile, then STAGES × (K tile, V tile), all (rows, HEAD_DIM) bf16 swizzled.
  template <int HEAD_DIM>
  static constexpr int smem_bytes() {
    return (BLOCK_M + STAGES * 2 * BLOCK_N) * HEAD_DIM * int(sizeof(bf16));
  }
};

// Copies ROWS × HEAD_DIM bf16 from global memory (row stride `stride` elements) into a swizzled
// shared tile with cp.async, one 16-byte chunk per copy. Rows >= valid_rows are zero-filled: a
// ragged last tile never holds stale data (V) or NaN (0 × NaN would poison P·V).
// All threads together copy ROWS_PER_PASS rows per pass; as that is a multiple of 8, a thread's
// chunk has the same swizzle in every pass and its shared address just steps by a constant.
template <int ROWS, int HEAD_DIM, int NUM_THREADS>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* src, int64_t stride, int valid_rows) {
  constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
  constexpr int ROWS_PER_PASS = NUM_THREADS / CHUNKS;
  static_assert(ROWS % ROWS_PER_PASS == 0 && ROWS_PER_PASS % 8 == 0, "tile must split evenly over the threads");
  const int row0 = int(threadIdx.x) / CHUNKS, col = (int(threadIdx.x) % CHUNKS) * 8;
  const uint32_t smem0 = smem_u32(tile + swizzled_offset(row0, col, HEAD_DIM));
#pragma unroll
  for (int pass = 0; pass < ROWS / ROWS_PER_PASS; ++pass) {
    const int row = row0 + pass * ROWS_PER_PASS;
    const bool valid = row < valid_rows;
    const bf16* g = src + (valid ? row * stride + col : 0);
    cp_async_16(smem0 + pass * ROWS_PER_PASS * HEAD_DIM * int(sizeof(bf16)), g, valid);
  }
}

template <int HEAD_DIM, typename Cfg>
__global__ void __launch_bounds__(Cfg::NUM_THREADS)
    attention_kernel(const AttentionParams params, const float scale_log2, const int64_t offset) {
  static_assert(HEAD_DIM % 64 == 0, "the swizzle needs rows of at least 8 chunks of 16 bytes");
  constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, STAGES = Cfg::STAGES;
  constexpr int NUM_THREADS = Cfg::NUM_THREADS;
  extern __shared__ uint4 smem[];                // uint4: 16-byte aligned, as cp.async and ldmatrix need
  bf16* q_tile = reinterpret_cast<bf16*>(smem);  // (BLOCK_M, HEAD_DIM) bf16
  bf16* kv_tiles = q_tile + BLOCK_M * HEAD_DIM;  // STAGES × [(BLOCK_N, HEAD_DIM) K, then V]

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int n_q = int(params.seqlen_q), n_kv = int(params.seqlen_kv);

  // ---- pointers: grid = (Q tiles, B·H_q); 64-bit offsets, every tensor through its own strides.
  // Causal: the last Q tiles have the most keys to visit, so they are issued first.
  const int m_block = params.causal ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
  // B·H_q may exceed the grid's y limit (65535); the launcher then continues it along z.
  const int64_t bh = blockIdx.y + int64_t(blockIdx.z) * gridDim.y;
  if (bh >= params.batch * params.heads_q) return;  // the few spare blocks of the last z slice
  const int64_t b = bh / params.heads_q, h = bh % params.heads_q;
  const int64_t h_kv = kv_head_of(h, params.heads_q, params.heads_kv);
  const int m_start = m_block * BLOCK_M;
  const bf16* q_ptr = static_cast<const bf16*>(params.q) + b * params.q_stride.batch + h * params.q_stride.head +
                      int64_t(m_start) * params.q_stride.seq;
  const bf16* k_ptr = static_cast<const bf16*>(params.k) + b * params.k_stride.batch + h_kv * params.k_stride.head;
  const bf16* v_ptr = static_cast<const bf16*>(params.v) + b * params.v_stride.batch + h_kv * params.v_stride.head;
  bf16* o_ptr = static_cast<bf16*>(params.o) + b * params.o_stride.batch + h * params.o_stride.head +
                int64_t(m_start) * params.o_stride.seq;
  const bool causal = params.causal;  // key j visible to row i iff j <= i + offset
  const int n_blocks = kv_tile_end(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);  // stop at the diagonal
  const int first_masked = kv_tile_first_masked(m_start, BLOCK_M, BLOCK_N, n_kv, causal, offset);

  // Issues the copies of K/V tile n_block into ring buffer n_block % STAGES.
  auto load_kv = [&](int n_block) {
    bf16* k_tile = kv_tiles + (n_block % STAGES) * 2 * BLOCK_N * HEAD_DIM;
    bf16* v_tile = k_tile + BLOCK_N * HEAD_DIM;
    const int n_start = n_block * BLOCK_N;
    const int rows = min(BLOCK_N, n_kv - n_start);
    load_tile<BLOCK_N, HEAD_DIM, NUM_THREADS>(k_tile, k_ptr + n_start * params.k_stride.seq, params.k_stride.seq, rows);
    load_tile<BLOCK_N, HEAD_DIM, NUM_THREADS>(v_tile, v_ptr + n_start * params.v_stride.seq, params.v_stride.seq, rows);
  };

  // ---- load Q: one cp.async group for Q, then the first STAGES-1 K/V tiles start flying too.
  load_tile<BLOCK_M, HEAD_DIM, NUM_THREADS>(q_tile, q_ptr, params.q_stride.seq, min(BLOCK_M, n_q - m_start));
  cp_async_commit();
  for (int stage = 0; stage < STAGES - 1; ++stage) {
    if (stage < n_blocks) load_kv(stage);
    cp_async_commit();  // an empty group is fine: it keeps the group count the same everywhere
  }
  cp_async_wait<STAGES - 1>();  // the oldest group, Q, has landed (K/V may still be in flight)
  __syncthreads();              // ... for every thread's copies
  // This warp's 16 rows of Q as A fragments, in registers for the whole KV loop.
  uint32_t q_frag[HEAD_DIM / 16][4];
  const unsigned q_off = 2 * swizzled_offset(warp * 16 + ldsm_a_row(lane), ldsm_a_colblock(lane) * 8, HEAD_DIM);
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
    ldmatrix_x4(q_frag[kk], smem_u32(q_tile) + swizzle_move_right(q_off, kk * 16));

  // ---- init state: this lane's share of rows g = lane/4 (index 0) and g + 8 (index 1).
  float o_i[HEAD_DIM / 8][4];  // (16, HEAD_DIM) fp32 per warp as HEAD_DIM/8 accumulator tiles
#pragma unroll
  for (int dt = 0; dt < HEAD_DIM / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_i[dt][e] = 0.0f;
  float m_i[2] = {-INFINITY, -INFINITY};  // running row max, in raw score units (fp32)
  float l_i[2] = {0.0f, 0.0f};            // running row sum over THIS lane's columns (fp32);
                                          // the 4 lanes of a row are summed once, at the end

  // Byte offsets of this lane's ldmatrix rows in a K and a V tile, for the first 16×16 block. The
  // other blocks are compile-time steps away: 16 rows down = + 16·HEAD_DIM·2 bytes, 16 columns
  // right = XOR (swizzle_move_right). Computed once, they cost no registers inside the loop.
  const unsigned k_off = 2 * swizzled_offset(ldsm_k_row(lane), ldsm_k_colblock(lane) * 8, HEAD_DIM);
  const unsigned v_off = 2 * swizzled_offset(ldsm_v_row(lane), ldsm_v_colblock(lane) * 8, HEAD_DIM);
  constexpr unsigned ROWS16_BYTES = 16 * HEAD_DIM * sizeof(bf16);

  // ---- KV loop
  for (int n_block = 0; n_block < n_blocks; ++n_block) {
    cp_async_wait<STAGES - 2>();  // tile n_block has landed (this thread's copies)
    __syncthreads();              // everyone's copies; and everyone is done reading tile n_block-1
    if (n_block + STAGES - 1 < n_blocks) load_kv(n_block + STAGES - 1);  // into the buffer just freed
    cp_async_commit();

    const bf16* k_tile = kv_tiles + (n_block % STAGES) * 2 * BLOCK_N * HEAD_DIM;  // (BLOCK_N, HEAD_DIM)
    const bf16* v_tile = k_tile + BLOCK_N * HEAD_DIM;                             // (BLOCK_N, HEAD_DIM)

    // S = Q·Kᵀ on tensor cores: (16, HEAD_DIM) × (HEAD_DIM, BLOCK_N) per warp, fp32 accumulators.
    float s[BLOCK_N / 8][4];  // (16, BLOCK_N) fp32 as BLOCK_N/8 accumulator tiles
#pragma unroll
    for (int nt = 0; nt < BLOCK_N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
      uint32_t k_frag[BLOCK_N / 16][4];  // B fragments of key tiles 2nn and 2nn+1 (16 keys × 16 dims)
#pragma unroll
      for (int nn = 0; nn < BLOCK_N / 16; ++nn)
        ldmatrix_x4(k_frag[nn], smem_u32(k_tile) + nn * ROWS16_BYTES + swizzle_move_right(k_off, kk * 16));
#pragma unroll
      for (int nn = 0; nn < BLOCK_N / 16; ++nn) {
        mma_bf16_16816(s[2 * nn], q_frag[kk], k_frag[nn][0], k_frag[nn][1]);
        mma_bf16_16816(s[2 * nn + 1], q_frag[kk], k_frag[nn][2], k_frag[nn][3]);
      }
    }
    // The mask, on the tiles that need it only: straddling the diagonal, or holding keys past
    // N_kv. Masked scores become -inf BEFORE the row max, so the max is over visible keys only.
    if (n_block >= first_masked) {
      const int n_start = n_block * BLOCK_N;
#pragma unroll
      for (int nt = 0; nt < BLOCK_N / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = m_start + warp * 16 + mma_c_row(lane, e);
          const int col = n_start + nt * 8 + mma_c_col(lane, e);
          const bool visible = col < n_kv && (!causal || causal_visible(row, col, offset));
          if (!visible) s[nt][e] = -INFINITY;
        }
    }

    // Online softmax, per row: new max, rescale factor for the old state, P = 2^(c·s − c·m).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m_new = m_i[r];
#pragma unroll
      for (int nt = 0; nt < BLOCK_N / 8; ++nt) m_new = fmaxf(m_new, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      // The 4 lanes of a quad hold the row's columns: combine their maxima.
      m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
      m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
      // A row that has seen only -inf keeps m = -inf; use 0 then, so -inf − (−inf) never makes NaN.
      const float m_scaled = m_new == -INFINITY ? 0.0f : m_new * scale_log2;
      const float alpha = exp2_approx(m_i[r] * scale_log2 - m_scaled);  // 0 on the first tile
      m_i[r] = m_new;
      float row_sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < BLOCK_N / 8; ++nt)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[nt][e] = exp2_approx(s[nt][e] * scale_log2 - m_scaled);  // one FFMA + one MUFU.EX2
          row_sum += s[nt][e];
        }
      l_i[r] = l_i[r] * alpha + row_sum;
#pragma unroll
      for (int dt = 0; dt < HEAD_DIM / 8; ++dt) {
        o_i[dt][2 * r] *= alpha;
        o_i[dt][2 * r + 1] *= alpha;
      }
    }

    // P in bf16, straight from the S accumulators (same layout as an A fragment, no shuffles).
    uint32_t p[BLOCK_N / 16][4];  // (16, BLOCK_N) bf16 as BLOCK_N/16 A fragments
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
      accumulators_to_a(p[kk], s[2 * kk], s[2 * kk + 1]);
    }

    // O += P·V on tensor cores: (16, BLOCK_N) × (BLOCK_N, HEAD_DIM), accumulating into fp32 o_i.
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
#pragma unroll
      for (int dd = 0; dd < HEAD_DIM / 16; ++dd) {
        uint32_t v_frag[4];  // B fragments of dim tiles 2dd and 2dd+1 (16 keys × 16 dims), transposed
        ldmatrix_x4_trans(v_frag, smem_u32(v_tile) + kk * ROWS16_BYTES + swizzle_move_right(v_off, dd * 16));
        mma_bf16_16816(o_i[2 * dd], p[kk], v_frag[0], v_frag[1]);
        mma_bf16_16816(o_i[2 * dd + 1], p[kk], v_frag[2], v_frag[3]);
      }
    }
  }

  // ---- normalise: finish the row sums across the quad, then one divide per row (deferred).
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_i[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv_l[r] = l > 0.0f ? 1.0f / l : 0.0f;  // l = 0 only if a row saw no key: O = 0, not NaN
  }

  // ---- store: bf16 pairs straight from the accumulators; rows past N_q are not written.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + lane / 4 + 8 * r;
    if (m_start + row >= n_q) continue;
    bf16* o_row = o_ptr + row * params.o_stride.seq;
#pragma unroll
    for (int dt = 0; dt < HEAD_DIM / 8; ++dt)
      *reinterpret_cast<uint32_t*>(o_row + dt * 8 + mma_c_col(lane, 0)) =
          pack_bf16x2(o_i[dt][2 * r] * inv_l[r], o_i[dt][2 * r + 1] * inv_l[r]);
  }
}

template <int HEAD_DIM, typename Cfg>
Status launch(const AttentionParams& p, cudaStream_t stream) {
  constexpr int smem = Cfg::template smem_bytes<HEAD_DIM>();
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = p.effective_scale() * kLog2e;  // p = 2^(scale_log2·(s − m))
  // Above 48 KiB of dynamic shared memory a kernel must opt in explicitly.
  FA_CUDA_RETURN(
      cudaFuncSetAttribute(attention_kernel<HEAD_DIM, Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t bh = p.batch * p.heads_q;  // y holds up to 65535 (batch, head) pairs, z the rest
  const dim3 grid(unsigned(cdiv(p.seqlen_q, Cfg::BLOCK_M)), unsigned(std::min<int64_t>(bh, 65535)),
                  unsigned(cdiv(bh, 65535)));
  attention_kernel<HEAD_DIM, Cfg><<<grid, Cfg::NUM_THREADS, smem, stream>>>(p, scale_log2, p.causal_offset());
  FA_LAUNCH_RETURN();
  return Status::Ok();
}

// ---- the configurations -----------------------------------------------------------------------

struct ConfigEntry {
  int block_m, block_n, stages, smem_bytes;
  Status (*launch)(const AttentionParams&, cudaStream_t);
  std::string name() const {
    return "BLOCK_M=" + std::to_string(block_m) + " BLOCK_N=" + std::to_string(block_n) +
           " warps=" + std::to_string(block_m / 16) + " stages=" + std::to_string(stages);
  }
};

template <int HEAD_DIM, typename Cfg>
constexpr ConfigEntry entry() {
  return {Cfg::BLOCK_M, Cfg::BLOCK_N, Cfg::STAGES, Cfg::template smem_bytes<HEAD_DIM>(), &launch<HEAD_DIM, Cfg>};
}

// Four per head dim, the heuristic's choice first. Every entry is compiled for every architecture,
// so each one added costs CI minutes: add one only if some shape on some GPU measurably wins with it.
const ConfigEntry kConfigs64[] = {
    entry<64, Config<64, 64, 3>>(),    // heuristic default: 4 warps, three K/V tiles in flight
    entry<64, Config<64, 128, 2>>(),   // half the barriers and max/sum passes per key
    entry<64, Config<64, 64, 2>>(),    // step 05's tiles
    entry<64, Config<128, 128, 2>>(),  // 8 warps share each K/V tile
};
const ConfigEntry kConfigs128[] = {
    entry<128, Config<128, 64, 2>>(),  // heuristic default: 8 warps share each K/V tile
    entry<128, Config<64, 64, 2>>(),   // step 05's tiles: twice the blocks
    entry<128, Config<64, 64, 3>>(),   // a deeper pipeline
    entry<128, Config<128, 64, 3>>(),  // both (128 KiB of shared memory)
};

std::vector<const ConfigEntry*> configs_for(int64_t head_dim) {
  std::vector<const ConfigEntry*> out;
  if (head_dim == 64)
    for (const ConfigEntry& c : kConfigs64) out.push_back(&c);
  if (head_dim == 128)
    for (const ConfigEntry& c : kConfigs128) out.push_back(&c);
  return out;
}

// The configurations this GPU can launch (opt-in shared memory per block).
std::vector<const ConfigEntry*> valid_configs(int64_t head_dim) {
  const int smem_limit = autotune::current_max_smem_optin();
  std::vector<const ConfigEntry*> out;
  for (const ConfigEntry* c : configs_for(head_dim))
    if (c->smem_bytes <= smem_limit) out.push_back(c);
  return out;
}

// The heuristic (FA_AUTOTUNE=0, or while a stream is being captured into a CUDA graph): the first
// valid entry: BLOCK_M=64 BLOCK_N=64 stages=3 at D=64, BLOCK_M=128 BLOCK_N=64 stages=2 at D=128,
// the configurations that won most often when this step was tuned on an H200 (README.md).
const ConfigEntry* heuristic(const AttentionParams& p) {
  const std::vector<const ConfigEntry*> valid = valid_configs(p.head_dim);
  return valid.empty() ? nullptr : valid.front();
}

// Identifies this compilation of this file. Part of every tuning key, so a rebuilt kernel never
// reuses the timings of an old one.
const std::string kBuildId = autotune::hash_hex(__FILE__ " " __DATE__ " " __TIME__);

autotune::Key make_key(const AttentionParams& p) {
  autotune::Key key = autotune::shape_key(p);
  key.gpu = autotune::current_gpu_name();
  key.build_id = kBuildId;  // seed bug #10: without it, timings of an old build are reused
  return key;
}

autotune::Cache& cache() {
  static autotune::Cache c(autotune::default_cache_path());
  return c;
}

const ConfigEntry* find_by_name(int64_t head_dim, const std::string& name) {
  for (const ConfigEntry* c : valid_configs(head_dim))
    if (c->name() == name) return c;
  return nullptr;
}

// Times every valid config on scratch outputs (never the caller's O or LSE), caches the winner.
const ConfigEntry* tune(const AttentionParams& p, const autotune::Key& key, cudaStream_t stream) {
  const std::vector<const ConfigEntry*> valid = valid_configs(p.head_dim);
  AttentionParams t = p;
  void* scratch_o = nullptr;
  float* scratch_lse = nullptr;
  const size_t o_elems = size_t(p.batch * p.heads_q * p.seqlen_q * p.head_dim);
  if (cudaMallocAsync(&scratch_o, o_elems * sizeof(bf16), stream) != cudaSuccess ||
      (p.lse && cudaMallocAsync(reinterpret_cast<void**>(&scratch_lse),
                                size_t(p.batch * p.heads_q * p.seqlen_q) * sizeof(float), stream) != cudaSuccess)) {
    cudaGetLastError();
    if (scratch_o) cudaFreeAsync(scratch_o, stream);
    return heuristic(p);  // no memory to tune with: do not fail the call
  }
  t.o = scratch_o;
  t.o_stride = bhnd_strides(p.heads_q, p.seqlen_q, p.head_dim);
  t.lse = p.lse ? scratch_lse : nullptr;
  std::vector<autotune::Candidate> candidates;
  for (const ConfigEntry* c : valid)
    candidates.push_back({c->name(), [c, t](cudaStream_t s) { return c->launch(t, s); }});
  const autotune::Timings timings = autotune::time_candidates(candidates, stream, 5, key.str());
  cudaFreeAsync(scratch_o, stream);
  if (scratch_lse) cudaFreeAsync(scratch_lse, stream);
  if (timings.best < 0) return heuristic(p);
  const ConfigEntry* best = valid[size_t(timings.best)];
  cache().put(key, best->name(), timings.median_ms[size_t(timings.best)]);
  return best;
}

const ConfigEntry* choose_config(const AttentionParams& p, cudaStream_t stream) {
  if (!autotune::enabled()) return heuristic(p);
  const autotune::Key key = make_key(p);
  if (std::optional<std::string> hit = cache().find(key))
    if (const ConfigEntry* c = find_by_name(p.head_dim, *hit)) return c;
  // Timing synchronises the stream, which is not allowed while it is captured into a graph.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return heuristic(p);
  }
  return tune(p, key, stream);
}

const Capabilities kCaps = [] {
  Capabilities c;
  c.head_dims = {64, 128};
  c.causal = true;
  c.lse = false;
  c.gqa = true;
  c.tensor_cores = true;
  return c;
}();

std::string describe(const AttentionParams& p) {
  if (!autotune::enabled()) {
    const ConfigEntry* c = heuristic(p);
    return c ? c->name() + " (heuristic, FA_AUTOTUNE=0)" : "";
  }
  if (std::optional<std::string> hit = cache().find(make_key(p))) return *hit + " (tuned)";
  const ConfigEntry* c = heuristic(p);
  return c ? c->name() + " (not tuned yet; heuristic)" : "";
}

}  // namespace

Status forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  if (Status st = check_tile_limits(p, 64); !st.ok()) return st;
  const ConfigEntry* c = choose_config(p, stream);
  if (!c) return Status::Error("no kernel configuration of step 06 fits this GPU's shared memory per block");
  return c->launch(p, stream);
}

std::string tuning_key(const AttentionParams& p) {
  return make_key(p).str();
}

std::string build_id() {
  return kBuildId;
}

std::vector<std::string> config_names(int head_dim) {
  std::vector<std::string> names;
  for (const ConfigEntry* c : configs_for(head_dim)) names.push_back(c->name());
  return names;
}

Status forward_with_config(const AttentionParams& p, const std::string& config, cudaStream_t stream) {
  if (Status st = validate(p, kCaps); !st.ok()) return st;
  if (Status st = check_tile_limits(p, 64); !st.ok()) return st;
  for (const ConfigEntry* c : configs_for(p.head_dim))
    if (c->name() == config) {
      if (c->smem_bytes > autotune::current_max_smem_optin())
        return Status::Error("config '" + config + "' needs more shared memory than this GPU allows per block");
      return c->launch(p, stream);
    }
  return Status::Error("step 06 has no config '" + config + "' for head dim " + std::to_string(p.head_dim));
}

namespace {
const StepRegistrar registrar({6, "autotune",
                               "compile-time configs (BLOCK_M, BLOCK_N, warps, stages), run-time tuner cached by "
                               "shape, GPU and build",
                               kCaps, &forward, &describe});
}  // namespace

}  // namespace fa::step06
