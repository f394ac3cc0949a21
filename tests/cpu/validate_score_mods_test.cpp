// Part VI's score modifications in the validator (library/validate.cpp) on stand-in pointers, no
// GPU: softcap, ALiBi slopes and sinks are refused by a step that does not take them (never run
// without them), and malformed ones by every step. Each refusal names what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "fa/registry.h"
#include "tests/cpu/stand_in.h"

namespace fa {
namespace {

Capabilities caps(bool takes_them) {
  Capabilities c;
  c.causal = c.lse = c.gqa = true;
  c.softcap = c.alibi = c.sinks = takes_them;
  return c;
}

AttentionParams call() {
  return stand_in_params(2, 8, 2, 100, 130, 64);
}

void expect_refused(const AttentionParams& p, bool takes_them, const std::string& why) {
  const Status st = validate(p, caps(takes_them));
  EXPECT_FALSE(st.ok()) << "accepted; expected a refusal about: " << why;
  EXPECT_TRUE(st.unsupported()) << st.message();
  EXPECT_NE(st.message().find(why), std::string::npos) << "expected \"" << why << "\", got: " << st.message();
}

void expect_accepted(const AttentionParams& p) {
  const Status st = validate(p, caps(true));
  // A GPU-less machine may refuse at the device check, which comes last: anything else is a failure.
  if (!st.ok()) EXPECT_NE(st.message().find("device"), std::string::npos) << st.message();
}

TEST(ValidateScoreMods, AStepWithoutThemRefusesEach) {
  AttentionParams p = call();
  p.softcap = 30.0f;
  expect_refused(p, false, "no softcap");
  p = call();
  p.alibi_slopes = static_cast<const float*>(stand_in(20));
  expect_refused(p, false, "no ALiBi");
  p = call();
  p.sinks = static_cast<const float*>(stand_in(21));
  expect_refused(p, false, "no attention sinks");
}

TEST(ValidateScoreMods, MalformedOnesAreRefusedByEveryStep) {
  for (const float cap : {-1.0f, INFINITY, NAN}) {
    AttentionParams p = call();
    p.softcap = cap;
    expect_refused(p, true, "softcap must be 0 (off) or positive and finite");
  }
  for (const float cap : {kMaxSoftcap * 1.001f, 1e9f, 3e38f}) {  // tanh's absolute error times the cap
    AttentionParams p = call();
    p.softcap = cap;
    expect_refused(p, true, "softcap must be at most 1000 ");
  }
  AttentionParams p = call();
  p.alibi_slopes = static_cast<const float*>(stand_in(20));
  p.alibi_slopes_stride_batch = 3;  // neither 0 nor >= H_q = 8
  expect_refused(p, true, "alibi_slopes_stride_batch must be 0");
  p = call();
  p.sinks = reinterpret_cast<const float*>(static_cast<const char*>(stand_in(21)) + 2);  // not fp32-aligned
  expect_refused(p, true, "4-byte aligned");
  p = call();
  p.alibi_slopes = static_cast<const float*>(p.o);  // read while O is written
  expect_refused(p, true, "alibi_slopes overlaps o, lse, the workspace");
  p = call();
  p.sinks = p.lse + 4;
  expect_refused(p, true, "sinks overlaps o, lse, the workspace");
}

TEST(ValidateScoreMods, WellFormedOnesReachAStepThatTakesThem) {
  AttentionParams p = call();
  p.softcap = 50.0f;
  p.alibi_slopes = static_cast<const float*>(stand_in(20));
  p.alibi_slopes_stride_batch = 8;
  p.sinks = static_cast<const float*>(stand_in(21));
  expect_accepted(p);
  p.alibi_slopes_stride_batch = 0;
  expect_accepted(p);
  p.softcap = kMaxSoftcap;
  expect_accepted(p);
}

}  // namespace
}  // namespace fa
