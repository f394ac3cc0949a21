// Step 01's promise: no buffer that grows with N_q·N_kv. Both tests fail for step 00's design
// (an fp32 score matrix from the stream-ordered pool).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "reference/gpu_reference.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

ProblemShape square(int64_t heads, int64_t n, uint64_t seed) {
  ProblemShape s;
  s.batch = 1;
  s.heads_q = s.heads_kv = heads;
  s.seqlen_q = s.seqlen_kv = n;
  s.head_dim = 64;
  s.seed = seed;
  s.with_lse = false;
  return s;
}

// The high-water mark of the device's default memory pool (where cudaMallocAsync draws from)
// across one call: step 00 takes its N_q·N_kv score buffer from there; step 01 takes nothing.
TEST(Step01Memory, PoolHighWaterMarkStaysFarBelowNSquared) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  const ProblemShape s = square(4, 4096, 0x5eed01);
  AttentionProblem prob(s);
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool;
  FA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  uint64_t zero = 0, high = 0;  // the attribute is a cuuint64_t (a uint64_t)
  FA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  const Status st = step.forward(prob.params(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_TRUE(st.ok()) << st.message();
  FA_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  const double score_bytes = 4.0 * double(s.heads_q) * double(s.seqlen_q) * double(s.seqlen_kv);
  std::cout << "    pool high-water mark " << high << " bytes; an fp32 score matrix would be " << score_bytes
            << " bytes\n";
  EXPECT_LT(double(high), score_bytes / 64) << "the step drew a buffer of order N_q·N_kv from the memory pool";
}

// A shape whose fp32 score matrix is larger than the whole GPU memory: step 00 cannot even
// allocate it, step 01 must run and be right. The fp32 GPU reference checks the first and the
// last 256 query rows of every head against all N_kv keys; every output element must be finite.
TEST(Step01Memory, RunsWhereTheScoreMatrixCannotFit) {
  FA_REQUIRE_GPU();
  const StepInfo& step = testing::the_step();
  size_t free_bytes = 0, total_bytes = 0;
  FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t heads = 4;
  // 4·H·N² = 1.1 × the device memory; odd, so not a multiple of any tile (about 100k on an H200).
  const int64_t n = int64_t(std::ceil(std::sqrt(1.1 * double(total_bytes) / (4.0 * double(heads))))) | 1;
  const ProblemShape s = square(heads, n, 0x5eed02);
  const double score_bytes = 4.0 * double(heads) * double(n) * double(n);
  ASSERT_GT(score_bytes, double(total_bytes));
  std::cout << "    N = " << n << ": an fp32 score matrix would take " << score_bytes / 1e9 << " GB, the GPU has "
            << double(total_bytes) / 1e9 << " GB\n";

  AttentionProblem prob(s);
  const Status st = step.forward(prob.params(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_TRUE(st.ok()) << st.message();
  const std::vector<float> out = prob.output_bhnd();  // (1, H, N, 64)
  size_t nonfinite = 0;
  for (float x : out) nonfinite += !std::isfinite(x);
  EXPECT_EQ(nonfinite, 0u) << "unwritten (NaN-poisoned) or overflowed outputs";

  constexpr int64_t kRows = 256;
  for (int64_t first : {int64_t(0), n - kRows}) {
    AttentionParams view = prob.params();  // query rows [first, first + kRows) of every head, all keys
    view.q = static_cast<const __nv_bfloat16*>(view.q) + first * view.q_stride.seq;
    view.seqlen_q = kRows;
    DeviceBuffer<float> ref_o(size_t(heads * kRows * s.head_dim));
    const Status rs = gpu_reference(view, ref_o.get(), nullptr, nullptr);
    ASSERT_TRUE(rs.ok()) << rs.message();
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> ref = ref_o.download();
    std::vector<float> got;
    for (int64_t h = 0; h < heads; ++h) {
      const float* row0 = out.data() + (h * n + first) * s.head_dim;
      got.insert(got.end(), row0, row0 + kRows * s.head_dim);
    }
    const CompareResult c = compare(got, ref, bf16_tolerance());
    EXPECT_TRUE(c.ok) << "rows [" << first << ", " << first + kRows << "): " << c.summary();
  }
}

}  // namespace
}  // namespace fa
