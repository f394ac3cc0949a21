// The production kernels' ScoreMod policies: a hook on each score tile S = Q·Kᵀ (raw, before the
// softmax scale) after the product and before the mask and the row max, and one on each finished
// row before the epilogue. A policy is a functor called as score_mod(s, row0, col0) on a warp's
// (16, N) tile whose first row is query row `row0` and first column key `col0`, in the fragment
// layout of device/warp_tile.h (wgmma's accumulators share it); the backward calls
// score_mod.transposed(s, key0, query0) on its (keys, queries) tiles and score_mod.ds_transposed
// for dSᵀ.
//
//   Identity   compiles to no instruction: the kernels the steps measured.
//   Mods<M>    the call's softcap, ALiBi and sinks (AttentionParams, Part VI). M says at compile time
//              which of them the kernel has code for (kCapMod, kAlibiMod, kSinksMod); each present one
//              is applied where the call has it. A call with one modification runs the kernel of that
//              one alone, with no instruction for the other two (Softcap, Sinks; ALiBi's forward
//              OneSidedAlibi on causal calls, its backward Alibi); a call with several runs
//              ScoreMods = Mods<kAllMods>. (With all three read at run time in one
//              kernel, a call with sinks alone ran at 0.79x the plain call on the H200: the ALiBi
//              code, if-converted on the no-cap path, is issued whether the slope is 0 or not.)
//
// The kernels work in raw score units (the scale is folded into the exp2's constant c = scale·log2 e),
// so each modification is converted into them once, on the host (ScoreModArgs, a kernel parameter
// the kernels read from the constant bank), and a (batch, head)'s slope once per work tile:
//   softcap  scale·s ← cap·tanh(scale·s / cap)   is   s ← (cap/scale)·tanh(s·scale/cap): the cap sits
//            on the scaled score, as flash-attn's (the scale inside the tanh, not after it);
//   ALiBi    scale·s ← scale·s − slope·|i + N_kv − N_q − j|   is   s ← s − (slope/scale)·|…|;
//   sink     a logit `sink` beside the row's scaled scores is one of sink/scale raw units: at the
//            end, l ← l·α + 2^(c·sink/scale − c·m′), m′ = max(m, sink/scale), O ← α·O, α = 2^(c·m − c·m′).
// The backward needs the cap's derivative, dS ← dS·(1 − t²) with t = tanh(scale·s/cap). Instead of
// a tile of t kept alive from the scores to dS (registers the backwards do not have), t is read
// back from P itself: P = 2^(c·s′ − lse₂), so c·s′ = log₂ P + lse₂ and t = (s′ + bias)·scale/cap.
// Where P is 0 (masked, underflowed, or a row that saw no key, lse₂ = +inf) the factor is 0: its
// dS is 0 anyway, and log₂ 0 + lse₂ would be −inf or NaN.
//
// The scalar forms (FA_HD) are what the tile functions apply per element; the CPU tests check them
// against the fp64 reference's formulas (tests/cpu/score_mod_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "device/backward_tile.h"
#include "device/warp_tile.h"
#include "fa/params.h"
#include "kernels/mask.h"

