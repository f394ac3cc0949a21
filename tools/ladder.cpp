// fa2 ladder: the course's main job. Every registered step on the same shape, each checked
// against the GPU reference and timed, printed as one table so the effect of each lesson shows.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/cli.h"
#include "harness/flops.h"
#include "harness/gpu.h"
#include "harness/timer.h"
#include "fa/registry.h"
#include "tools/commands.h"

namespace fa::tools {
namespace {

struct LadderRow {
  int step = 0;
  std::string name, lesson, config;
  bool causal = false;
  bool supported = true;
  bool ok = false;
  std::string error;
  double max_err = 0, rel_err = 0, ms = 0, tflops = 0;
};

}  // namespace

int cmd_ladder(const std::vector<std::string>& args) {
  CliArgs cli(args, {"causal-only", "no-causal"}, {"steps", "b", "h", "n", "d", "csv", "iters", "warmup"});
  std::vector<int64_t> all;
  for (const StepInfo& s : steps()) all.push_back(s.number);
  std::vector<int64_t> wanted = cli.get_int_list("steps", all);
  for (int64_t n : wanted)
    if (!find_step(int(n))) throw std::invalid_argument(unknown_step_message(int(n)));
  if (!require_gpu("ladder")) return 1;

  ProblemShape base;
  base.batch = cli.get_int("b", 2);
  base.heads_q = base.heads_kv = cli.get_int("h", 16);
  base.seqlen_q = base.seqlen_kv = cli.get_int("n", 4096);
  base.head_dim = cli.get_int("d", 64);
  base.seed = 2024;
  TimingOptions opt;
  opt.iters = int(cli.get_int("iters", 10));
  opt.warmup = int(cli.get_int("warmup", 2));

  std::vector<bool> causal_modes;
  if (!cli.flag("causal-only")) causal_modes.push_back(false);
  if (!cli.flag("no-causal")) causal_modes.push_back(true);

  std::fprintf(stderr, "GPU: %s\n", gpu_description().c_str());
  std::vector<LadderRow> rows;
  bool all_ok = true;
  for (bool causal : causal_modes) {
    ProblemShape s = base;
    s.causal = causal;
    AttentionProblem prob(s);
    std::fprintf(stderr, "[ladder] %s: computing the fp32 GPU reference...\n", to_string(s).c_str());
    ReferenceData ref = compute_reference(prob, ReferenceKind::gpu);
    for (size_t idx = 0; idx < wanted.size(); ++idx) {
      const StepInfo& st = *find_step(int(wanted[idx]));
      LadderRow row;
      row.step = st.number;
      row.name = st.name;
      row.lesson = st.lesson;
      row.causal = causal;
      std::fprintf(stderr, "[ladder] (%zu/%zu) step %02d_%s%s ... ", idx + 1, wanted.size(), st.number, st.name.c_str(),
                   causal ? " causal" : "");
      if (causal && !st.caps.causal) {
        row.supported = false;
        std::fprintf(stderr, "no causal support, skipped\n");
        rows.push_back(row);
        continue;
      }
      CheckResult r = run_and_check(st, prob, ref);
      row.ok = r.ok();
      row.max_err = r.o.max_abs_err;
      row.rel_err = r.o.rel_norm;
      if (!r.status.ok()) row.error = r.status.message();
      AttentionParams p = prob.params();
      if (!st.caps.lse) p.lse = nullptr;
      row.config = fa::describe_config(st, p);
      if (r.status.ok()) {
        Timing t = time_on_stream(
            [&](cudaStream_t stream) {
              Status fs = st.forward(p, stream);
              if (!fs.ok()) throw std::runtime_error(fs.message());
            },
            opt);
        row.ms = t.median_ms;
        row.tflops = attention_flops(p) / (t.median_ms * 1e-3) / 1e12;
      }
      all_ok &= row.ok;
      std::fprintf(stderr, "%s, %.3f ms\n", row.ok ? "ok" : "MISMATCH", row.ms);
      if (!row.ok) std::fprintf(stderr, "    %s\n", r.summary().c_str());
      rows.push_back(row);
    }
  }

  std::printf("\nFlashAttention-2 step ladder — B=%lld H=%lld N=%lld D=%lld bf16 — %s\n\n", (long long)base.batch,
              (long long)base.heads_q, (long long)base.seqlen_q, (long long)base.head_dim, gpu_description().c_str());
  std::printf("| step | lesson | causal | max err | rel err | ms | TFLOP/s | × previous step | check |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::map<bool, double> prev_ms;
  for (const LadderRow& r : rows) {
    if (!r.supported) {
      std::printf("| %02d_%s | %s | %s | — | — | — | — | — | not supported |\n", r.step, r.name.c_str(),
                  r.lesson.c_str(), r.causal ? "yes" : "no");
      continue;
    }
    std::string speedup = "—";
    if (prev_ms.count(r.causal) && r.ms > 0) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f×", prev_ms[r.causal] / r.ms);
      speedup = buf;
    }
    std::printf("| %02d_%s | %s | %s | %.2e | %.2e | %.3f | %.1f | %s | %s |\n", r.step, r.name.c_str(),
                r.lesson.c_str(), r.causal ? "yes" : "no", r.max_err, r.rel_err, r.ms, r.tflops, speedup.c_str(),
                r.ok ? "pass" : ("FAIL " + r.error).c_str());
    if (r.ms > 0) prev_ms[r.causal] = r.ms;
  }
  if (cli.has("csv")) {
    std::ofstream csv(cli.get("csv", ""));
    csv << "step,name,causal,B,H,N,D,max_err,rel_err,median_ms,tflops,ok,config\n";
    for (const LadderRow& r : rows)
      if (r.supported)
        csv << r.step << ',' << r.name << ',' << (r.causal ? 1 : 0) << ',' << base.batch << ',' << base.heads_q << ','
            << base.seqlen_q << ',' << base.head_dim << ',' << r.max_err << ',' << r.rel_err << ',' << r.ms << ','
            << r.tflops << ',' << (r.ok ? 1 : 0) << ",\"" << r.config << "\"\n";
  }
  return all_ok ? 0 : 3;
}

}  // namespace fa::tools
