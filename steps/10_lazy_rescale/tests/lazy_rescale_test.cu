// The warp vote of device/warp_tile.h that step 10's lazy rescale hangs on: any_max_moved is true
// for every lane of the warp as soon as one row of one lane moved its max by more than the
// threshold (in exp2 units), false when none did, and a row still at -inf never counts as moved.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "device/warp_tile.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "tests/gpu/step_suite.h"

namespace fa {
namespace {

constexpr float kScaleLog2 = 0.18033688f;  // log2(e) / sqrt(64)
constexpr float kThreshold = 8.0f;
constexpr int kLanes = 32;

// One warp; lane l's two rows are m[2l] and m[2l + 1]. Each lane writes its own answer.
__global__ void vote_kernel(const float* m_old, const float* m_new, int* moved) {
  const int lane = int(threadIdx.x);
  const tile::Rows a{{m_old[2 * lane], m_old[2 * lane + 1]}};
  const tile::Rows b{{m_new[2 * lane], m_new[2 * lane + 1]}};
  moved[lane] = tile::any_max_moved(a, b, kScaleLog2, kThreshold) ? 1 : 0;
}

// Runs the vote; returns each lane's answer after checking that all lanes agree.
int vote(const std::vector<float>& m_old, const std::vector<float>& m_new) {
  DeviceBuffer<float> d_old(2 * kLanes), d_new(2 * kLanes);
  DeviceBuffer<int> d_moved(kLanes);
  d_old.upload(m_old);
  d_new.upload(m_new);
  d_moved.poison();
  vote_kernel<<<1, kLanes>>>(d_old.get(), d_new.get(), d_moved.get());
  FA_CUDA_CHECK(cudaGetLastError());
  const std::vector<int> moved = d_moved.download();
  for (int lane = 1; lane < kLanes; ++lane) EXPECT_EQ(moved[lane], moved[0]) << "lane " << lane << " disagrees";
  EXPECT_TRUE(moved[0] == 0 || moved[0] == 1) << "lane 0 wrote " << moved[0];
  return moved[0];
}

std::vector<float> ramp() {
  std::vector<float> m(2 * kLanes);
  for (int i = 0; i < 2 * kLanes; ++i) m[i] = 0.25f * float(i) - 5.0f;
  return m;
}

TEST(LazyRescale, NoRowMovedMeansNoRescale) {
  FA_REQUIRE_GPU();
  const std::vector<float> m = ramp();
  EXPECT_EQ(vote(m, m), 0);
  // Every row up by just under the threshold (8 / c raw units): still no rescale.
  std::vector<float> up = m;
  for (float& x : up) x += 0.99f * kThreshold / kScaleLog2;
  EXPECT_EQ(vote(m, up), 0);
}

TEST(LazyRescale, OneRowOfOneLanePastTheThresholdRescalesTheWarp) {
  FA_REQUIRE_GPU();
  const std::vector<float> m = ramp();
  for (int row : {0, 1, 37, 63}) {  // lane 0 both rows, an odd lane's second row, the last lane
    std::vector<float> up = m;
    up[row] += 1.01f * kThreshold / kScaleLog2;
    EXPECT_EQ(vote(m, up), 1) << "row " << row << " of lane " << row / 2 << " moved";
  }
}

TEST(LazyRescale, MinusInfinityRows) {
  FA_REQUIRE_GPU();
  const std::vector<float> m = ramp();
  // A row's first visible key: -inf to finite is a move (the first tile always rescales).
  std::vector<float> first = m;
  first[20] = -INFINITY;
  EXPECT_EQ(vote(first, m), 1);
  // Rows that have seen no key yet (-inf before and after) do not move, nor turn the vote NaN.
  std::vector<float> masked_old = m, masked_new = m;
  masked_old[5] = masked_new[5] = -INFINITY;
  masked_old[50] = masked_new[50] = -INFINITY;
  EXPECT_EQ(vote(masked_old, masked_new), 0);
  // A whole warp of rows before any key.
  const std::vector<float> none(2 * kLanes, -INFINITY);
  EXPECT_EQ(vote(none, none), 0);
  EXPECT_EQ(vote(none, m), 1);
}

}  // namespace
}  // namespace fa
