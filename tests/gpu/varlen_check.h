// The packed-sequence (varlen) check of step 31 and the Hopper forward, against the fp64
// reference sequence by sequence. Q, K and V are packed (total, H, D) tensors built from fresh random bf16 values
// (or fp16 ones: VarlenOptions::dtype, for the production kernels built with FA_DTYPES=bf16;fp16);
// sequence b is rows cu_seqlens[b] .. cu_seqlens[b+1] − 1 of each, with lengths that differ between queries and keys,
// sequences with no queries or no keys, and a longest length above every real one. O and the LSE
// start NaN with rows past the packed ones, which must stay NaN; K and V have NaN rows past
// total_kv, which a sequence reading past its keys would meet (a sequence reading its neighbour's
// keys fails the reference instead). With `rows_past_last`, the call's tensors include those NaN
// rows (total_q and total_kv past the last sequence's end, as a packed buffer larger than its
// sequences): a kernel whose loads or stores run past a sequence without clipping at its end, as
// a TMA tensor map of the whole packed tensor does, meets them inside the tensor.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "harness/check.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "harness/problem.h"
#include "library/tuner.h"
#include "reference/cpu_reference.h"
#include "tests/gpu/step_suite.h"

namespace fa::testing {

constexpr int kGuardRows = 8;  // NaN rows after each packed tensor

struct PackedTensor {
  std::vector<float> host;     // (total, H, D), the elements' values as floats
  std::vector<uint16_t> bits;  // the same plus kGuardRows NaN rows
};

// Elements of type `dtype` (bf16 or fp16; 0xFFFF, the guard rows' value, is NaN in both).
inline PackedTensor random_packed(int64_t total, int64_t heads, int64_t d, std::mt19937& rng,
                                  DType dtype = DType::bf16) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  PackedTensor t;
  t.bits.assign(size_t((total + kGuardRows) * heads * d), 0xFFFF);
  t.host.resize(size_t(total * heads * d));
  for (size_t i = 0; i < t.host.size(); ++i) {
    t.bits[i] = std::bit_cast<uint16_t>(float_to_element(normal(rng), dtype));
    t.host[i] = element_to_float(t.bits[i], dtype);
  }
  return t;
}

inline std::vector<int32_t> offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu(1, 0);
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

