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
          if (p.causal && !causal_visible(i, j, offset)) continue;
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
          if (p.causal && !causal_visible(i, j, offset)) continue;
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

}  // namespace fa