namespace fa::kernels {

/// −1/(2^z + 1), the kernels' way to tanh (tanh x = 1 − 2/(e^(2x) + 1)): the exp2 on the
/// special-function unit, the reciprocal on the FMA units (an integer first guess good to 5 %, then
/// two Newton steps r ← r + r·(1 − y·r), each squaring the error: 2.6e-3, then 6.6e-6, always from
/// below). z is clamped at 64, where the result is 5e-20, so that 2^z never overflows (below, 2^z →
/// 0 and the result → 1). The special-function unit does a quarter of the FMA units' work per clock
/// and the softmax's exp2 already keeps it half busy at D = 128: with the reciprocal there too
/// (`__fdividef`), a capped score took three of its slots. (`tanh.approx.f32`, one slot, has a
/// relative error of up to 2^-11: under a cap of 50, logits moved by up to 0.025, six times the bf16
/// rounding of P.) A third Newton step (to 9e-8) cost the capped forward two instructions an
/// element, 10 % of its issue slots (run V in docs/production_layer.md).
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float minus_recip_exp2_plus_one(float z) {
  const float y = ptx::exp2_approx(fminf(z, 64.0f)) + 1.0f;  // in [1, 2^64]
  float r = __int_as_float(0x7EF311C3 - __float_as_int(y));  // 1/y to 5 %
  r = fmaf(r, fmaf(-y, r, 1.0f), r);
  return fmaf(-r, fmaf(-y, r, 1.0f), -r);  // the sign in the last step's operands: no instruction
}
#endif

/// tanh x = 1 − 2/(e^(2x) + 1), to an absolute error of 1.3e-5 (twice the reciprocal's relative
/// one): under a cap of 50 a logit moves by at most 6.6e-4, a third of the bf16 rounding of P.
/// std::tanh on the host. The forward and the backward's recomputation run the same instructions
/// on the same score (the Softcap kernel's are the same with the cap folded into the exp2's
/// constant), so P agrees with the LSE the forward stored.
FA_HD float tanh_fast(float x) {
#if defined(__CUDA_ARCH__)
  return fmaf(2.0f, minus_recip_exp2_plus_one(x * 2.8853900817779268f), 1.0f);  // 2x·log₂ e
#else
  return std::tanh(x);
#endif
}

/// log₂ on the special-function unit (`lg2.approx.ftz.f32`; 0 gives −inf), std::log2 on the host.
FA_HD float log2_fast(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return std::log2(x);
#endif
}

/// What the score modifications need beyond the call's arrays, in the kernels' raw score units:
/// computed once on the host (score_mod_args) and passed as a kernel parameter, so that the kernels
/// read these from the constant bank instead of holding them in registers through their loops.
struct ScoreModArgs {
  float cap = 0.0f;         // softcap / scale; 0: no cap
  float inv_cap = 0.0f;     // scale / softcap
  float cap_z = 0.0f;       // 2·log₂ e · scale / softcap: raw s → z, where e^(2·scale·s/softcap) = 2^z
  float inv_scale = 0.0f;   // 1 / scale: an ALiBi slope or a sink logit into raw units
  float inv_c = 0.0f;       // 1 / c, c = scale·log₂ e
  float scale_log2 = 0.0f;  // c
  int offset = 0;           // ALiBi's diagonal: N_kv − N_q (bottom-right, whatever causal_align says)
};

inline ScoreModArgs score_mod_args(const AttentionParams& p) {
  ScoreModArgs a;
  const float scale = p.effective_scale();
  if (p.softcap > 0.0f) {
    a.cap = p.softcap / scale;
    a.inv_cap = scale / p.softcap;
    a.cap_z = 2.0f * 1.4426950408889634f * a.inv_cap;
  }
  a.inv_scale = 1.0f / scale;
  a.scale_log2 = scale * 1.4426950408889634f;
  a.inv_c = 1.0f / a.scale_log2;
  a.offset = int(p.seqlen_kv - p.seqlen_q);
  return a;
}

struct Identity {
  static constexpr bool kActive = false;
  static constexpr bool kDiagonalFirst = false;  // the kernels visit a Q tile's KV tiles in key order
#if defined(__CUDACC__)
  __device__ __forceinline__ static Identity make(const AttentionParams&, const ScoreModArgs&, int64_t /*b*/,
                                                  int64_t /*h*/) {
    return {};
  }
  __device__ __forceinline__ static Identity reload(const AttentionParams&, const ScoreModArgs&, int64_t, int64_t) {
    return {};
  }
  template <int N>
  __device__ __forceinline__ void operator()(tile::Acc<N>&, int /*row0*/, int /*col0*/) const {}
  template <int N>
  __device__ __forceinline__ void transposed(tile::Acc<N>&, int /*key0*/, int /*query0*/) const {}
  /// dSᵀ = Pᵀ ∘ (dPᵀ − D): device/backward_tile.h's ds_cols.
  template <int N>
  __device__ __forceinline__ tile::Acc<N> ds_transposed(const tile::Acc<N>& p, const tile::Acc<N>& dp,
                                                        const float* delta, const float*, int, int) const {
    return tile::ds_cols(p, dp, delta);
  }
  template <int D>
  __device__ __forceinline__ void finish(tile::Acc<D>&, tile::Rows&, tile::Rows&, const AttentionParams&,
                                         int64_t) const {}
#endif
};

/// Mods' bits: which modifications a kernel has code for.
/// kOneSided (with kAlibiMod alone): ALiBi on a call whose every visible key sits at or before
/// ALiBi's diagonal (alibi_one_sided), where the bias −slope·(i + N_kv − N_q − j) needs no absolute
/// value and its part that depends on the row alone can leave the loop (Mods::operator() says how).
enum ModBits : unsigned { kCapMod = 1u, kAlibiMod = 2u, kSinksMod = 4u, kAllMods = 7u, kOneSided = 8u };

/// Whether every key call p shows a query sits at or before ALiBi's diagonal, j <= i + N_kv − N_q:
/// the call's right edge (causal: the diagonal at causal_offset(); a window: window_right past it)
/// is bounded and no further right than ALiBi's (always bottom-right). Causal decoders with ALiBi
/// (BLOOM, MPT) are.
inline bool alibi_one_sided(const AttentionParams& p) {
  int64_t right = -1;  // keys after the mask's diagonal; −1: unbounded
  if (p.causal) right = 0;
  if (p.window_right >= 0) right = right < 0 ? p.window_right : std::min(right, p.window_right);
  return right >= 0 && p.causal_offset() + right <= p.seqlen_kv - p.seqlen_q;
}

/// The modifications call p has, as Mods' bits.
inline unsigned mod_bits(const AttentionParams& p) {
  return (p.softcap != 0.0f ? kCapMod : 0u) | (p.alibi_slopes != nullptr ? kAlibiMod : 0u) |
         (p.sinks != nullptr ? kSinksMod : 0u);
}

/// The score modifications of one (batch, query head): the args and its ALiBi slope (raw units; 0:
/// none). The scalar forms are what the tile functions apply per element; a modification outside M
/// compiles to nothing.
template <unsigned M>
struct Mods {
  static constexpr bool kActive = true;
  static constexpr unsigned kBits = M;
  static constexpr bool kCap = (M & kCapMod) != 0, kAlibi = (M & kAlibiMod) != 0, kSinks = (M & kSinksMod) != 0;
  static constexpr bool kLinear = (M & kOneSided) != 0;
  static_assert(!kLinear || M == (kAlibiMod | kOneSided), "one-sided ALiBi is a kernel of its own");
  /// One-sided ALiBi's kernel visits a Q tile's KV tiles from the diagonal back to the first key.
  /// Every row's bias is largest at its last visible key, so the first tile holds each row's largest
  /// biases and the row max seldom moves after it (in key order it climbed by slope·BLOCK_N on every
  /// tile, past the lazy rescale's threshold for most heads). Measured in run V it bought kernel 100
  /// two points and kernel 101 nothing: the moving max was not what costs ALiBi there
  /// (docs/production_layer.md). Both orders are right; this one is never slower.
  static constexpr bool kDiagonalFirst = kLinear;
  /// The cap alone: the kernel's scores leave the hook as v = −1/(e^(2x) + 1) in [−1, 0], where x is
  /// the scaled score over the cap and tanh x = 1 + 2v, so the capped logit is softcap·(1 + 2v). The
  /// cap's multiply and tanh's final 1 − 2r fold into the softmax's exp2 constant (exp2_constant:
  /// 2·softcap·log₂ e, with v's row max), and the 1 into finish(), which adds 1/2 to the max:
  /// two instructions an element fewer than cap·tanh_fast(x).
  static constexpr bool kCapUnits = M == kCapMod;
  ScoreModArgs a;
  float slope = 0.0f;

