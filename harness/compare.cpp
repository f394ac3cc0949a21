#include "harness/compare.h"

#include <cmath>
#include <sstream>

namespace fa {
namespace {

template <typename R>
CompareResult compare_impl(const float* out, const R* ref, size_t n, const Tolerance& tol) {
  CompareResult r;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < n; ++i) {
    double o = out[i], e = static_cast<double>(ref[i]);
    if (std::isinf(e) && e < 0) {  // fully masked row's LSE: must be -inf exactly
      if (!(std::isinf(o) && o < 0)) {
        if (r.nonfinite++ == 0) r.first_nonfinite = int64_t(i);
        if (r.violations++ == 0) r.first_violation = int64_t(i);
      }
      continue;
    }
    if (!std::isfinite(o) || !std::isfinite(e)) {
      if (r.nonfinite++ == 0) r.first_nonfinite = int64_t(i);
      continue;
    }
    double d = std::fabs(o - e);
    err2 += d * d;
    ref2 += e * e;
    if (d > r.max_abs_err || r.worst_index < 0) {
      r.max_abs_err = d;
      r.worst_index = int64_t(i);
      r.worst_out = o;
      r.worst_ref = e;
    }
    if (d > tol.atol + tol.rtol * std::fabs(e)) {
      if (r.violations++ == 0) r.first_violation = int64_t(i);
    }
  }
  r.rel_norm = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  r.ok = n > 0 && r.nonfinite == 0 && r.violations == 0 && r.rel_norm <= tol.max_rel_norm;
  return r;
}

}  // namespace

CompareResult compare(const float* out, const double* ref, size_t n, const Tolerance& tol) {
  return compare_impl(out, ref, n, tol);
}
CompareResult compare(const float* out, const float* ref, size_t n, const Tolerance& tol) {
  return compare_impl(out, ref, n, tol);
}

std::string CompareResult::summary() const {
  std::ostringstream os;
  os << (ok ? "PASS" : "FAIL") << ": max|err|=" << max_abs_err << " at " << worst_index << " (out " << worst_out
     << ", ref " << worst_ref << "), rel_norm=" << rel_norm << ", violations=" << violations;
  if (first_violation >= 0) os << " (first at " << first_violation << ")";
  os << ", non-finite=" << nonfinite;
  if (first_nonfinite >= 0) os << " (first at " << first_nonfinite << ")";
  return os.str();
}

}  // namespace fa
