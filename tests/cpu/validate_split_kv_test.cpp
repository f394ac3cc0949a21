// The forward's split-KV rules (library/validate.cpp) on stand-in pointers, no GPU: the split
// count, which steps accept a split, the workspace a split needs, ragged cache lengths and paged
// caches' block tables. Each refusal names what is wrong.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "fa/registry.h"
#include "tests/cpu/stand_in.h"

namespace fa {
namespace {

Capabilities caps(bool split_kv) {
  Capabilities c;
  c.causal = c.lse = c.gqa = true;
  c.split_kv = split_kv;
  return c;
}

// A decode call: one query row per sequence, GQA 32/8, a long cache.
AttentionParams decode() {
  return stand_in_params(2, 32, 8, 1, 8192, 128);
}

void expect_refused(const AttentionParams& p, bool split_kv, const std::string& why) {
  const Status st = validate(p, caps(split_kv));
  EXPECT_FALSE(st.ok()) << "accepted; expected a refusal about: " << why;
  EXPECT_TRUE(st.unsupported()) << st.message();
  EXPECT_NE(st.message().find(why), std::string::npos) << "expected \"" << why << "\", got: " << st.message();
}

TEST(ValidateSplitKv, WorkspaceHoldsEverySplitsPartialOutputAndLse) {
  const AttentionParams p = decode();
  const SplitKvWorkspace w = split_kv_workspace(p, 4);
  EXPECT_EQ(w.rows, 2u * 32u * 1u);
  EXPECT_GE(w.lse_partial, 4u * w.rows * 128u * sizeof(float));  // after the partial outputs
  EXPECT_GE(w.bytes, w.lse_partial + 4u * w.rows * sizeof(float));
  EXPECT_EQ(w.o_partial % 256, 0u);
  EXPECT_EQ(w.lse_partial % 256, 0u);
  EXPECT_EQ(split_kv_workspace_bytes(p, 1), 0u);  // no split, no workspace
  EXPECT_EQ(split_kv_workspace_bytes(p, 0), 0u);
}

TEST(ValidateSplitKv, AcceptsASplitWithItsWorkspace) {
  AttentionParams p = decode();
  p.num_splits = 8;
  p.workspace = stand_in(6);
  p.workspace_bytes = split_kv_workspace_bytes(p, 8);
  const Status st = validate(p, caps(true));
  EXPECT_TRUE(st.ok()) << st.message();
  // And with the step choosing (0) or no split (1), with or without a workspace.
  for (int s : {0, 1}) {
    p.num_splits = s;
    EXPECT_TRUE(validate(p, caps(true)).ok());
    EXPECT_TRUE(validate(p, caps(false)).ok());  // a step without split-KV ignores the workspace
  }
}

TEST(ValidateSplitKv, RefusesBadSplitCounts) {
  AttentionParams p = decode();
  p.workspace = stand_in(6);
  p.workspace_bytes = size_t(1) << 30;
  p.num_splits = -1;
  expect_refused(p, true, "num_splits must be 0");
  p.num_splits = kMaxKvSplits + 1;
  expect_refused(p, true, "num_splits must be 0");
  p.num_splits = 2;
  expect_refused(p, false, "does not split the keys");
}

TEST(ValidateSplitKv, RefusesAMissingOrShortWorkspace) {
  AttentionParams p = decode();
  p.num_splits = 4;
  expect_refused(p, true, "needs a workspace of");
  p.workspace = stand_in(6);
  p.workspace_bytes = split_kv_workspace_bytes(p, 4) - 1;
  expect_refused(p, true, "needs a workspace of");
}

TEST(ValidateSplitKv, RefusesAMisalignedOrOverlappingWorkspace) {
  AttentionParams p = decode();
  p.num_splits = 4;
  p.workspace_bytes = split_kv_workspace_bytes(p, 4);
  p.workspace = static_cast<char*>(stand_in(6)) + 4;
  expect_refused(p, true, "16-byte aligned");
  p.workspace = p.o;  // written by the combine while the partials are read
  expect_refused(p, true, "workspace overlaps");
  p.workspace = p.lse;
  expect_refused(p, true, "workspace overlaps");
}

// Ragged caches: only a step that reads a length per sequence takes seqlens_kv, an int32 array.
TEST(ValidateSplitKv, RaggedCacheLengthsOnlyWhereTheStepReadsThem) {
  AttentionParams p = decode();
  p.seqlens_kv = static_cast<const int32_t*>(stand_in(7));
  expect_refused(p, true, "seqlens_kv must be null");
  Capabilities c = caps(true);
  c.seqlens_kv = true;
  EXPECT_TRUE(validate(p, c).ok()) << validate(p, c).message();
  p.seqlens_kv = reinterpret_cast<const int32_t*>(static_cast<const char*>(stand_in(7)) + 2);
  const Status st = validate(p, c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("4-byte aligned"), std::string::npos) << st.message();
}

// The production forwards split and read lengths for decode calls only, and validation says so, so
// that fa_validate accepts exactly what their forward runs.
TEST(ValidateSplitKv, DecodeOnlyWhereTheStepSaysSo) {
  Capabilities c = caps(true);
  c.seqlens_kv = true;
  c.decode_max_packed_rows = 64;
  AttentionParams p = decode();  // 1 row × 4 heads per KV head
  p.seqlens_kv = static_cast<const int32_t*>(stand_in(7));
  EXPECT_TRUE(validate(p, c).ok()) << validate(p, c).message();
  p.seqlen_q = 17;  // 68 rows per KV head
  set_bhnd_strides(p);
  Status st = validate(p, c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a length per sequence (seqlens_kv) is for decode calls"), std::string::npos)
      << st.message();
  p.seqlens_kv = nullptr;
  p.num_splits = 2;
  p.workspace = stand_in(6);
  p.workspace_bytes = split_kv_workspace_bytes(p, 2);
  st = validate(p, c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("split-KV (num_splits > 1) is for decode calls"), std::string::npos) << st.message();
  c.decode_max_packed_rows = 0;  // a step that splits any call
  EXPECT_TRUE(validate(p, c).ok()) << validate(p, c).message();
}

// A paged cache (step 30): decode() with K and V as pools of 64-key pages, (pages, 64, H_kv, D).
AttentionParams paged(int64_t page_size = 64) {
  AttentionParams p = decode();
  p.block_table = static_cast<const int32_t*>(stand_in(8));
  p.page_size = page_size;
  p.block_table_stride = (p.seqlen_kv + page_size - 1) / page_size;
  p.num_pages = p.batch * p.block_table_stride;
  p.k_stride = p.v_stride = Strides{page_size * p.heads_kv * p.head_dim, p.head_dim, p.heads_kv * p.head_dim, 1};
  return p;
}

Capabilities paged_caps() {
  Capabilities c = caps(true);
  c.seqlens_kv = c.paged_kv = true;
  return c;
}

void expect_paged_refused(const AttentionParams& p, const std::string& why) {
  const Status st = validate(p, paged_caps());
  EXPECT_FALSE(st.ok()) << "accepted; expected a refusal about: " << why;
  EXPECT_NE(st.message().find(why), std::string::npos) << "expected \"" << why << "\", got: " << st.message();
}

TEST(ValidatePagedKv, OnlyWhereTheStepReadsATable) {
  const AttentionParams p = paged();
  expect_refused(p, true, "block_table must be null");
  EXPECT_TRUE(validate(p, paged_caps()).ok()) << validate(p, paged_caps()).message();
  AttentionParams q = p;
  q.page_size = 1;  // one key per page: a power of two too
  q.block_table_stride = q.seqlen_kv;
  EXPECT_TRUE(validate(q, paged_caps()).ok()) << validate(q, paged_caps()).message();
}

TEST(ValidatePagedKv, PageSizeTableAndPool) {
  AttentionParams p = paged();
  p.page_size = 48;
  expect_paged_refused(p, "page_size must be a power of two (got 48)");
  p = paged();
  p.page_size = 0;
  expect_paged_refused(p, "page_size must be a power of two");
  p = paged();
  p.block_table_stride = 127;  // 8192 keys in pages of 64: 128 entries
  expect_paged_refused(p, "block_table_stride (127) must hold a sequence's pages: N_kv / page_size rounded up = 128");
  p = paged();
  p.seqlen_kv = 8193;  // one key into a 129th page: the row needs ⌈8193 / 64⌉ = 129 entries
  p.block_table_stride = 128;
  expect_paged_refused(p, "block_table_stride (128) must hold a sequence's pages: N_kv / page_size rounded up = 129");
  p = paged();
  p.num_pages = 0;
  expect_paged_refused(p, "num_pages must be in [1, 2^31 - 1]");
  p = paged();
  p.block_table = reinterpret_cast<const int32_t*>(static_cast<const char*>(stand_in(8)) + 2);
  expect_paged_refused(p, "block_table must be 4-byte aligned");
  p = paged();
  p.block_table = static_cast<const int32_t*>(p.o);  // the table where the output goes
  expect_paged_refused(p, "block_table overlaps o, lse or the workspace");
  p = decode();
  p.page_size = 64;  // paging fields without a table: a mistake, not ignored
  expect_paged_refused(p, "page_size, num_pages and block_table_stride are for a paged KV cache");
}

// K and V are judged as pools: (num_pages, H_kv, page_size, D) through their page strides.
TEST(ValidatePagedKv, KAndVAreJudgedAsPoolsOfPages) {
  AttentionParams p = paged();
  EXPECT_TRUE(validate(p, paged_caps()).ok());
  p.num_pages = int64_t(1) << 30;  // 2^30 pages of 64·8·128 bf16: 2^47 bytes, past O's stand-in 2^45 bytes on
  expect_paged_refused(p, "o overlaps q, k or v");
  p = paged();
  p.k_stride.seq = 100;  // rows not 16-byte aligned
  expect_paged_refused(p, "k strides must be multiples of 8 elements");
  // The kernels address a page in 32 bits: its stride from the pool's start and its rows' span.
  p = paged();
  p.v_stride.batch = int64_t(1) << 31;
  expect_paged_refused(p, "v's pool is too far apart for a page's 32-bit addressing");
  p = paged();
  p.k_stride.seq = int64_t(1) << 26;  // 63 rows of 2^26 elements: past 2^31
  expect_paged_refused(p, "k's pool is too far apart for a page's 32-bit addressing");
  p = paged();
  p.k_stride.seq = int64_t(1) << 60;  // far past: refused, not overflowed into a small product
  expect_paged_refused(p, "k's pool is too far apart for a page's 32-bit addressing");
  p = paged();  // one page: the page stride is never stepped, whatever it is
  p.num_pages = 1;
  p.k_stride.batch = int64_t(1) << 40;
  EXPECT_TRUE(validate(p, paged_caps()).ok()) << validate(p, paged_caps()).message();
  p = paged(1);  // one key per page: the row stride is never stepped, whatever it is
  p.k_stride.seq = int64_t(1) << 40;
  EXPECT_TRUE(validate(p, paged_caps()).ok()) << validate(p, paged_caps()).message();
  p = paged();
  p.k_stride.batch = (int64_t(1) << 31) - 8;  // the farthest page stride that fits, 16-byte aligned
  p.num_pages = 2;
  EXPECT_TRUE(validate(p, paged_caps()).ok()) << validate(p, paged_caps()).message();
}

TEST(ValidatePagedKv, DecodeOnlyWhereTheStepSaysSo) {
  Capabilities c = paged_caps();
  c.decode_max_packed_rows = 64;
  AttentionParams p = paged();
  EXPECT_TRUE(validate(p, c).ok()) << validate(p, c).message();
  p.seqlen_q = 17;  // 68 rows per KV head
  p.q_stride = p.o_stride = bhnd_strides(p.heads_q, p.seqlen_q, p.head_dim);
  const Status st = validate(p, c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a paged KV cache (block_table) is for decode calls"), std::string::npos) << st.message();
}

// Packed sequences (step 31): Q and O (total_q, H_q, D), K and V (total_kv, H_kv, D), B + 1 offsets.
AttentionParams varlen() {
  AttentionParams p = stand_in_params(3, 8, 2, 512, 1024, 64);
  p.q_stride = p.o_stride = Strides{0, 64, 8 * 64, 1};
  p.k_stride = p.v_stride = Strides{0, 64, 2 * 64, 1};
  p.cu_seqlens_q = static_cast<const int32_t*>(stand_in(9));
  p.cu_seqlens_kv = static_cast<const int32_t*>(stand_in(10));
  p.total_q = 700, p.total_kv = 1500;
  return p;
}

Capabilities varlen_caps() {
  Capabilities c = caps(true);
  c.varlen = true;
  return c;
}

void expect_varlen_refused(const AttentionParams& p, const std::string& why) {
  const Status st = validate(p, varlen_caps());
  EXPECT_FALSE(st.ok()) << "accepted; expected a refusal about: " << why;
  EXPECT_NE(st.message().find(why), std::string::npos) << "expected \"" << why << "\", got: " << st.message();
}

TEST(ValidateVarlen, OffsetsOnlyWhereTheStepReadsThem) {
  AttentionParams p = varlen();
  expect_refused(p, true, "cu_seqlens_q and cu_seqlens_kv must be null");
  EXPECT_TRUE(validate(p, varlen_caps()).ok()) << validate(p, varlen_caps()).message();
  p.cu_seqlens_kv = nullptr;
  expect_varlen_refused(p, "need both cu_seqlens_q and cu_seqlens_kv");
  p = varlen();
  p.total_kv = 0;
  expect_varlen_refused(p, "total_q and total_kv (the packed tensors' rows) must be >= 1");
  p = varlen();
  p.cu_seqlens_q = reinterpret_cast<const int32_t*>(static_cast<const char*>(stand_in(9)) + 2);
  expect_varlen_refused(p, "must be 4-byte aligned");
  p = varlen();
  p.seqlens_kv = static_cast<const int32_t*>(stand_in(7));
  Capabilities c = varlen_caps();
  c.seqlens_kv = true;
  const Status st = validate(p, c);
  EXPECT_NE(st.message().find("seqlens_kv and block_table must be null"), std::string::npos) << st.message();
  p = stand_in_params(3, 8, 2, 512, 1024, 64);
  p.total_q = 5;  // a packed size without offsets: a mistake, not ignored
  expect_varlen_refused(p, "total_q and total_kv are for variable-length sequences");
  p = varlen();
  p.cu_seqlens_q = static_cast<const int32_t*>(static_cast<const void*>(p.lse));  // where the LSE goes
  expect_varlen_refused(p, "overlaps o, lse or the workspace");
}

// The packed tensors are judged by their rows: (total, H, D), the batch stride never stepped.
TEST(ValidateVarlen, PackedTensorsAreJudgedByTheirRows) {
  AttentionParams p = varlen();
  p.o_stride.seq = 64;  // two heads' rows on one another
  expect_varlen_refused(p, "two of its elements would be written to the same place");
  p = varlen();
  p.k = static_cast<const char*>(p.o) - 1500 * 2 * 64 * 2 + 64;  // K's last row runs into O
  expect_varlen_refused(p, "o overlaps q, k or v");
}

}  // namespace
}  // namespace fa
