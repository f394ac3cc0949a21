#include "harness/check.h"

#include <sstream>

#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "reference/cpu_reference.h"
#include "reference/gpu_reference.h"

namespace fa {

ReferenceData compute_reference(const AttentionProblem& prob, ReferenceKind kind) {
  AttentionParams p = prob.params();
  if (kind == ReferenceKind::automatic) {
    double macs = double(p.batch) * p.heads_q * p.seqlen_q * p.seqlen_kv * p.head_dim;
    kind = macs <= double(1 << 28) ? ReferenceKind::cpu : ReferenceKind::gpu;
  }
  ReferenceData ref;
  if (kind == ReferenceKind::cpu) {
    std::vector<float> q = prob.host_q(), k = prob.host_k(), v = prob.host_v();
    ReferenceOutput out = cpu_reference(p, q.data(), k.data(), v.data(),
                                        ReferenceScoreMods{prob.alibi_slopes_host.data(), prob.sinks_host.data()});
    ref.kind = "cpu-fp64";
    ref.o = std::move(out.o);
    ref.lse = std::move(out.lse);
    return ref;
  }
  const size_t rows = size_t(p.batch * p.heads_q * p.seqlen_q);
  DeviceBuffer<float> o(rows * size_t(p.head_dim)), lse(rows);
  Status st = gpu_reference(p, o.get(), lse.get(), nullptr);
  if (!st.ok()) throw std::runtime_error(st.message());
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> of = o.download(), lf = lse.download();
  ref.kind = "gpu-fp32";
  ref.o.assign(of.begin(), of.end());
  ref.lse.assign(lf.begin(), lf.end());
  return ref;
}

CheckResult run_and_check(const StepInfo& step, AttentionProblem& prob, const ReferenceData& ref,
                          const Tolerance& tol) {
  CheckResult r;
  r.reference = ref.kind;
  prob.poison_outputs();
  AttentionParams p = prob.params();
  if (!step.caps.lse) p.lse = nullptr;
  r.status = step.forward(p, nullptr);
  if (!r.status.ok()) return r;
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  r.memory_intact = prob.memory_intact(&r.memory_message);
  r.o = compare(prob.output_bhnd(), ref.o, tol);
  if (p.lse) {
    r.lse_checked = true;
    r.lse = compare(prob.lse(), ref.lse, lse_tolerance());
  }
  return r;
}

CheckResult run_and_check(const StepInfo& step, AttentionProblem& prob, const ReferenceData& ref) {
  return run_and_check(step, prob, ref, output_tolerance(prob.shape().dtype));
}

std::string CheckResult::summary() const {
  std::ostringstream os;
  if (!status.ok()) return "step returned an error: " + status.message();
  os << "O vs " << reference << ": " << o.summary();
  if (lse_checked) os << "\n  LSE: " << lse.summary();
  if (!memory_intact) os << "\n  memory outside the outputs was written: " << memory_message;
  return os.str();
}

}  // namespace fa
