// Run a step on a problem and judge its output against a reference (the harness's core loop).
#pragma once

#include <string>
#include <vector>

#include "harness/compare.h"
#include "harness/problem.h"
#include "fa/registry.h"

namespace fa {

enum class ReferenceKind { automatic, cpu, gpu };

struct ReferenceData {
  std::string kind;         // "cpu-fp64" or "gpu-fp32"
  std::vector<double> o;    // contiguous (B, H_q, N_q, D)
  std::vector<double> lse;  // contiguous (B, H_q, N_q)
};

// The fp64 CPU reference for small problems (automatic: up to ~2^28 multiply-adds), else the
// fp32 GPU reference.
ReferenceData compute_reference(const AttentionProblem& prob, ReferenceKind kind = ReferenceKind::automatic);

struct CheckResult {
  Status status = Status::Ok();  // the step's own return value
  CompareResult o, lse;
  bool lse_checked = false;
  bool memory_intact = true;  // no guard region (nor O's row gaps) written
  std::string memory_message;
  std::string reference;
  bool ok() const { return status.ok() && o.ok && (!lse_checked || lse.ok) && memory_intact; }
  std::string summary() const;
};

// Poisons the outputs, runs the step, synchronises, compares O (and LSE when the problem has an
// LSE buffer and the step writes it) with `ref`, and checks that nothing outside O and LSE
// (their guard regions, O's row gaps) was written. O is held to `tol`, or without it to the
// problem's element type's rule (output_tolerance).
CheckResult run_and_check(const StepInfo& step, AttentionProblem& prob, const ReferenceData& ref, const Tolerance& tol);
CheckResult run_and_check(const StepInfo& step, AttentionProblem& prob, const ReferenceData& ref);

// O's tolerance for an element type: bf16_tolerance, or fp16_tolerance (8 times tighter).
inline Tolerance output_tolerance(DType t) {
  return t == DType::fp16 ? fp16_tolerance() : bf16_tolerance();
}

// LSE tolerance: it is an fp32 quantity of magnitude ~log(N_kv) + max logit.
inline Tolerance lse_tolerance() {
  return Tolerance{1e-3, 1e-3, 1e-4};
}

}  // namespace fa