  /// ALiBi's |i + N_kv − N_q − j| of query `row`, key `col`.
  FA_HD float distance(int row, int col) const {
    const int d = row + a.offset - col;
    return float(d < 0 ? -d : d);
  }
  /// Score s (raw) of query `row`, key `col` → the modified score (raw).
  FA_HD float score(float s, int row, int col) const { return modified(s, float(row + a.offset - col)); }
  /// The same, given i + N_kv − N_q − j (signed, as a float).
  FA_HD float modified(float s, float signed_distance) const {
    if (kCap && a.cap != 0.0f) s = a.cap * tanh_fast(s * a.inv_cap);
    if (kAlibi && slope != 0.0f) s -= slope * fabsf(signed_distance);
    return s;
  }
  /// The cap's derivative 1 − t² of query `row`, key `col` from its probability p = 2^(c·s′ − lse2)
  /// (1 without a cap).
  FA_HD float ds_factor(float p, float lse2, int row, int col) const {
    if (!kCap || a.cap == 0.0f) return 1.0f;
    if (!(p > 0.0f)) return 0.0f;  // masked, underflowed, or a row with no key (lse₂ = +inf): its dS is 0
    float capped = (log2_fast(p) + lse2) * a.inv_c;  // s′, the modified score
    if (kAlibi && slope != 0.0f) capped += slope * distance(row, col);
    const float t = fminf(fmaxf(capped * a.inv_cap, -1.0f), 1.0f);
    return 1.0f - t * t;
  }
  /// A row's softmax state (m raw units, l its sum relative to m) with a sink of `sink` raw units
  /// added (−inf: none); alpha: what the row's unnormalised O must be multiplied by.
  FA_HD void finish_row(float& m, float& l, float& alpha, float sink) const {
    alpha = 1.0f;
    if (sink == -INFINITY) return;
    const float m_new = fmaxf(m, sink);
    alpha = exp2_scaled(m - m_new);  // 0 for a row that saw no key (m = −inf)
    l = l * alpha + exp2_scaled(sink - m_new);
    m = m_new;
  }
  FA_HD float exp2_scaled(float x) const {
#if defined(__CUDA_ARCH__)
    return ptx::exp2_approx(x * a.scale_log2);
#else
    return std::exp2(x * a.scale_log2);
#endif
  }

