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
  if (const tuner::Tuner* t = tuner::find_tuner(info.number)) return t->describe(params);
  return info.config;
}

Status run_step(int number, const AttentionParams& params, cudaStream_t stream) {
  const StepInfo* s = find_step(number);
  if (!s) return Status::Error(unknown_step_message(number));
  return s->forward(params, stream);
}

}  // namespace fa
