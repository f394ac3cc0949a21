// validate_backward (library/validate.cpp) on stand-in pointers, no GPU: the backward's own rules
// beside the forward's. Each refusal names what is wrong.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "fa/registry.h"
#include "tests/cpu/stand_in.h"

namespace fa {
namespace {

Capabilities caps() {
  Capabilities c;
  c.causal = c.lse = c.gqa = true;
  return c;
}

BackwardParams valid() {
  BackwardParams bp;
  bp.fwd = stand_in_params(2, 4, 2, 100, 130, 64);
  const AttentionParams& p = bp.fwd;
  bp.d_o = stand_in(6);
  bp.dq = stand_in(7);
  bp.dk = stand_in(8);
  bp.dv = stand_in(9);
  bp.do_stride = bp.dq_stride = p.q_stride;
  bp.dk_stride = bp.dv_stride = p.k_stride;
  bp.workspace = stand_in(10);
  bp.workspace_bytes = backward_workspace_bytes(p);
  return bp;
}

void expect_refused(const BackwardParams& bp, const std::string& why) {
  const Status st = validate_backward(bp, caps());
  EXPECT_FALSE(st.ok()) << "accepted; expected a refusal about: " << why;
  EXPECT_TRUE(st.unsupported()) << st.message();
  EXPECT_NE(st.message().find(why), std::string::npos) << "expected \"" << why << "\", got: " << st.message();
}

TEST(ValidateBackward, AcceptsAWellFormedCall) {
  const Status st = validate_backward(valid(), caps());
  EXPECT_TRUE(st.ok()) << st.message();
}

// dQ's fp32 accumulator, D, one int32 turnstile per 16 query rows, and the LSE in exp2 units,
// each rounded up to 256 bytes: O(N), never O(N²).
TEST(ValidateBackward, WorkspaceIsLinearInN) {
  BackwardParams bp = valid();
  const size_t rows = 2 * 4 * 100, turnstiles = 2 * 4 * 7;  // ⌈100 / 16⌉ = 7 per head
  EXPECT_EQ(backward_workspace_bytes(bp.fwd), (rows * 64 * 4 + 255) / 256 * 256 + (rows * 4 + 255) / 256 * 256 +
                                                  (turnstiles * 4 + 255) / 256 * 256 + (rows * 4 + 255) / 256 * 256);
  bp.fwd.seqlen_q *= 2;
  EXPECT_LE(backward_workspace_bytes(bp.fwd), 2 * backward_workspace_bytes(valid().fwd) + 512);
}

// A deterministic call goes only to a step that honours it; the flag alone changes nothing else.
TEST(ValidateBackward, DeterministicNeedsAStepThatHasIt) {
  BackwardParams bp = valid();
  bp.deterministic = true;
  expect_refused(bp, "no deterministic mode");
  Capabilities with = caps();
  with.deterministic_backward = true;
  const Status st = validate_backward(bp, with);
  EXPECT_TRUE(st.ok()) << st.message();
}

// The parts the kernels address: in order, each 256-byte aligned, none overlapping the next, all
// inside the size validate_backward asks for (a ragged N_q, so no part is a multiple of 256 bytes).
TEST(ValidateBackward, WorkspacePartsAreAlignedAndDisjoint) {
  AttentionParams p = valid().fwd;
  p.seqlen_q = 77;
  const BackwardWorkspace w = backward_workspace(p);
  const size_t rows = 2 * 4 * 77;
  EXPECT_EQ(w.rows, rows);
  EXPECT_EQ(w.dq_accum_count, rows * 64);
  EXPECT_EQ(w.turnstile_count, 2u * 4u * 5u);  // ⌈77 / 16⌉ = 5 per head
  EXPECT_EQ(w.dq_accum, 0u);
  for (size_t at : {w.delta, w.turnstiles, w.lse2, w.bytes}) EXPECT_EQ(at % 256, 0u) << at;
  EXPECT_GE(w.delta, w.dq_accum + w.dq_accum_count * 4);
  EXPECT_GE(w.turnstiles, w.delta + w.rows * 4);
  EXPECT_GE(w.lse2, w.turnstiles + w.turnstile_count * 4);
  EXPECT_GE(w.bytes, w.lse2 + w.rows * 4);
  EXPECT_LT(w.bytes, w.lse2 + w.rows * 4 + 256);
  EXPECT_EQ(backward_workspace_bytes(p), w.bytes);
}

TEST(ValidateBackward, NeedsTheForwardsLse) {
  BackwardParams bp = valid();
  bp.fwd.lse = nullptr;
  expect_refused(bp, "needs the forward's LSE");
}

TEST(ValidateBackward, NeedsEveryGradientPointer) {
  for (int which = 0; which < 4; ++which) {
    BackwardParams bp = valid();
    if (which == 0) bp.d_o = nullptr;
    if (which == 1) bp.dq = nullptr;
    if (which == 2) bp.dk = nullptr;
    if (which == 3) bp.dv = nullptr;
    expect_refused(bp, "d_o, dq, dk and dv must be non-null");
  }
}

TEST(ValidateBackward, TheForwardsRulesStillHold) {
  BackwardParams bp = valid();
  bp.fwd.head_dim = 96;
  expect_refused(bp, "head dim 96 is not supported");
}

TEST(ValidateBackward, WorkspaceTooSmallOrMissing) {
  BackwardParams bp = valid();
  bp.workspace_bytes -= 1;
  expect_refused(bp, "needs a workspace of " + std::to_string(backward_workspace_bytes(bp.fwd)) + " bytes");
  bp = valid();
  bp.workspace = nullptr;
  expect_refused(bp, "needs a workspace");
  bp = valid();
  bp.workspace = static_cast<char*>(bp.workspace) + 4;
  expect_refused(bp, "workspace must be 16-byte aligned");
}

TEST(ValidateBackward, GradientsMustNotOverlapAnything) {
  BackwardParams bp = valid();
  bp.dv = bp.dk;
  expect_refused(bp, "dk overlaps dv");
  bp = valid();
  bp.dq = const_cast<void*>(bp.fwd.q);
  expect_refused(bp, "dq overlaps q");
  bp = valid();
  bp.workspace = bp.dq;
  expect_refused(bp, "dq overlaps workspace");
  bp = valid();
  bp.dk = const_cast<void*>(bp.d_o);
  expect_refused(bp, "dk overlaps d_o");
}

TEST(ValidateBackward, GradientStridesFollowTheOutputRules) {
  BackwardParams bp = valid();
  bp.dq_stride.batch = 0;
  expect_refused(bp, "dq must not have a zero batch stride");
  bp = valid();
  bp.dk_stride.seq = 1;  // rows inside one another: two rows of dK at one address
  bp.dk_stride.dim = 1;
  expect_refused(bp, "dk strides must be multiples of 8 elements");
  bp = valid();
  bp.do_stride.dim = 2;
  expect_refused(bp, "d_o must have unit stride along the head dim");
}

}  // namespace
}  // namespace fa
