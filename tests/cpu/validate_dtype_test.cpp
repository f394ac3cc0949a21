// The element type (AttentionParams::dtype) in validate and validate_backward (library/validate.cpp),
// on stand-in pointers, no GPU: a step takes the types its Capabilities::dtypes list, and refuses any
// other by name, with what it takes; a value outside the DType enum is refused as such; the decode
// kernel's options (split-KV, lengths per sequence, paged caches) follow its own, fewer types; and a
// backward refuses a type its forward may take. Nothing here depends on what the build compiled.
#include <gtest/gtest.h>

#include <string>

#include "fa/registry.h"
#include "tests/cpu/stand_in.h"

namespace fa {
namespace {

// A step like the lessons: bf16 alone (the default).
Capabilities lesson_caps() {
  Capabilities c;
  c.causal = c.lse = c.gqa = true;
  return c;
}

// A forward built with fp16 whose decode kernel is not (made up: the production kernels' decode kernel
// has every type its forwards have): both types, the decode kernel's options at bf16 alone.
Capabilities forward_caps() {
  Capabilities c = lesson_caps();
  c.dtypes = {DType::bf16, DType::fp16};
  c.split_kv = c.seqlens_kv = c.paged_kv = true;
  c.decode_max_packed_rows = 64;
  c.decode_dtypes = {DType::bf16};
  return c;
}

AttentionParams call(DType t) {
  AttentionParams p = stand_in_params(2, 4, 2, 100, 130, 64);
  p.dtype = t;
  return p;
}

void expect_refused(const Status& st, const std::string& why) {
  EXPECT_FALSE(st.ok()) << "accepted; expected a refusal about: " << why;
  EXPECT_TRUE(st.unsupported()) << st.message();
  EXPECT_NE(st.message().find(why), std::string::npos) << "expected \"" << why << "\", got: " << st.message();
}

TEST(DtypeNames, NameEveryTypeAndAnythingElseByItsValue) {
  EXPECT_EQ(dtype_name(DType::bf16), "bf16");
  EXPECT_EQ(dtype_name(DType::fp16), "fp16");
  EXPECT_EQ(dtype_name(static_cast<DType>(7)), "dtype 7");
  EXPECT_TRUE(dtype_known(DType::bf16) && dtype_known(DType::fp16));
  EXPECT_FALSE(dtype_known(static_cast<DType>(2)) || dtype_known(static_cast<DType>(-1)));
  EXPECT_EQ(int(DType::bf16), 0);  // the C interface's FA_DTYPE_BF16 and FA_DTYPE_FP16
  EXPECT_EQ(int(DType::fp16), 1);
}

TEST(ValidateDtype, ALessonTakesBf16AndRefusesFp16ByName) {
  EXPECT_TRUE(validate_input(call(DType::bf16), lesson_caps()).ok());
  expect_refused(validate_input(call(DType::fp16), lesson_caps()), "element type fp16 is not supported");
  expect_refused(validate_input(call(DType::fp16), lesson_caps()), "supported: bf16");
}

TEST(ValidateDtype, AForwardBuiltWithFp16TakesBoth) {
  for (DType t : {DType::bf16, DType::fp16}) {
    const Status st = validate_input(call(t), forward_caps());
    EXPECT_TRUE(st.ok()) << dtype_name(t) << ": " << st.message();
  }
}

// A DType cast from an integer the enum does not hold (a C caller's, a file's) is refused as not a
// type at all, by every step, before its sizes are judged.
TEST(ValidateDtype, AValueOutsideTheEnumIsNoElementType) {
  for (int v : {2, 7, -1}) {
    AttentionParams p = call(static_cast<DType>(v));
    expect_refused(validate_input(p, forward_caps()), "dtype " + std::to_string(v) + " is not an element type");
    expect_refused(validate_input(p, lesson_caps()), "is not an element type");
  }
}

// Split-KV, a length per sequence and a paged cache are the decode kernel's, here bf16 alone:
// at fp16 each is refused, naming the option, the kernel and the call's type; at bf16 they pass.
TEST(ValidateDtype, TheDecodeKernelsOptionsFollowItsTypes) {
  struct Case {
    const char* option;
    void (*set)(AttentionParams&);
  } cases[] = {
      {"split-KV",
       [](AttentionParams& p) {
         p.num_splits = 4;
         p.workspace = stand_in(7);
         p.workspace_bytes = split_kv_workspace_bytes(p, 4);
       }},
      {"a length per sequence", [](AttentionParams& p) { p.seqlens_kv = static_cast<const int32_t*>(stand_in(8)); }},
      {"a paged KV cache",
       [](AttentionParams& p) {
         p.block_table = static_cast<const int32_t*>(stand_in(8));
         p.page_size = 64;
         p.num_pages = 16;
         p.block_table_stride = 4;
         p.k_stride = p.v_stride = Strides{64 * 2 * 64, 64, 2 * 64, 1};  // (pages, page_size, H_kv, D)
       }},
  };
  for (const Case& c : cases) {
    AttentionParams p = call(DType::bf16);
    p.seqlen_q = 1;  // a decode call: 1 query row times 2 heads per KV head
    c.set(p);
    const Status bf16 = validate_input(p, forward_caps());
    EXPECT_TRUE(bf16.ok()) << c.option << ": " << bf16.message();
    p.dtype = DType::fp16;
    const Status fp16 = validate_input(p, forward_caps());
    expect_refused(fp16, c.option);
    expect_refused(fp16, "the decode kernel's here, which is built for bf16 only; this call is fp16");
  }
}

// With no decode_dtypes (every step but the production forwards), the options follow `dtypes`.
TEST(ValidateDtype, WithoutDecodeTypesTheOptionsFollowTheStepsTypes) {
  Capabilities c = forward_caps();
  c.decode_dtypes.clear();
  AttentionParams p = call(DType::fp16);
  p.seqlen_q = 1;
  p.seqlens_kv = static_cast<const int32_t*>(stand_in(8));
  const Status st = validate_input(p, c);
  EXPECT_TRUE(st.ok()) << st.message();
}

BackwardParams backward_call(DType t) {
  BackwardParams bp;
  bp.fwd = call(t);
  bp.d_o = stand_in(6);
  bp.dq = stand_in(7);
  bp.dk = stand_in(8);
  bp.dv = stand_in(9);
  bp.do_stride = bp.dq_stride = bp.fwd.q_stride;
  bp.dk_stride = bp.dv_stride = bp.fwd.k_stride;
  bp.workspace = stand_in(10);
  bp.workspace_bytes = backward_workspace_bytes(bp.fwd);
  return bp;
}

// A backward of bf16 alone (its Capabilities::dtypes; a lesson's) under a forward that takes fp16: the
// fp16 gradient is refused, naming the backward, before the forward's rules are asked.
TEST(ValidateDtype, ABackwardRefusesATypeItsForwardTakes) {
  Capabilities bwd = lesson_caps();  // bf16 alone, as a lesson's backward
  EXPECT_TRUE(validate_input(call(DType::fp16), forward_caps()).ok());
  BackwardParams bp = backward_call(DType::bf16);
  ASSERT_TRUE(validate_input(bp.fwd, bwd).ok());
  Status st = validate_backward(bp, bwd);
  // Without a GPU the last rule (check_device) passes for a step pinned to no GPU.
  EXPECT_TRUE(st.ok()) << st.message();
  bp = backward_call(DType::fp16);
  st = validate_backward(bp, bwd);
  expect_refused(st, "element type fp16 is not supported by this backward; supported: bf16");
  bp = backward_call(static_cast<DType>(5));
  expect_refused(validate_backward(bp, bwd), "dtype 5 is not an element type");
}

}  // namespace
}  // namespace fa