  /// The exp2 constant c the kernel's softmax takes, P = 2^(c·(s − m)): scale·log₂ e on raw
  /// scores, 2·softcap·log₂ e on kCapUnits' v.
  static float exp2_constant(const AttentionParams& p) {
    return (kCapUnits ? 2.0f * p.softcap : p.effective_scale()) * 1.4426950408889634f;
  }

#if defined(__CUDACC__)
  /// Batch b, query head h's.
  __device__ __forceinline__ static Mods make(const AttentionParams& p, const ScoreModArgs& args, int64_t b,
                                              int64_t h) {
    if constexpr (kAlibi)
      if (p.alibi_slopes) return {args, p.alibi_slopes[b * p.alibi_slopes_stride_batch + h] * args.inv_scale};
    return {args, 0.0f};
  }
  /// The same, its slope read again from memory (a volatile load the compiler cannot merge with the
  /// first): for a kernel that would otherwise hold the slope in a register from the scores to dS.
  __device__ __forceinline__ static Mods reload(const AttentionParams& p, const ScoreModArgs& args, int64_t b,
                                                int64_t h) {
    float slope = 0.0f;
    if (kAlibi && p.alibi_slopes) {
      asm volatile("ld.global.nc.f32 %0, [%1];\n"
                   : "=f"(slope)
                   : "l"(p.alibi_slopes + b * p.alibi_slopes_stride_batch + h));
      slope *= args.inv_scale;
    }
    return {args, slope};
  }
  /// The scores of a warp's (16, N) tile, rows queries from row0, columns keys from col0.
  ///
  /// ALiBi's distance |i + N_kv − N_q − j| is taken in floats from one base converted per tile and
  /// thread, plus constants: an int → float conversion per element runs on a quarter-rate unit, as
  /// the exp2 does, and would double that unit's work (exact below 2^24, as the conversion of the
  /// integer distance is).
  ///
  /// One-sided (kLinear): row i's bias −slope·(i + N_kv − N_q − j) is slope·(j − row0 − N_kv + N_q)
  /// minus slope·(i − row0). The second part is the same for every key of the row, and a row's
  /// softmax does not change when all its scores move by one amount: only the first, a column's, is
  /// added here (one add an element), and finish() takes the second from the row's max, so that the
  /// LSE is the modified scores' own. Measured from the warp's first row, the added bias is small
  /// where the row's probability is (near the diagonal) and large only where that is ~0.
  template <int N>
  __device__ __forceinline__ void operator()(tile::Acc<N>& s, int row0, int col0) const {
    if constexpr (!kCap && !kAlibi) return;  // sinks alone: nothing on the scores
    if constexpr (kCapUnits) {
#pragma unroll
      for (int f = 0; f < N / 8; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) s.c[f][e] = minus_recip_exp2_plus_one(s.c[f][e] * a.cap_z);
      return;
    }
    const int lane = tile::lane_id();
    if constexpr (kLinear) {
      const float b0 = slope * float(col0 + ptx::mma_c_col(lane, 0) - row0 - a.offset);
#pragma unroll
      for (int f = 0; f < N / 8; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) s.c[f][e] += fmaf(slope, float(8 * f + ptx::mma_c_col(0, e)), b0);
      return;
    }
    // element (f, e): row row0 + mma_c_row(lane, e), column col0 + 8f + mma_c_col(lane, e), so its
    // signed distance is base + mma_c_row(0, e) − mma_c_col(0, e) − 8f, constants added to one float
    const float base = float(row0 + a.offset + ptx::mma_c_row(lane, 0) - col0 - ptx::mma_c_col(lane, 0));
#pragma unroll
    for (int f = 0; f < N / 8; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s.c[f][e] = modified(s.c[f][e], base + float(ptx::mma_c_row(0, e) - ptx::mma_c_col(0, e) - 8 * f));
  }
  /// The same on a (keys, queries) tile: rows keys from key0, columns queries from query0.
  template <int N>
  __device__ __forceinline__ void transposed(tile::Acc<N>& s, int key0, int query0) const {
    if constexpr (!kCap && !kAlibi) return;
    const int lane = tile::lane_id();
    // element (f, e): key key0 + mma_c_row(lane, e), query query0 + 8f + mma_c_col(lane, e)
    const float base = float(query0 + a.offset + ptx::mma_c_col(lane, 0) - key0 - ptx::mma_c_row(lane, 0));
#pragma unroll
    for (int f = 0; f < N / 8; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s.c[f][e] = modified(s.c[f][e], base + float(ptx::mma_c_col(0, e) - ptx::mma_c_row(0, e) + 8 * f));
  }
  /// dSᵀ = Pᵀ ∘ (dPᵀ − D) ∘ (1 − t²) on a (keys, queries) tile, t read back from Pᵀ and the columns'
  /// lse₂; D and lse₂ in shared memory by column from query0's. One pass, each element's D and lse₂
  /// read where they are used (a pass for the factor after device/backward_tile.h's ds_cols held
  /// more values at once: D = 64's Hopper kernel spilled).
  template <int N>
  __device__ __forceinline__ tile::Acc<N> ds_transposed(const tile::Acc<N>& p, const tile::Acc<N>& dp,
                                                        const float* delta, const float* lse2, int key0,
                                                        int query0) const {
    const int lane = tile::lane_id();
    tile::Acc<N> ds;
#pragma unroll
    for (int f = 0; f < N / 8; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = f * 8 + ptx::mma_c_col(lane, e);
        ds.c[f][e] = p.c[f][e] * (dp.c[f][e] - delta[col]) *
                     ds_factor(p.c[f][e], lse2[col], query0 + col, key0 + ptx::mma_c_row(lane, e));
      }
    return ds;
  }
  /// After the last KV tile, query head h's sink (if the call has sinks): m, l (the full row sum)
  /// and O as finish_row says.
  template <int D>
  __device__ __forceinline__ void finish(tile::Acc<D>& o, tile::Rows& m, tile::Rows& l, const AttentionParams& p,
                                         int64_t h) const {
    if constexpr (kLinear) {  // the rows' own part of the bias, −slope·(i − row0), on the max
#pragma unroll
      for (int r = 0; r < 2; ++r) m.r[r] -= slope * float(ptx::mma_c_row(tile::lane_id(), 2 * r));
      return;
    }
    if constexpr (kCapUnits) {  // v's max → the capped logit's, in units of exp2_constant: 1 + 2v = 2(v + 1/2)
#pragma unroll
      for (int r = 0; r < 2; ++r) m.r[r] += 0.5f;  // a row with no key keeps −inf
      return;
    }
    if (!kSinks || p.sinks == nullptr) return;
    const float sink = p.sinks[h] * a.inv_scale;
    tile::Rows alpha;
#pragma unroll
    for (int r = 0; r < 2; ++r) finish_row(m.r[r], l.r[r], alpha.r[r], sink);
    tile::rescale(o, alpha);
  }
#endif
};

using ScoreMods = Mods<kAllMods>;  // any combination, each modification applied where the call has it
using Softcap = Mods<kCapMod>;
using Alibi = Mods<kAlibiMod>;
using OneSidedAlibi = Mods<kAlibiMod | kOneSided>;
using Sinks = Mods<kSinksMod>;

/// f(Mods<…>{}) for the forward kernel that serves call p's modifications: one alone its own (ALiBi
/// one-sided; two-sided, rare, the general kernel), several ScoreMods. f is called only for a call
/// with at least one.
template <typename F>
decltype(auto) with_score_mods(const AttentionParams& p, F&& f) {
  switch (mod_bits(p)) {
    case kCapMod:
      return f(Softcap{});
    case kAlibiMod:
      return alibi_one_sided(p) ? f(OneSidedAlibi{}) : f(ScoreMods{});
    case kSinksMod:
      return f(Sinks{});
    default:
      return f(ScoreMods{});
  }
}

/// The exp2 constant of the forward kernel that serves call p (with_score_mods' choice): the
/// call's scale·log₂ e, or the Softcap kernel's (Mods::kCapUnits).
inline float forward_exp2_constant(const AttentionParams& p) {
  if (!p.has_score_mods()) return p.effective_scale() * 1.4426950408889634f;
  return with_score_mods(p, [&](auto m) { return decltype(m)::exp2_constant(p); });
}

/// f(mask, mod), default-constructed policies, for the backward kernel of call p: WindowFlag (any
/// mask) with the Alibi kernel for slopes alone and the general ScoreMods one with a cap (a Softcap
/// kernel of its own spilled D = 64's deterministic Hopper backward, and a capped backward's cost is
/// its tanh and lg2, not the tests). A sink changes no score (its gradient is the preprocess's,
/// kernels/backward.h): a call with sinks alone runs the mask's kernel, as one without.
template <typename F>
decltype(auto) with_backward_policies(const AttentionParams& p, F&& f) {
  const unsigned in_scores = mod_bits(p) & (kCapMod | kAlibiMod);
  if (in_scores == kAlibiMod) return f(WindowFlag{}, Alibi{});
  if (in_scores != 0) return f(WindowFlag{}, ScoreMods{});
  return p.has_window() ? f(WindowFlag{}, Identity{}) : f(CausalFlag{}, Identity{});
}

}  // namespace fa::kernels
