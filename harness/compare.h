// Comparing an output against a reference: the course's one correctness rule.
//   pass  <=>  no NaN/Inf anywhere (unless the reference has the same -inf there)
//          and |out - ref| <= atol + rtol·|ref| for every element
//          and ||out - ref|| / ||ref|| <= max_rel_norm
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fa {

struct Tolerance {
  double atol = 1e-2;
  double rtol = 1e-2;
  double max_rel_norm = 1e-2;
};

// bf16 outputs: the seeds' per-element rule, atol = rtol = 1e-2, and a relative norm of 5e-3.
// A correct kernel's error is the rounding of P and O to bf16: ||out − ref|| / ||ref|| ≈ 2.3e-3
// on tensor cores at every N (fp64 reference; steps 00-03, which keep P in fp32, ≈ 1.7e-3), so
// 5e-3 leaves twice that as headroom while softmax state kept in bf16 fails by 3× (1.6e-2 at N = 8192).
inline Tolerance bf16_tolerance() {
  return Tolerance{1e-2, 1e-2, 5e-3};
}

// fp16 outputs: fp16 keeps 11 significant bits where bf16 keeps 8, so the rounding of P and of O,
// all of a correct kernel's error, is 8 times smaller (unit roundoff 2^-11 against 2^-8): bf16's
// rule with every bound divided by 8, atol = rtol = 1.25e-3 and a relative norm of 6.25e-4, keeps
// bf16's headroom (a correct fp16 kernel should measure about 2.3e-3 / 8 ≈ 3e-4; predicted, to be
// measured) and fails a kernel that rounds P to bf16's precision (bf16's share for P alone is about
// 1.5e-3), which bf16's rule would pass.
inline Tolerance fp16_tolerance() {
  return Tolerance{1.25e-3, 1.25e-3, 6.25e-4};
}

struct CompareResult {
  double max_abs_err = 0;    // max |out - ref| over finite pairs
  int64_t worst_index = -1;  // where it occurs (flat index in the compared arrays)
  double worst_out = 0, worst_ref = 0;
  double rel_norm = 0;     // ||out - ref||_2 / ||ref||_2
  int64_t violations = 0;  // elements outside atol + rtol·|ref|
  int64_t first_violation = -1;
  int64_t nonfinite = 0;  // NaN/Inf in out where ref is finite (or NaN anywhere)
  int64_t first_nonfinite = -1;
  bool ok = false;
  std::string summary() const;
};

// Compares n elements. A reference value of -inf (a fully masked row's LSE) demands exactly -inf.
CompareResult compare(const float* out, const double* ref, size_t n, const Tolerance& tol);
CompareResult compare(const float* out, const float* ref, size_t n, const Tolerance& tol);

template <typename R>
CompareResult compare(const std::vector<float>& out, const std::vector<R>& ref, const Tolerance& tol) {
  if (out.size() != ref.size()) {
    CompareResult r;
    r.ok = false;
    r.nonfinite = -1;
    return r;
  }
  return compare(out.data(), ref.data(), out.size(), tol);
}

}  // namespace fa
