#include "reference/cpu_reference.h"

#include <cmath>
#include <limits>

#include "device/mask.h"

namespace fa {

ReferenceOutput cpu_reference(const AttentionParams& p, const float* q, const float* k, const float* v) {
  const int64_t D = p.head_dim;
  const double scale = p.effective_scale();
  const int64_t offset = p.causal_offset();
  ReferenceOutput out;
  out.o.assign(size_t(p.batch * p.heads_q * p.seqlen_q * D), 0.0);
  out.lse.assign(size_t(p.batch * p.heads_q * p.seqlen_q), 0.0);
  std::vector<double> s(size_t(p.seqlen_kv));

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = kv_head_of(h, p.heads_q, p.heads_kv);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const float* qi = q + b * p.q_stride.batch + h * p.q_stride.head + i * p.q_stride.seq;
        const int64_t row = (b * p.heads_q + h) * p.seqlen_q + i;
        double* oi = out.o.data() + row * D;
        // Scores and their max over the visible keys (the mask removes keys, it never adds 0s).
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < p.seqlen_kv; ++j) {
          if (!key_visible(i, j, offset, p.causal, p.window_left, p.window_right)) continue;
          const float* kj = k + b * p.k_stride.batch + hk * p.k_stride.head + j * p.k_stride.seq;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(qi[d * p.q_stride.dim]) * double(kj[d * p.k_stride.dim]);
          s[size_t(j)] = scale * dot;
          m = std::max(m, s[size_t(j)]);
        }
        if (std::isinf(m)) {  // no visible key: O stays 0
          out.lse[size_t(row)] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double l = 0;
        for (int64_t j = 0; j < p.seqlen_kv; ++j) {
          if (!key_visible(i, j, offset, p.causal, p.window_left, p.window_right)) continue;
          const double pj = std::exp(s[size_t(j)] - m);
          l += pj;
          const float* vj = v + b * p.v_stride.batch + hk * p.v_stride.head + j * p.v_stride.seq;
          for (int64_t d = 0; d < D; ++d) oi[d] += pj * double(vj[d * p.v_stride.dim]);
        }
        for (int64_t d = 0; d < D; ++d) oi[d] /= l;
        out.lse[size_t(row)] = m + std::log(l);
      }
    }
  }
  return out;
}

ReferenceGradients cpu_reference_backward(const AttentionParams& p, const float* q, const float* k, const float* v,
                                          const float* d_o) {
  const int64_t D = p.head_dim;
  const double scale = p.effective_scale();
  const int64_t offset = p.causal_offset();
  const ReferenceOutput fwd = cpu_reference(p, q, k, v);
  ReferenceGradients g;
  g.dq.assign(size_t(p.batch * p.heads_q * p.seqlen_q * D), 0.0);
  g.dk.assign(size_t(p.batch * p.heads_kv * p.seqlen_kv * D), 0.0);
  g.dv.assign(size_t(p.batch * p.heads_kv * p.seqlen_kv * D), 0.0);
  g.delta.assign(size_t(p.batch * p.heads_q * p.seqlen_q), 0.0);
  auto visible = [&](int64_t i, int64_t j) {
    return key_visible(i, j, offset, p.causal, p.window_left, p.window_right);
  };

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = kv_head_of(h, p.heads_q, p.heads_kv);
      const float* kh = k + b * p.k_stride.batch + hk * p.k_stride.head;
      const float* vh = v + b * p.v_stride.batch + hk * p.v_stride.head;
      double* dk = g.dk.data() + (b * p.heads_kv + hk) * p.seqlen_kv * D;
      double* dv = g.dv.data() + (b * p.heads_kv + hk) * p.seqlen_kv * D;
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const int64_t row = (b * p.heads_q + h) * p.seqlen_q + i;
        const double lse = fwd.lse[size_t(row)];
        if (std::isinf(lse)) continue;  // no visible key: no gradient flows through this row
        const float* qi = q + b * p.q_stride.batch + h * p.q_stride.head + i * p.q_stride.seq;
        const float* doi = d_o + b * p.o_stride.batch + h * p.o_stride.head + i * p.o_stride.seq;
        const double* oi = fwd.o.data() + row * D;
        double delta = 0;
        for (int64_t d = 0; d < D; ++d) delta += double(doi[d * p.o_stride.dim]) * oi[d];
        g.delta[size_t(row)] = delta;
        double* dqi = g.dq.data() + row * D;
        for (int64_t j = 0; j < p.seqlen_kv; ++j) {
          if (!visible(i, j)) continue;
          const float* kj = kh + j * p.k_stride.seq;
          const float* vj = vh + j * p.v_stride.seq;
          double dot = 0, dp = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += double(qi[d * p.q_stride.dim]) * double(kj[d * p.k_stride.dim]);
            dp += double(doi[d * p.o_stride.dim]) * double(vj[d * p.v_stride.dim]);
          }
          const double pij = std::exp(scale * dot - lse);
          const double ds = pij * (dp - delta);
          for (int64_t d = 0; d < D; ++d) {
            dv[j * D + d] += pij * double(doi[d * p.o_stride.dim]);
            dqi[d] += scale * ds * double(kj[d * p.k_stride.dim]);
            dk[j * D + d] += scale * ds * double(qi[d * p.q_stride.dim]);
          }
        }
      }
    }
  }
  return g;
}

}  // namespace fa
