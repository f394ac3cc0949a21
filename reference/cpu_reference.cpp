#include "reference/cpu_reference.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>

#include "device/mask.h"

namespace fa {
namespace {

// The score modifications of one (batch, query head), params.h's order: the cap on the scaled
// score, then ALiBi's bias; the sink is the row's extra logit.
struct ScoreMods {
  double softcap = 0, slope = 0, sink = -std::numeric_limits<double>::infinity();
  int64_t bias_offset = 0;  // N_kv − N_q: ALiBi's diagonal, whatever causal_align says
  // The modified score of (i, j) from the scaled one, and its derivative with respect to it.
  double score(double s, int64_t i, int64_t j) const {
    if (softcap > 0) s = softcap * std::tanh(s / softcap);
    return s - slope * double(std::llabs(i + bias_offset - j));
  }
  double derivative(double s) const {
    if (softcap <= 0) return 1.0;
    const double t = std::tanh(s / softcap);
    return 1.0 - t * t;
  }
};

ScoreMods score_mods(const AttentionParams& p, const ReferenceScoreMods& mods, int64_t b, int64_t h) {
  if ((p.alibi_slopes && !mods.alibi_slopes) || (p.sinks && !mods.sinks))
    throw std::invalid_argument("cpu_reference: p sets alibi_slopes or sinks; pass their host copies in mods");
  ScoreMods m;
  m.softcap = p.softcap;
  m.bias_offset = p.seqlen_kv - p.seqlen_q;
  if (p.alibi_slopes) m.slope = mods.alibi_slopes[b * p.alibi_slopes_stride_batch + h];
  if (p.sinks) m.sink = mods.sinks[h];
  return m;
}

}  // namespace

ReferenceOutput cpu_reference(const AttentionParams& p, const float* q, const float* k, const float* v,
                              const ReferenceScoreMods& mods) {
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
      const ScoreMods sm = score_mods(p, mods, b, h);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const float* qi = q + b * p.q_stride.batch + h * p.q_stride.head + i * p.q_stride.seq;
        const int64_t row = (b * p.heads_q + h) * p.seqlen_q + i;
        double* oi = out.o.data() + row * D;
        // Scores and their max over the visible keys (the mask removes keys, it never adds 0s) and
        // the sink (−inf without one).
        double m = sm.sink;
        for (int64_t j = 0; j < p.seqlen_kv; ++j) {
          if (!key_visible(i, j, offset, p.causal, p.window_left, p.window_right)) continue;
          const float* kj = k + b * p.k_stride.batch + hk * p.k_stride.head + j * p.k_stride.seq;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(qi[d * p.q_stride.dim]) * double(kj[d * p.k_stride.dim]);
          s[size_t(j)] = sm.score(scale * dot, i, j);
          m = std::max(m, s[size_t(j)]);
        }
        if (std::isinf(m)) {  // no visible key and no sink: O stays 0
          out.lse[size_t(row)] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double l = std::exp(sm.sink - m);  // the sink's term (0 without one); it adds nothing to O
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
                                          const float* d_o, const ReferenceScoreMods& mods) {
  const int64_t D = p.head_dim;
  const double scale = p.effective_scale();
  const int64_t offset = p.causal_offset();
  const ReferenceOutput fwd = cpu_reference(p, q, k, v, mods);
  ReferenceGradients g;
  g.dq.assign(size_t(p.batch * p.heads_q * p.seqlen_q * D), 0.0);
  g.dk.assign(size_t(p.batch * p.heads_kv * p.seqlen_kv * D), 0.0);
  g.dv.assign(size_t(p.batch * p.heads_kv * p.seqlen_kv * D), 0.0);
  g.delta.assign(size_t(p.batch * p.heads_q * p.seqlen_q), 0.0);
  if (p.sinks) g.dsinks.assign(size_t(p.heads_q), 0.0);
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
      const ScoreMods sm = score_mods(p, mods, b, h);
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
        if (p.sinks) g.dsinks[size_t(h)] -= std::exp(sm.sink - lse) * delta;
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
          const double pij = std::exp(sm.score(scale * dot, i, j) - lse);
          const double ds = pij * (dp - delta) * sm.derivative(scale * dot);
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
