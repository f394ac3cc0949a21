// The C interface (include/fa/c_api.h) as a foreign caller sees it: linked against the shared
// library only, no GPU. Everything here is host logic: the step list, the struct layout, and the
// error paths, which must answer before any CUDA call is made.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "fa/c_api.h"

// The production forwards' element types in this build, bit i for DType value i (CMakeLists.txt
// passes kernels.cmake's mask); without it, bf16 alone, the default build's.
#ifndef FA_TEST_DTYPE_MASK
#define FA_TEST_DTYPE_MASK 1u
#endif

namespace {

// A well-formed call on a contiguous (B, H, N, D) problem with stand-in, 16-byte aligned pointers.
// Every test below breaks one thing, so validation must fail before the pointers are touched.
// The stand-in addresses are 2^44 bytes apart, so the tensors do not overlap (validation refuses
// an O that overlaps an input); nothing ever dereferences them.
void* stand_in(uintptr_t slot) {
  return reinterpret_cast<void*>(slot << 44);
}

fa_attention_params valid_params(int64_t head_dim = 64) {
  fa_attention_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.q = stand_in(1);
  p.k = stand_in(2);
  p.v = stand_in(3);
  p.o = stand_in(4);
  p.batch = 2;
  p.heads_q = p.heads_kv = 4;
  p.seqlen_q = p.seqlen_kv = 128;
  p.head_dim = head_dim;
  for (int t = 0; t < 4; ++t) {
    p.strides[t][FA_AXIS_BATCH] = p.heads_q * p.seqlen_q * head_dim;
    p.strides[t][FA_AXIS_HEAD] = p.seqlen_q * head_dim;
    p.strides[t][FA_AXIS_SEQ] = head_dim;
    p.strides[t][FA_AXIS_DIM] = 1;
  }
  p.dtype = FA_DTYPE_BF16;
  p.causal_align = FA_CAUSAL_TOP_LEFT;
  return p;
}

int first_step_number() {
  int number = -1;
  EXPECT_EQ(fa_step_info(0, &number, nullptr, nullptr, nullptr, nullptr), FA_OK);
  return number;
}

TEST(CApi, VersionAndStructSizeMatchThisHeader) {
  EXPECT_EQ(fa_api_version(), FA_C_API_VERSION);
  EXPECT_EQ(fa_attention_params_size(), sizeof(fa_attention_params));
}

TEST(CApi, ListsEveryStepInOrderWithNamesAndLessons) {
  const int n = fa_num_steps();
  ASSERT_GE(n, 1) << "no step registered: the step objects were not linked into the library";
  int previous = -1;
  for (int i = 0; i < n; ++i) {
    int number = -1, causal = -1, lse = -1;
    const char* name = nullptr;
    const char* lesson = nullptr;
    ASSERT_EQ(fa_step_info(i, &number, &name, &lesson, &causal, &lse), FA_OK) << "index " << i;
    EXPECT_GT(number, previous) << "steps must come sorted by number";
    previous = number;
    ASSERT_NE(name, nullptr);
    ASSERT_NE(lesson, nullptr);
    EXPECT_GT(std::strlen(name), 0u);
    EXPECT_GT(std::strlen(lesson), 0u);
    EXPECT_TRUE(causal == 0 || causal == 1);
    EXPECT_TRUE(lse == 0 || lse == 1);
  }
}

TEST(CApi, Step00IsTheNaiveBaseline) {
  int number = -1;
  const char* name = nullptr;
  ASSERT_EQ(fa_step_info(0, &number, &name, nullptr, nullptr, nullptr), FA_OK);
  EXPECT_EQ(number, 0);
  EXPECT_STREQ(name, "naive");
}

TEST(CApi, StepInfoRejectsOutOfRangeIndexAndLeavesOutputsAlone) {
  int number = 1234;
  const char* name = "untouched";
  EXPECT_NE(fa_step_info(-1, &number, &name, nullptr, nullptr, nullptr), FA_OK);
  EXPECT_NE(fa_step_info(fa_num_steps(), &number, &name, nullptr, nullptr, nullptr), FA_OK);
  EXPECT_EQ(number, 1234);
  EXPECT_STREQ(name, "untouched");
}

TEST(CApi, ValidParamsPassValidation) {
  fa_attention_params p = valid_params();
  char err[256] = "stale";
  EXPECT_EQ(fa_validate(first_step_number(), &p, err, sizeof err), FA_OK) << err;
  EXPECT_STREQ(err, "") << "a successful call clears the message buffer";
}

TEST(CApi, UnknownStepIsInvalidAndListsTheRegisteredSteps) {
  fa_attention_params p = valid_params();
  char err[256] = {};
  EXPECT_EQ(fa_forward(987, &p, nullptr, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("unknown step 987"), std::string::npos) << err;
  EXPECT_NE(std::string(err).find("registered steps"), std::string::npos) << err;
}

TEST(CApi, NullParamsAreInvalid) {
  char err[128] = {};
  EXPECT_EQ(fa_forward(first_step_number(), nullptr, nullptr, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("NULL"), std::string::npos) << err;
}

TEST(CApi, UnknownEnumsAreInvalid) {
  char err[256] = {};
  fa_attention_params p = valid_params();
  p.dtype = 7;
  EXPECT_EQ(fa_forward(first_step_number(), &p, nullptr, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("dtype"), std::string::npos) << err;
  p = valid_params();
  p.causal_align = 5;
  EXPECT_EQ(fa_forward(first_step_number(), &p, nullptr, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("causal_align"), std::string::npos) << err;
}

// Version 5's paged-cache fields: a step that does not read a block table refuses one, naming it;
// the paging sizes without a table are refused too, not ignored; the step that pages takes them.
// reserved_flags must stay zero.
TEST(CApi, PagedCacheFieldsReachValidation) {
  char err[256] = {};
  fa_attention_params p = valid_params();
  p.block_table = static_cast<const int32_t*>(stand_in(8));
  p.page_size = 16;
  p.block_table_stride = 8;  // 128 keys in pages of 16
  p.num_pages = 16;
  for (int t : {FA_TENSOR_K, FA_TENSOR_V}) {  // (pages, 16, H_kv, D)
    p.strides[t][FA_AXIS_BATCH] = 16 * 4 * 64;
    p.strides[t][FA_AXIS_HEAD] = 64;
    p.strides[t][FA_AXIS_SEQ] = 4 * 64;
  }
  EXPECT_EQ(fa_validate(first_step_number(), &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("block_table must be null"), std::string::npos) << err;
  EXPECT_EQ(fa_validate(30, &p, err, sizeof err), FA_OK) << err;
  p.page_size = 24;
  EXPECT_EQ(fa_validate(30, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("page_size must be a power of two (got 24)"), std::string::npos) << err;
  // The library's choice refuses it too, and says why with the reason of a step that pages, not
  // step 00's "block_table must be null".
  EXPECT_EQ(fa_validate(FA_STEP_AUTO, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("page_size must be a power of two (got 24)"), std::string::npos) << err;
  p = valid_params();
  p.num_pages = 3;
  EXPECT_EQ(fa_validate(30, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("are for a paged KV cache"), std::string::npos) << err;
  p = valid_params();
  p.reserved_flags = 1;
  EXPECT_EQ(fa_validate(first_step_number(), &p, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("reserved_flags is 1"), std::string::npos) << err;
}

// Version 6's varlen fields: refused by a step that does not read offsets, taken by step 31.
TEST(CApi, VarlenFieldsReachValidation) {
  char err[256] = {};
  fa_attention_params p = valid_params();
  p.cu_seqlens_q = static_cast<const int32_t*>(stand_in(9));
  p.cu_seqlens_kv = static_cast<const int32_t*>(stand_in(10));
  p.total_q = p.total_kv = 200;  // (200, H, D) packed tensors
  for (int t = 0; t < 4; ++t) {
    p.strides[t][FA_AXIS_BATCH] = 0;
    p.strides[t][FA_AXIS_HEAD] = 64;
    p.strides[t][FA_AXIS_SEQ] = 4 * 64;
  }
  EXPECT_EQ(fa_validate(first_step_number(), &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("cu_seqlens_q and cu_seqlens_kv must be null"), std::string::npos) << err;
  EXPECT_EQ(fa_validate(31, &p, err, sizeof err), FA_OK) << err;
  p.total_kv = 0;
  EXPECT_EQ(fa_validate(31, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("total_q and total_kv"), std::string::npos) << err;
}

// Version 7's append: refused by a step that only reads its caches, taken by step 32 with the
// lengths it appends after; without them, with one tensor of two, or no rows, refused by name.
TEST(CApi, AppendFieldsReachValidation) {
  char err[256] = {};
  fa_attention_params p = valid_params();
  p.seqlen_q = 1;  // a decode call: one query row per sequence
  p.seqlens_kv = static_cast<const int32_t*>(stand_in(9));
  p.k_new = stand_in(10);
  p.v_new = stand_in(11);
  p.seqlen_new = 1;
  for (int i = 0; i < 2; ++i) {
    p.new_strides[i][FA_AXIS_BATCH] = 4 * 64;
    p.new_strides[i][FA_AXIS_HEAD] = 64;
    p.new_strides[i][FA_AXIS_SEQ] = 4 * 64;
    p.new_strides[i][FA_AXIS_DIM] = 1;
  }
  EXPECT_EQ(fa_validate(31, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("k_new and v_new must be null"), std::string::npos) << err;
  EXPECT_EQ(fa_validate(32, &p, err, sizeof err), FA_OK) << err;
  p.seqlens_kv = nullptr;
  EXPECT_EQ(fa_validate(32, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("appending to the cache needs seqlens_kv"), std::string::npos) << err;
  p.seqlens_kv = static_cast<const int32_t*>(stand_in(9));
  p.v_new = nullptr;
  EXPECT_EQ(fa_validate(32, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("both k_new and v_new"), std::string::npos) << err;
  p.v_new = stand_in(11);
  p.seqlen_new = 0;
  EXPECT_EQ(fa_validate(32, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("seqlen_new must be in [1"), std::string::npos) << err;
  p.seqlen_new = 1;
  p.k_new = p.o;  // read while O is written
  EXPECT_EQ(fa_validate(32, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("k_new overlaps"), std::string::npos) << err;
  p.k_new = nullptr, p.v_new = nullptr;  // nothing to append, yet a row count
  EXPECT_EQ(fa_validate(32, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("seqlen_new is for appending"), std::string::npos) << err;
}

// The sliding window's fields (version 8) reach validation: the production kernels take a window,
// with a per-sequence option too (their decode kernel's), a step without one refuses it by name, a
// step with a window but no such option refuses the option by its own name, and the fields' own
// rules (has_window 0 or 1, sizes only with it, each side -1 or >= 0) are the library's.
TEST(CApi, WindowFieldsReachValidation) {
  char err[256] = {};
  fa_attention_params p = valid_params();
  p.has_window = 1;
  p.window_left = 100;
  p.window_right = 0;
  EXPECT_EQ(fa_validate(100, &p, err, sizeof err), FA_OK) << err;
  EXPECT_EQ(fa_validate(32, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("has no sliding window"), std::string::npos) << err;
  p.window_left = -2;
  EXPECT_EQ(fa_validate(100, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("must be -1 (unbounded) or >= 0"), std::string::npos) << err;
  p.window_left = -1;  // (-1, 0): a window bounded on the right alone
  EXPECT_EQ(fa_validate(100, &p, err, sizeof err), FA_OK) << err;
  p.seqlens_kv = static_cast<const int32_t*>(stand_in(9));
  p.seqlen_q = 1;
  EXPECT_EQ(fa_validate(100, &p, err, sizeof err), FA_OK) << err;
  EXPECT_EQ(fa_validate(38, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);  // step 38: a window, no ragged caches
  EXPECT_NE(std::string(err).find("seqlens_kv must be null"), std::string::npos) << err;
  fa_attention_params q = valid_params();
  q.window_left = 5;  // a size without has_window
  EXPECT_EQ(fa_validate(100, &q, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("set has_window to 1"), std::string::npos) << err;
  q.window_left = 0;
  q.has_window = 2;
  EXPECT_EQ(fa_validate(100, &q, err, sizeof err), FA_ERROR_INVALID);
}

// The score modifications' fields (version 9) reach validation: the production kernels take them
// (with a decode call's lengths too), a step without them refuses each by name, and the fields' own
// rules (a cap that is not positive and finite, a slope stride without slopes, or one below H_q).
TEST(CApi, ScoreModFieldsReachValidation) {
  char err[256] = {};
  fa_attention_params p = valid_params();
  p.softcap = 30.0;
  p.alibi_slopes = static_cast<const float*>(stand_in(10));
  p.sinks = static_cast<const float*>(stand_in(11));
  EXPECT_EQ(fa_validate(100, &p, err, sizeof err), FA_OK) << err;
  EXPECT_EQ(fa_validate(32, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("has no softcap"), std::string::npos) << err;
  p.softcap = 0.0;
  EXPECT_EQ(fa_validate(32, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("has no ALiBi"), std::string::npos) << err;
  p.alibi_slopes = nullptr;
  EXPECT_EQ(fa_validate(32, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("has no attention sinks"), std::string::npos) << err;
  p.seqlens_kv = static_cast<const int32_t*>(stand_in(9));  // a decode call: the decode kernel's
  p.seqlen_q = 1;
  EXPECT_EQ(fa_validate(100, &p, err, sizeof err), FA_OK) << err;
  fa_attention_params q = valid_params();
  q.softcap = -1.0;
  EXPECT_EQ(fa_validate(100, &q, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("softcap must be 0 (off) or positive and finite"), std::string::npos) << err;
  q.softcap = 1e-60;  // rounds to 0 in fp32: not silently "no cap"
  EXPECT_EQ(fa_validate(100, &q, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("rounds to 0"), std::string::npos) << err;
  q.softcap = 0.0;
  q.alibi_slopes_stride_batch = 4;  // a stride without slopes
  EXPECT_EQ(fa_validate(100, &q, err, sizeof err), FA_ERROR_INVALID);
  q.alibi_slopes = static_cast<const float*>(stand_in(10));
  q.alibi_slopes_stride_batch = 1;  // below H_q
  EXPECT_EQ(fa_validate(100, &q, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("alibi_slopes_stride_batch must be 0"), std::string::npos) << err;
}

TEST(CApi, UnsupportedHeadDimIsRefusedWithWhatIsSupported) {
  fa_attention_params p = valid_params(96);
  for (int t = 0; t < 4; ++t) EXPECT_EQ(p.strides[t][FA_AXIS_SEQ], 96);
  char err[256] = {};
  EXPECT_EQ(fa_forward(first_step_number(), &p, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("head dim 96"), std::string::npos) << err;
  EXPECT_NE(std::string(err).find("supported"), std::string::npos) << err;
}

TEST(CApi, NegativeSizesAndNullPointersAreRefused) {
  char err[256] = {};
  fa_attention_params p = valid_params();
  p.seqlen_kv = -3;
  EXPECT_EQ(fa_validate(first_step_number(), &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("N_kv=-3"), std::string::npos) << err;
  p = valid_params();
  p.o = nullptr;
  EXPECT_EQ(fa_validate(first_step_number(), &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("non-null"), std::string::npos) << err;
}

TEST(CApi, MessagesAreTruncatedAndTerminated) {
  fa_attention_params p = valid_params(96);
  char err[8];
  std::memset(err, 'x', sizeof err);
  EXPECT_NE(fa_forward(first_step_number(), &p, nullptr, err, sizeof err), FA_OK);
  EXPECT_EQ(std::strlen(err), sizeof err - 1);
  // A NULL buffer is allowed: the code alone reports the failure.
  EXPECT_NE(fa_forward(first_step_number(), &p, nullptr, nullptr, 0), FA_OK);
}

// Only the error paths: describing a real step may consult a step's tuner, which needs a GPU. A
// caller prints what describe writes as a configuration name, so a failure leaves it empty.
TEST(CApi, DescribeRejectsUnknownStepAndNullParamsWithoutWritingAnError) {
  fa_attention_params p = valid_params();
  char buf[128] = "stale";
  EXPECT_EQ(fa_step_describe(987, &p, buf, sizeof buf), FA_ERROR_INVALID);
  EXPECT_STREQ(buf, "");
  std::strcpy(buf, "stale");
  EXPECT_EQ(fa_step_describe(first_step_number(), nullptr, buf, sizeof buf), FA_ERROR_INVALID);
  EXPECT_STREQ(buf, "");
}

// The rules of fa::validate, through the C interface: each refusal is FA_ERROR_UNSUPPORTED with a
// message, before anything touches the GPU.
TEST(CApi, RefusesWhatTheLibraryRefuses) {
  struct Case {
    const char* what;
    void (*spoil)(fa_attention_params&);
    const char* expect;
  } cases[] = {
      // 2^32 + 64 is 64 after truncation to 32 bits: it must still be refused.
      {"head dim past int", [](fa_attention_params& p) { p.head_dim = (int64_t(1) << 32) + 64; }, "head dim"},
      {"o aliases q", [](fa_attention_params& p) { p.o = const_cast<void*>(p.q); }, "o overlaps"},
      {"o overlaps v's last row",
       [](fa_attention_params& p) { p.o = static_cast<char*>(const_cast<void*>(p.v)) + 2 * (2 * 4 * 128 * 64 - 64); },
       "o overlaps"},
      {"o zero seq stride", [](fa_attention_params& p) { p.strides[FA_TENSOR_O][FA_AXIS_SEQ] = 0; }, "zero sequence"},
      {"lse misaligned", [](fa_attention_params& p) { p.lse = reinterpret_cast<float*>(uintptr_t(5) << 44 | 2); },
       "4-byte aligned"},
  };
  for (const Case& c : cases) {
    fa_attention_params p = valid_params();
    c.spoil(p);
    char err[256] = {};
    // Step 07 writes LSE, so an LSE pointer is judged rather than refused outright.
    EXPECT_EQ(fa_validate(7, &p, err, sizeof err), FA_ERROR_UNSUPPORTED) << c.what;
    EXPECT_NE(std::string(err).find(c.expect), std::string::npos) << c.what << ": " << err;
  }
}

// A step's launch limits are part of its validation: fa_validate and fa_forward refuse the same
// input, both with FA_ERROR_UNSUPPORTED, before any CUDA call (so this runs without a GPU).
TEST(CApi, LaunchLimitsAreRefusedByValidateAndForwardAlike) {
  fa_attention_params p = valid_params();
  p.seqlen_q = int64_t(1) << 30;  // past the 32-bit row indices of the tensor-core steps
  for (int t = 0; t < 4; ++t) {
    p.strides[t][FA_AXIS_HEAD] = p.seqlen_q * 64;
    p.strides[t][FA_AXIS_BATCH] = 4 * p.seqlen_q * 64;
  }
  char err[256] = {};
  EXPECT_EQ(fa_validate(4, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("at most"), std::string::npos) << err;
  EXPECT_EQ(fa_forward(4, &p, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED) << err;
}

// The persistent steps (14 on) number their work tiles in 32 bits. Once they refused too many only
// at launch, so fa_validate accepted what fa_forward refused; now validation refuses it (before the
// GPU check, so this holds with or without a GPU, on any GPU).
TEST(CApi, PersistentStepsRefuseTooManyWorkTilesInValidation) {
  fa_attention_params p = valid_params();
  p.batch = int64_t(1) << 20;
  p.heads_q = p.heads_kv = int64_t(1) << 10;
  p.seqlen_q = p.seqlen_kv = int64_t(1) << 14;  // 2^37 tiles of 128 rows; 2^50 elements a tensor
  p.head_dim = 64;
  for (int t = 0; t < 4; ++t) {
    p.strides[t][FA_AXIS_SEQ] = 64;
    p.strides[t][FA_AXIS_HEAD] = p.seqlen_q * 64;
    p.strides[t][FA_AXIS_BATCH] = p.heads_q * p.seqlen_q * 64;
  }
  p.q = reinterpret_cast<const void*>(uintptr_t(1) << 56);  // 2^51 bytes apart, as no real GPU has
  p.k = reinterpret_cast<const void*>(uintptr_t(2) << 56);
  p.v = reinterpret_cast<const void*>(uintptr_t(3) << 56);
  p.o = reinterpret_cast<void*>(uintptr_t(4) << 56);
  p.lse = nullptr;
  int tried = 0;
  for (int i = 0; i < fa_num_steps(); ++i) {
    int number = -1;
    ASSERT_EQ(fa_step_info(i, &number, nullptr, nullptr, nullptr, nullptr), FA_OK);
    const bool persistent = (number >= 14 && number <= 16) || number == 101;  // steps 14-16, kernel_hopper
    if (!persistent) continue;
    ++tried;
    char err[512] = {};
    EXPECT_EQ(fa_validate(number, &p, err, sizeof err), FA_ERROR_UNSUPPORTED) << "step " << number;
    EXPECT_NE(std::string(err).find("numbers its work in 32 bits"), std::string::npos) << number << ": " << err;
    EXPECT_EQ(fa_forward(number, &p, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED) << "step " << number;
  }
  EXPECT_GE(tried, 4) << "steps 14-16 and kernel 101 are persistent";
}

// An output whose rows overlap is refused by every step, through the C interface.
TEST(CApi, EveryStepRefusesAnOutputWhoseRowsOverlap) {
  for (int i = 0; i < fa_num_steps(); ++i) {
    int number = -1;
    ASSERT_EQ(fa_step_info(i, &number, nullptr, nullptr, nullptr, nullptr), FA_OK);
    fa_attention_params p = valid_params();
    p.lse = nullptr;
    p.strides[FA_TENSOR_O][FA_AXIS_SEQ] = 8;  // rows 8 elements apart at D = 64
    char err[512] = {};
    EXPECT_EQ(fa_validate(number, &p, err, sizeof err), FA_ERROR_UNSUPPORTED) << "step " << number;
    EXPECT_NE(std::string(err).find("o's sequence stride (8)"), std::string::npos) << number << ": " << err;
  }
}

// Version 3's struct_size: unset or smaller than version 5's (a caller built against another layout)
// is invalid; version 5's is taken without the varlen fields, version 6's without the append's; a
// larger struct (a later version's) is taken when the fields this library does not know are zero.
TEST(CApi, StructSizeComesFirstAndGuardsTheLayout) {
  EXPECT_EQ(FA_C_API_VERSION, 10);
  EXPECT_EQ(offsetof(fa_attention_params, struct_size), 0u);
  char err[256] = {};
  fa_attention_params p = valid_params();
  p.struct_size = 0;
  EXPECT_EQ(fa_validate(first_step_number(), &p, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("struct_size is 0; set it to sizeof(fa_attention_params)"), std::string::npos) << err;
  EXPECT_EQ(fa_forward(FA_STEP_AUTO, &p, nullptr, err, sizeof err), FA_ERROR_INVALID);
  // A version-5 caller's struct ends before the varlen fields: taken, with them zero (here the bytes
  // past its size are garbage, which the library must not read).
  {
    fa_attention_params v5 = valid_params();
    std::memset(reinterpret_cast<char*>(&v5) + offsetof(fa_attention_params, cu_seqlens_q), 0xAB,
                sizeof v5 - offsetof(fa_attention_params, cu_seqlens_q));
    v5.struct_size = offsetof(fa_attention_params, cu_seqlens_q);
    EXPECT_EQ(fa_validate(first_step_number(), &v5, err, sizeof err), FA_OK) << err;
    v5.struct_size -= 8;  // smaller than any version this library takes
    EXPECT_EQ(fa_validate(first_step_number(), &v5, err, sizeof err), FA_ERROR_INVALID);
  }
  {  // version 6's ends before the append's fields
    fa_attention_params v6 = valid_params();
    std::memset(reinterpret_cast<char*>(&v6) + offsetof(fa_attention_params, k_new), 0xAB,
                sizeof v6 - offsetof(fa_attention_params, k_new));
    v6.struct_size = offsetof(fa_attention_params, k_new);
    EXPECT_EQ(fa_validate(first_step_number(), &v6, err, sizeof err), FA_OK) << err;
  }
  {  // version 7's ends before the window's fields: no window, whatever the bytes past it hold
    fa_attention_params v7 = valid_params();
    std::memset(reinterpret_cast<char*>(&v7) + offsetof(fa_attention_params, has_window), 0xAB,
                sizeof v7 - offsetof(fa_attention_params, has_window));
    v7.struct_size = offsetof(fa_attention_params, has_window);
    EXPECT_EQ(fa_validate(first_step_number(), &v7, err, sizeof err), FA_OK) << err;
  }
  {  // version 8's ends before the score modifications: none, whatever the bytes past it hold
    fa_attention_params v8 = valid_params();
    std::memset(reinterpret_cast<char*>(&v8) + offsetof(fa_attention_params, softcap), 0xAB,
                sizeof v8 - offsetof(fa_attention_params, softcap));
    v8.struct_size = offsetof(fa_attention_params, softcap);
    EXPECT_EQ(fa_validate(first_step_number(), &v8, err, sizeof err), FA_OK) << err;
  }
  struct Later {
    fa_attention_params p;
    int64_t new_option;
  } later;
  std::memset(&later, 0, sizeof later);
  later.p = valid_params();
  later.p.struct_size = sizeof later;
  EXPECT_EQ(fa_validate(first_step_number(), &later.p, err, sizeof err), FA_OK) << err;
  later.new_option = 7;
  EXPECT_EQ(fa_validate(first_step_number(), &later.p, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("fields past this library's"), std::string::npos) << err;
}

// FA_STEP_AUTO: the library's choice is the highest-numbered step that fa_validate accepts on this
// machine (without a GPU, the Hopper steps' GPU check refuses them); describe names it.
TEST(CApi, TheLibrarysChoiceIsTheFastestStepThatAccepts) {
  fa_attention_params p = valid_params();
  int expected = -1;
  for (int i = 0; i < fa_num_steps(); ++i) {
    int number = -1;
    ASSERT_EQ(fa_step_info(i, &number, nullptr, nullptr, nullptr, nullptr), FA_OK);
    if (fa_validate(number, &p, nullptr, 0) == FA_OK) expected = number;
  }
  ASSERT_GE(expected, 10) << "the tensor-core steps accept a plain bf16 call";
  char err[256] = "stale";
  int chosen = -5;
  EXPECT_EQ(fa_choose_step(&p, &chosen, err, sizeof err), FA_OK) << err;
  EXPECT_EQ(chosen, expected);
  EXPECT_STREQ(err, "");
  EXPECT_EQ(fa_validate(FA_STEP_AUTO, &p, err, sizeof err), FA_OK) << err;
  char buf[256] = {};
  EXPECT_EQ(fa_step_describe(FA_STEP_AUTO, &p, buf, sizeof buf), FA_OK);
  EXPECT_EQ(std::string(buf).rfind("step " + std::to_string(expected) + ": ", 0), 0u) << buf;
  // No step accepts head dim 80 (in any build: FA_HEAD_DIMS=all has 96): the most general step's
  // reason, and nothing chosen.
  fa_attention_params d80 = valid_params(80);
  chosen = -5;
  EXPECT_EQ(fa_choose_step(&d80, &chosen, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("head dim 80 is not supported"), std::string::npos) << err;
  EXPECT_EQ(chosen, -5);
  EXPECT_EQ(fa_forward(FA_STEP_AUTO, &d80, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_EQ(fa_choose_step(nullptr, &chosen, err, sizeof err), FA_ERROR_INVALID);
}

// Inputs may broadcast (a stride of 0) and a dimension of size 1 may have any stride: both are
// what PyTorch hands over for expanded or unsqueezed tensors.
TEST(CApi, AcceptsBroadcastInputsAndAnyStrideOnSizeOneDims) {
  fa_attention_params p = valid_params();
  p.strides[FA_TENSOR_K][FA_AXIS_BATCH] = 0;  // one K, V for every batch entry
  p.strides[FA_TENSOR_V][FA_AXIS_BATCH] = 0;
  char err[256] = {};
  EXPECT_EQ(fa_validate(first_step_number(), &p, err, sizeof err), FA_OK) << err;
  p = valid_params();
  p.batch = 1;
  for (int t = 0; t < 4; ++t) p.strides[t][FA_AXIS_BATCH] = 3;  // never stepped along
  EXPECT_EQ(fa_validate(first_step_number(), &p, err, sizeof err), FA_OK) << err;
}

}  // namespace

namespace fa {
namespace {

fa_backward_params valid_backward(int64_t head_dim = 64) {
  fa_backward_params b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.fwd = valid_params(head_dim);
  b.fwd.lse = static_cast<float*>(stand_in(5));
  b.d_o = stand_in(6);
  b.dq = stand_in(7);
  b.dk = stand_in(8);
  b.dv = stand_in(9);
  for (int t = 0; t < 4; ++t)
    for (int a = 0; a < 4; ++a) b.strides[t][a] = b.fwd.strides[FA_TENSOR_Q][a];
  b.workspace = stand_in(10);
  EXPECT_EQ(fa_backward_workspace_size(&b.fwd, &b.workspace_bytes, nullptr, 0), FA_OK);
  return b;
}

// The workspace: dQ's fp32 accumulator and D, each rounded up to 256 bytes.
TEST(CApiBackward, WorkspaceSizeIsTheLibrarys) {
  const fa_attention_params p = valid_params();
  size_t bytes = 1;
  char err[256] = "stale";
  ASSERT_EQ(fa_backward_workspace_size(&p, &bytes, err, sizeof err), FA_OK) << err;
  EXPECT_STREQ(err, "");
  const size_t rows = 2 * 4 * 128, turnstiles = 2 * 4 * (128 / 16);
  EXPECT_EQ(bytes, rows * 64 * 4 + rows * 4 + 256 + rows * 4);  // the turnstiles: 64 int32, 256 bytes
  EXPECT_EQ(turnstiles * 4, 256u);
  EXPECT_EQ(fa_backward_workspace_size(nullptr, &bytes, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_EQ(bytes, 0u);
  fa_attention_params bad = valid_params();
  bad.seqlen_q = 0;
  EXPECT_EQ(fa_backward_workspace_size(&bad, &bytes, err, sizeof err), FA_ERROR_INVALID);
}

// The split-KV workspace: for a decode call (at most 64 query rows per KV head), enough for one
// range per 64-key tile up to 64 ranges; nothing for a call the decode kernel does not take. The
// split fields pass through to validation: a split on a step without split-KV, or with too short a
// workspace, is refused.
TEST(CApi, ForwardWorkspaceSizeIsTheDecodeKernels) {
  char err[256] = "stale";
  fa_attention_params p = valid_params(128);
  p.heads_q = 32, p.heads_kv = 8, p.seqlen_q = 1, p.seqlen_kv = 1000;  // 4 packed rows, 16 key tiles
  size_t bytes = 1;
  ASSERT_EQ(fa_forward_workspace_size(&p, &bytes, err, sizeof err), FA_OK) << err;
  EXPECT_STREQ(err, "");
  const size_t rows = 2 * 32 * 1, o_bytes = 16 * rows * 128 * 4, round = 256;
  EXPECT_GE(bytes, o_bytes + 16 * rows * 4);              // 16 ranges' partial O and LSE
  EXPECT_LE(bytes, o_bytes + 16 * rows * 4 + 2 * round);  // ... each part rounded up
  p.seqlen_q = 17;                                        // 68 packed rows: not a decode call
  ASSERT_EQ(fa_forward_workspace_size(&p, &bytes, err, sizeof err), FA_OK) << err;
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(fa_forward_workspace_size(nullptr, &bytes, err, sizeof err), FA_ERROR_INVALID);

  fa_attention_params s = valid_params();
  s.num_splits = 2;  // step 00 does not split: it refuses the input
  EXPECT_EQ(fa_validate(first_step_number(), &s, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("does not split the keys"), std::string::npos) << err;
  s.num_splits = 65;
  EXPECT_EQ(fa_validate(first_step_number(), &s, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("num_splits must be"), std::string::npos) << err;
}

TEST(CApiBackward, WhichStepsHaveABackward) {
  EXPECT_EQ(fa_step_has_backward(17), 1);
  EXPECT_EQ(fa_step_has_backward(10), 0);
  EXPECT_EQ(fa_step_has_backward(100), 1);  // the production kernels: kernels/bwd_mma.cu
  EXPECT_EQ(fa_step_has_backward(101), 1);
  EXPECT_LT(fa_step_has_backward(999), 0);
}

// Refusals need no GPU: each is made before anything launches, and says why.
TEST(CApiBackward, RefusesMalformedAndUnsupportedCalls) {
  char err[512];
  EXPECT_EQ(fa_backward(17, nullptr, nullptr, err, sizeof err), FA_ERROR_INVALID);
  fa_backward_params b = valid_backward();
  b.struct_size -= 8;
  EXPECT_EQ(fa_backward(17, &b, nullptr, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("sizeof(fa_backward_params)"), std::string::npos) << err;
  b = valid_backward();
  b.reserved[3] = 1;
  EXPECT_EQ(fa_backward(17, &b, nullptr, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("reserved[3]"), std::string::npos) << err;
  b = valid_backward();
  b.reserved_flags = 4;
  EXPECT_EQ(fa_backward(17, &b, nullptr, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("reserved_flags is 4"), std::string::npos) << err;
  b = valid_backward();
  b.deterministic = 2;
  EXPECT_EQ(fa_backward(17, &b, nullptr, err, sizeof err), FA_ERROR_INVALID);
  EXPECT_NE(std::string(err).find("deterministic is 2; it must be 0 or 1"), std::string::npos) << err;
  b = valid_backward();
  b.deterministic = 1;
  EXPECT_EQ(fa_backward(17, &b, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("no deterministic mode"), std::string::npos) << err;
  b = valid_backward();
  EXPECT_EQ(fa_backward(10, &b, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("step 10 has no backward"), std::string::npos) << err;
  EXPECT_EQ(fa_backward(999, &b, nullptr, err, sizeof err), FA_ERROR_INVALID);
  b.fwd.lse = nullptr;
  EXPECT_EQ(fa_backward(17, &b, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("needs the forward's LSE"), std::string::npos) << err;
  b = valid_backward();
  b.workspace_bytes -= 1;
  EXPECT_EQ(fa_backward(FA_STEP_AUTO, &b, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("needs a workspace of"), std::string::npos) << err;
  fa_backward_params d80 = valid_backward(80);
  EXPECT_EQ(fa_backward(FA_STEP_AUTO, &d80, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(err).find("head dim 80 is not supported"), std::string::npos) << err;
}

// fp16 (FA_DTYPE_FP16) passes through the C interface to validation: the production forwards take
// it where the library is built with it (FA_DTYPES=bf16;fp16: FA_TEST_DTYPE_MASK bit 1), and so do
// their backwards; every lesson refuses it by name with what it takes, forward and backward, before
// anything runs.
// No GPU: kernel 100 (mma.sync) is pinned to no GPU, so its validation ends without asking for one.
TEST(CApiDtype, Fp16ReachesValidation) {
  const bool fp16_built = (FA_TEST_DTYPE_MASK & 2u) != 0;
  char err[512] = {};
  fa_attention_params p = valid_params();
  p.dtype = FA_DTYPE_FP16;
  for (int i = 0; i < fa_num_steps(); ++i) {
    int number = -1;
    ASSERT_EQ(fa_step_info(i, &number, nullptr, nullptr, nullptr, nullptr), FA_OK);
    if (number >= 100) continue;  // the production kernels, below
    EXPECT_EQ(fa_validate(number, &p, err, sizeof err), FA_ERROR_UNSUPPORTED) << "step " << number;
    EXPECT_NE(std::string(err).find("element type fp16 is not supported by this step; supported: bf16"),
              std::string::npos)
        << number << ": " << err;
  }
  const int rc = fa_validate(100, &p, err, sizeof err);
  if (fp16_built) {
    EXPECT_EQ(rc, FA_OK) << err;
  } else {
    EXPECT_EQ(rc, FA_ERROR_UNSUPPORTED);
    EXPECT_NE(std::string(err).find("element type fp16 is not supported by this step; supported: bf16"),
              std::string::npos)
        << err;
  }
  p.dtype = FA_DTYPE_BF16;
  EXPECT_EQ(fa_validate(100, &p, err, sizeof err), FA_OK) << err;

  // The backwards: a lesson's is bf16 alone; the production kernels' take the types their forwards
  // do. Where fp16 is built the call passes the type's rule and stops at the next one, its
  // workspace one byte short (before anything would be launched at the stand-in pointers).
  fa_backward_params b = valid_backward();
  b.fwd.dtype = FA_DTYPE_FP16;
  b.workspace_bytes -= 1;
  for (int step : {17, 100, 101}) {
    const bool takes_fp16 = fp16_built && step >= 100;
    EXPECT_EQ(fa_backward(step, &b, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED) << step;
    EXPECT_NE(
        std::string(err).find(takes_fp16 ? "the backward needs a workspace of"
                                         : "element type fp16 is not supported by this backward; supported: bf16"),
        std::string::npos)
        << step << ": " << err;
  }
  if (!fp16_built) {
    EXPECT_EQ(fa_backward(FA_STEP_AUTO, &b, nullptr, err, sizeof err), FA_ERROR_UNSUPPORTED);
    EXPECT_NE(std::string(err).find("fp16"), std::string::npos) << err;
  }
}

// An fp16 decode call that needs the decode kernel (a length per sequence): where fp16 is built the
// decode kernel has it too, so the production forwards take the call; without it the type is
// refused by name, the option's rule never reached.
TEST(CApiDtype, Fp16DecodeOptionsFollowTheBuild) {
  char err[512] = {};
  fa_attention_params p = valid_params(128);
  p.heads_q = 32, p.heads_kv = 8, p.seqlen_q = 1, p.seqlen_kv = 1000;
  for (int t = 0; t < 4; ++t) {
    const bool q_side = t == FA_TENSOR_Q || t == FA_TENSOR_O;
    const int64_t heads = q_side ? 32 : 8, rows = q_side ? 1 : 1000;
    p.strides[t][FA_AXIS_BATCH] = heads * rows * 128;
    p.strides[t][FA_AXIS_HEAD] = rows * 128;
  }
  p.dtype = FA_DTYPE_FP16;
  p.seqlens_kv = static_cast<const int32_t*>(stand_in(8));
  if ((FA_TEST_DTYPE_MASK & 2u) != 0) {
    EXPECT_EQ(fa_validate(100, &p, err, sizeof err), FA_OK) << err;
  } else {
    EXPECT_EQ(fa_validate(100, &p, err, sizeof err), FA_ERROR_UNSUPPORTED);
    EXPECT_NE(std::string(err).find("element type fp16 is not supported by this step; supported: bf16"),
              std::string::npos)
        << err;
  }
}

}  // namespace
}  // namespace fa