// Runs the step on sequences of `q_len[b]` queries and `kv_len[b]` keys (longest: the largest plus
// `slack`), with num_splits (0: no workspace; S > 1: that many with one), and checks each sequence.
// `config`: run that configuration of the step's own tuner (Tuner::run_config, no routing), else
// the step's forward. `window`: a sliding window (left, right) on every sequence. `refusal`: the
// call must be refused with a message holding it, and O and the LSE left as they were. `dtype`: Q, K,
// V and O's element type, O held to that type's rule (output_tolerance).
struct VarlenOptions {
  std::pair<int64_t, int64_t> window{-1, -1};
  std::string refusal;
  DType dtype = DType::bf16;
};
inline void expect_varlen_matches(const std::vector<int32_t>& q_len, const std::vector<int32_t>& kv_len,
                                  int64_t heads_q, int64_t heads_kv, int64_t d, bool causal, int num_splits,
                                  int slack = 0, bool rows_past_last = false, const std::string& config = "",
                                  const VarlenOptions& options = {}) {
  const int64_t B = int64_t(q_len.size());
  const std::vector<int32_t> cu_q = offsets(q_len), cu_kv = offsets(kv_len);
  const int64_t total_q = cu_q.back(), total_kv = cu_kv.back();
  std::mt19937 rng(uint32_t(31000 + B * 7 + total_q * 13 + total_kv * 17 + d + causal));
  const DType dtype = options.dtype;
  const PackedTensor q = random_packed(total_q, heads_q, d, rng, dtype),
                     k = random_packed(total_kv, heads_kv, d, rng, dtype),
                     v = random_packed(total_kv, heads_kv, d, rng, dtype);
  DeviceBuffer<uint16_t> q_dev(q.bits.size()), k_dev(k.bits.size()), v_dev(v.bits.size());
  q_dev.upload(q.bits), k_dev.upload(k.bits), v_dev.upload(v.bits);
  // The rows the call says its packed tensors have: the sequences', or those and the NaN rows.
  const int64_t call_q = total_q + (rows_past_last ? kGuardRows : 0);
  const int64_t call_kv = total_kv + (rows_past_last ? kGuardRows : 0);
  DeviceBuffer<uint16_t> o_dev(size_t((total_q + kGuardRows) * heads_q * d));
  DeviceBuffer<float> lse_dev(size_t(heads_q * call_q + kGuardRows));
  FA_CUDA_CHECK(cudaMemset(o_dev.get(), 0xFF, o_dev.bytes()));
  FA_CUDA_CHECK(cudaMemset(lse_dev.get(), 0xFF, lse_dev.bytes()));
  DeviceBuffer<int32_t> cu_q_dev(cu_q.size()), cu_kv_dev(cu_kv.size());
  cu_q_dev.upload(cu_q), cu_kv_dev.upload(cu_kv);

  AttentionParams p;
  p.batch = B, p.heads_q = heads_q, p.heads_kv = heads_kv, p.head_dim = d, p.dtype = dtype;
  p.seqlen_q = *std::max_element(q_len.begin(), q_len.end()) + slack;
  p.seqlen_kv = *std::max_element(kv_len.begin(), kv_len.end()) + slack;
  p.q = q_dev.get(), p.k = k_dev.get(), p.v = v_dev.get(), p.o = o_dev.get(), p.lse = lse_dev.get();
  p.q_stride = p.o_stride = Strides{0, d, heads_q * d, 1};  // (total, H, D)
  p.k_stride = p.v_stride = Strides{0, d, heads_kv * d, 1};
  p.causal = causal, p.causal_align = CausalAlign::bottom_right;
  p.cu_seqlens_q = cu_q_dev.get(), p.cu_seqlens_kv = cu_kv_dev.get();
  p.total_q = call_q, p.total_kv = call_kv;
  p.window_left = options.window.first, p.window_right = options.window.second;
  const size_t ws_bytes = split_kv_workspace_bytes(p, num_splits);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  if (num_splits > 1) {
    ws.poison();
    p.workspace = ws.get(), p.workspace_bytes = ws_bytes, p.num_splits = num_splits;
  }
  const Status st = config.empty() ? the_step().forward(p, nullptr)
                                   : tuner::find_tuner(the_step().number)->run_config(p, config, nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  if (!options.refusal.empty()) {
    ASSERT_FALSE(st.ok()) << "the call was to be refused (" << options.refusal << ")";
    EXPECT_NE(st.message().find(options.refusal), std::string::npos) << st.message();
    for (uint16_t x : o_dev.download()) ASSERT_EQ(x, 0xFFFF) << "a refused call wrote O";
    for (float x : lse_dev.download()) ASSERT_TRUE(std::isnan(x)) << "a refused call wrote the LSE";
    return;
  }
  ASSERT_TRUE(st.ok()) << st.message();

  std::string lens;
  for (int64_t b = 0; b < B; ++b)
    lens += std::to_string(q_len[size_t(b)]) + "/" + std::to_string(kv_len[size_t(b)]) + " ";
  SCOPED_TRACE("lengths (q/kv) " + lens + "H " + std::to_string(heads_q) + "/" + std::to_string(heads_kv) + " D " +
               std::to_string(d) + (causal ? " causal" : "") + ", num_splits " + std::to_string(num_splits) +
               ", window (" + std::to_string(p.window_left) + ", " + std::to_string(p.window_right) + ")" +
               (dtype == DType::fp16 ? ", fp16" : ""));
  const std::vector<uint16_t> o_bits = o_dev.download();
  const std::vector<float> lse_all = lse_dev.download();
  std::vector<float> out, out_lse;  // the kernel's, in the reference's per-sequence (H, N_q, D) order
  std::vector<double> ref_o, ref_lse;
  for (int64_t b = 0; b < B; ++b) {
    AttentionParams one = p;  // sequence b alone: (1, H, len, D) views of the packed host tensors
    one.batch = 1, one.seqlen_q = q_len[size_t(b)], one.seqlen_kv = kv_len[size_t(b)];
    one.cu_seqlens_q = one.cu_seqlens_kv = nullptr, one.total_q = one.total_kv = 0;
    if (one.seqlen_q == 0) continue;
    const ReferenceOutput r =
        cpu_reference(one, q.host.data() + cu_q[size_t(b)] * heads_q * d,
                      k.host.data() + cu_kv[size_t(b)] * heads_kv * d, v.host.data() + cu_kv[size_t(b)] * heads_kv * d);
    ref_o.insert(ref_o.end(), r.o.begin(), r.o.end());
    ref_lse.insert(ref_lse.end(), r.lse.begin(), r.lse.end());
    for (int64_t h = 0; h < heads_q; ++h)
      for (int64_t i = 0; i < one.seqlen_q; ++i) {
        const int64_t row = cu_q[size_t(b)] + i;
        for (int64_t c = 0; c < d; ++c)
          out.push_back(element_to_float(o_bits[size_t((row * heads_q + h) * d + c)], dtype));
        out_lse.push_back(lse_all[size_t(h * call_q + row)]);
      }
  }
  const CompareResult co = compare(out, ref_o, output_tolerance(dtype));
  const CompareResult cl = compare(out_lse, ref_lse, lse_tolerance());
  EXPECT_TRUE(co.ok) << "O: " << co.summary();
  EXPECT_TRUE(cl.ok) << "LSE: " << cl.summary();
  for (size_t i = size_t(total_q * heads_q * d); i < o_bits.size(); ++i)
    ASSERT_EQ(o_bits[i], 0xFFFF) << "O written past its packed rows, element " << i;
  for (size_t i = 0; i < lse_all.size(); ++i) {
    const bool row_of_a_sequence = int64_t(i) < heads_q * call_q && int64_t(i) % call_q < total_q;
    if (!row_of_a_sequence) {
      ASSERT_TRUE(std::isnan(lse_all[i])) << "LSE written past its sequences, element " << i;
    }
  }
}

}  // namespace fa::testing
