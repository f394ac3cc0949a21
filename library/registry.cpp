// The step registry: every step registers itself here; the CLI, the tests, the benchmark and the
// C interface find steps through it.
#include <algorithm>
#include <cstdint>
#include <string>

#include "fa/registry.h"
#include "library/tuner.h"

namespace fa {
namespace {

std::vector<StepInfo>& mutable_steps() {
  static std::vector<StepInfo> list;  // function-local: safe to use during static initialisation
  return list;
}

}  // namespace

StepRegistrar::StepRegistrar(StepInfo info) {
  auto& list = mutable_steps();
  list.push_back(std::move(info));
  std::sort(list.begin(), list.end(), [](const StepInfo& a, const StepInfo& b) { return a.number < b.number; });
}

const std::vector<StepInfo>& steps() {
  return mutable_steps();
}

const StepInfo* find_step(int number) {
  for (const StepInfo& s : steps())
    if (s.number == number) return &s;
  return nullptr;
}

std::string unknown_step_message(int number) {
  std::string msg = "unknown step " + std::to_string(number) + "; registered steps:";
  for (const StepInfo& t : steps()) {
    msg += ' ';
    msg += std::to_string(t.number);
  }
  return msg;
}

std::string describe_config(const StepInfo& info, const AttentionParams& params) {
  if (info.describe) return info.describe(params);
  if (const tuner::Tuner* t = tuner::find_tuner(info.number)) return t->describe(params);
  return info.config;
}

namespace {

// The candidates of the library's choice, fastest first: the production kernels (numbered above
// every step: 101 Hopper, 100 mma.sync), then the steps, later ones first (they are faster). A
// kernel that refuses the input (101 on a GPU that is not sm_90, or strides TMA cannot express)
// passes it to the next.
std::vector<const StepInfo*> candidates() {
  std::vector<const StepInfo*> out;
  for (const StepInfo& s : steps()) out.push_back(&s);
  std::reverse(out.begin(), out.end());
  return out;
}

// Whether a step has every Part V option the call uses (a split, lengths per sequence, pages,
// packed sequences, an append). When no step takes a call, the refusal that explains it is the last one among
// those that do: step 00's "block_table must be null" says nothing about a call whose page size is
// wrong.
bool takes_options_of(const AttentionParams& p, const Capabilities& c) {
  return (p.num_splits <= 1 || c.split_kv) && (!p.seqlens_kv || c.seqlens_kv) && (!p.block_table || c.paged_kv) &&
         (!p.cu_seqlens_q || c.varlen) && (!p.k_new || c.kv_append);
}

// The refusal a choice among the candidates reports when none takes the call: the last (most
// general) step's among those with the call's options, else the last step's.
class Refusal {
 public:
  explicit Refusal(const AttentionParams& p) : p_(p) {}
  void saw(const Status& st, const Capabilities& c) {
    last_ = st;
    if (takes_options_of(p_, c)) telling_ = st, told_ = true;
  }
  Status status() const { return told_ ? telling_ : last_; }

 private:
  const AttentionParams& p_;
  Status last_ = Status::Unsupported("no step is registered"), telling_ = last_;
  bool told_ = false;
};

}  // namespace

Status choose_step(const AttentionParams& params, int* number) {
  Refusal refusal(params);
  for (const StepInfo* s : candidates()) {
    const Status st = validate(params, s->caps);
    if (st.ok()) {
      *number = s->number;
      return st;
    }
    refusal.saw(st, s->caps);
  }
  return refusal.status();  // the most general refusal with the call's options: its reason is the input's
}

Status forward_auto(const AttentionParams& params, cudaStream_t stream, int* number) {
  Refusal refusal(params);
  for (const StepInfo* s : candidates()) {
    // Every forward validates first, and a refusal (by validation, or at launch when no
    // configuration fits this GPU's shared memory) writes nothing: the next candidate may run it.
    // Ok, or a runtime error: done.
    const Status st = s->forward(params, stream);
    if (st.ok() || !st.unsupported()) {
      *number = s->number;
      return st;
    }
    refusal.saw(st, s->caps);
  }
  return refusal.status();
}

Status backward_auto(const BackwardParams& params, cudaStream_t stream, int* number) {
  Status last = Status::Unsupported("no registered step has a backward");
  for (const StepInfo* s : candidates()) {
    if (!s->backward) continue;
    last = s->backward(params, stream);  // validates first; a refusal writes nothing
    if (last.ok() || !last.unsupported()) {
      *number = s->number;
      return last;
    }
  }
  return last;
}

Status run_step(int number, const AttentionParams& params, cudaStream_t stream) {
  const StepInfo* s = find_step(number);
  if (!s) return Status::Error(unknown_step_message(number));
  return s->forward(params, stream);
}

}  // namespace fa
