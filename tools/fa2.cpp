// fa2: the course's main tool.
//   fa2 list                       the registered steps, the step each grew from, what each teaches
//   fa2 bench [options]            every step over a sweep of shapes, checked once, timed twice
//   fa2 ladder [options]           fa2 bench's preset: every step on one shape, side by side
//   fa2 run --step NN [shape]      one step on one shape; exit 0 when it matches the reference,
//                                  3 when it does not, 2 on bad input, 77 without a GPU
//                                  (or on a GPU the step is not built for)
#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/cli.h"
#include "harness/flops.h"
#include "harness/gpu.h"
#include "harness/timer.h"
#include "fa/registry.h"
#include "library/tuner.h"
#include "tools/commands.h"

namespace fa::tools {

// ctest's "skipped" (SKIP_RETURN_CODE 77): a step's named cases run `fa2 run`, and on a machine
// without a GPU they have neither passed nor failed.
constexpr int kExitNoGpu = 77;

bool require_gpu(const char* command) {
  std::string why;
  if (gpu_available(&why)) return true;
  std::cerr << "fa2 " << command << ": " << why << ".\n"
            << "This command runs CUDA kernels and needs an NVIDIA GPU (sm_80 or newer).\n";
  return false;
}

int cmd_list(const std::vector<std::string>&) {
  for (const StepInfo& s : steps()) {
    char from[24] = "";
    if (s.base >= 0) std::snprintf(from, sizeof from, "(from %02d)", s.base);
    std::printf("%02d_%-16s %-9s  %s\n", s.number, s.name.c_str(), from, s.lesson.c_str());
  }
  return 0;
}

// `fa2 run --config NAME`: the step runs that one configuration of its tuner, not the tuner's choice
// (the sanitizer visits every configuration this way: scripts/sanitize_configs.sh). A ForwardFn is
// a plain function, so the choice travels in these.
const StepInfo* g_forced_step = nullptr;
std::string g_forced_config;

Status forced_forward(const AttentionParams& p, cudaStream_t stream) {
  if (Status st = validate(p, g_forced_step->caps); !st.ok()) return st;
  return tuner::find_tuner(g_forced_step->number)->run_config(p, g_forced_config, stream);
}

int cmd_configs(const std::vector<std::string>& args) {
  CliArgs cli(args, {}, {"step", "d"});
  if (!cli.has("step")) throw std::invalid_argument("fa2 configs needs --step NN (see fa2 list)");
  const int number = int(cli.get_int("step", -1));
  if (!find_step(number)) throw std::invalid_argument(unknown_step_message(number));
  const tuner::Tuner* t = tuner::find_tuner(number);
  if (!t) throw std::invalid_argument("step " + std::to_string(number) + " has one configuration and no tuner");
  for (const std::string& name : t->config_names(int(cli.get_int("d", 64)))) std::printf("%s\n", name.c_str());
  return 0;
}

int cmd_run(const std::vector<std::string>& args) {
  CliArgs cli(args, {"causal", "bottom-right", "bnhd", "no-check", "sinks"},
              {"step", "b", "h", "hkv", "nq", "nkv", "n", "d", "iters", "warmup", "scale", "config", "window",
               "softcap", "alibi"});
  if (!cli.has("step")) throw std::invalid_argument("fa2 run needs --step NN (see fa2 list)");
  const int number = int(cli.get_int("step", -1));
  const StepInfo* step = find_step(number);
  if (!step) {
    Status st = run_step(number, AttentionParams{}, nullptr);  // the registry's own message
    throw std::invalid_argument(st.message());
  }
  ProblemShape s;
  s.batch = cli.get_int("b", 2);
  s.heads_q = cli.get_int("h", 16);
  s.heads_kv = cli.get_int("hkv", s.heads_q);
  const int64_t n = cli.get_int("n", 4096);
  s.seqlen_q = cli.get_int("nq", n);
  s.seqlen_kv = cli.get_int("nkv", n);
  s.head_dim = cli.get_int("d", 64);
  s.causal = cli.flag("causal");
  s.align = cli.flag("bottom-right") ? CausalAlign::bottom_right : CausalAlign::top_left;
  s.layout = cli.flag("bnhd") ? Layout::bnhd : Layout::bhnd;
  s.softmax_scale = float(cli.get_double("scale", 0.0));
  s.with_lse = step->caps.lse;
  if (cli.has("window")) {  // --window L,R: a sliding window, flash-attn's window_size (-1: unbounded)
    const std::string w = cli.get("window", "");
    const size_t comma = w.find(',');
    size_t used_l = 0, used_r = 0;
    try {
      if (comma == std::string::npos) throw std::invalid_argument("no comma");
      s.window_left = std::stoll(w.substr(0, comma), &used_l);
      s.window_right = std::stoll(w.substr(comma + 1), &used_r);
    } catch (const std::exception&) {
      used_l = used_r = std::string::npos;
    }
    if (used_l != comma || used_r != w.size() - comma - 1)
      throw std::invalid_argument(
          "--window takes LEFT,RIGHT (keys before and after the diagonal, -1 unbounded), got '" + w + "'");
  }

  // Score modifications: --softcap C, --alibi head|batch-head (the problem's slopes), --sinks.
  s.softcap = float(cli.get_double("softcap", 0.0));
  if (cli.has("alibi")) {
    const std::string a = cli.get("alibi", "");
    if (a != "head" && a != "batch-head")
      throw std::invalid_argument(
          "--alibi takes head (one slope per head) or batch-head (one per batch entry and "
          "head), got '" +
          a + "'");
    s.alibi = a == "head" ? ProblemShape::Alibi::per_head : ProblemShape::Alibi::per_batch_head;
  }
  s.sinks = cli.flag("sinks");

  // Validate the shape before touching the GPU, with stand-in pointers: bad input is reported
  // the same way with or without a GPU, and nothing is allocated for it.
  if (Status st = validate_input(validation_params(s), step->caps); !st.ok()) throw std::invalid_argument(st.message());
  StepInfo forced;  // --config: the step with its forward pinned to one configuration
  if (cli.has("config")) {
    const tuner::Tuner* t = tuner::find_tuner(step->number);
    if (!t) throw std::invalid_argument("step " + std::to_string(number) + " has one configuration and no tuner");
    const std::vector<std::string> names = t->config_names(int(s.head_dim));
    g_forced_config = cli.get("config", "");
    if (std::find(names.begin(), names.end(), g_forced_config) == names.end())
      throw std::invalid_argument("step " + std::to_string(number) + " has no configuration '" + g_forced_config +
                                  "' at D=" + std::to_string(s.head_dim) + " (fa2 configs --step " +
                                  std::to_string(number) + " --d " + std::to_string(s.head_dim) + " lists them)");
    g_forced_step = step;
    forced = *step;
    forced.forward = &forced_forward;
    step = &forced;
  }
  if (!require_gpu("run")) return kExitNoGpu;
  if (Status st = check_device(step->caps); !st.ok()) {  // a Hopper step on another GPU: skipped
    std::fprintf(stderr, "fa2 run: step %d: %s\n", step->number, st.message().c_str());
    return kExitNoGpu;
  }

  AttentionProblem prob(s);
  std::printf("step %02d_%s on %s\n", step->number, step->name.c_str(), to_string(s).c_str());
  if (g_forced_step)
    std::printf("config: %s (--config)\n", g_forced_config.c_str());
  else if (const std::string c = fa::describe_config(*step, prob.params()); !c.empty())
    std::printf("config: %s\n", c.c_str());
  if (!cli.flag("no-check")) {
    ReferenceData ref = compute_reference(prob);
    CheckResult r = run_and_check(*step, prob, ref);
    std::printf("%s\n", r.summary().c_str());
    if (!r.ok()) return 3;
  }
  TimingOptions opt;
  opt.iters = int(cli.get_int("iters", 20));
  opt.warmup = int(cli.get_int("warmup", 3));
  AttentionParams p = prob.params();
  const Timing t = time_step(*step, p, opt);
  const double tflops = attention_flops(p) / (t.median_ms * 1e-3) / 1e12;
  std::printf("median %.3f ms (min %.3f, max %.3f, %d runs)  %.1f TFLOP/s\n", t.median_ms, t.min_ms, t.max_ms,
              opt.iters, tflops);
  return 0;
}

}  // namespace fa::tools

namespace {

void usage() {
  std::cerr
      << "usage: fa2 <command> [options]\n"
         "  list                                  registered steps (and the step each grew from)\n"
         "  bench [--steps 3,7] [--n 1024,4096] [--d 64,128] [--b --h] [--causal-only|--no-causal]\n"
         "        [--quick] [--csv FILE] [--iters 20 --warmup 3 --repeats 2] [--slow-max-n 4096]\n"
         "        [--slow-steps 0,1,2] [--max-ms-per-point 1000] [--point-budget-ms 1000]\n"
         "        [--tokens 16384 --hidden 2048] [--no-seed-shape] [--no-flush] [--direction fwd|bwd|fwd,bwd]\n"
         "        [--deterministic]               the backward's deterministic mode (step 18 on)\n"
         "        [--dtype bf16|fp16]             Q, K, V and O's type (fp16: the forward of kernels 100/101)\n"
         "        [--list [--json]]               every step over a sweep: B·N = 16k tokens, H·D = 2048,\n"
         "                                        N = 1k..16k, D = 64/128, causal or not; + B=2 H=16 N=4k;\n"
         "                                        --list: the plan (no GPU), --json: with FLOPs, tolerances\n"
         "  ladder [bench's options]              the preset B=2 H=16 N=4096 D=64, 10 runs, 1 repeat,\n"
         "                                        nothing skipped: every step side by side\n"
         "  run --step NN [--b --h --hkv --nq --nkv --n --d --causal --bottom-right --bnhd\n"
         "         --scale S --iters N --no-check --config NAME --window L,R --softcap C\n"
         "         --alibi head|batch-head --sinks]   --config: that configuration, untuned; --window: a sliding\n"
         "                                        window (-1: that side unbounded); --softcap, --alibi, --sinks:\n"
         "                                        the score modifications\n"
         "  configs --step NN [--d 64]            the step's configurations at head dim D, one a line\n"
         "  decode [--steps 16,27] [--shapes 1:8k,8:8k,...] [--h 32 --hkv 8 --nq 1 --d 128] [--causal] [--seqlens]\n"
         "         [--splits auto,1,4] [--csv FILE] [--iters 50 --warmup 5 --repeats 3] [--list]\n"
         "         [--ragged] [--page-size P] [--layout bhnd|bnhd]\n"
         "                                        decode calls timed as KV-cache bytes read per second\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (cmd == "list") return fa::tools::cmd_list(args);
    if (cmd == "run") return fa::tools::cmd_run(args);
    if (cmd == "configs") return fa::tools::cmd_configs(args);
    if (cmd == "ladder") return fa::tools::cmd_ladder(args);
    if (cmd == "bench") return fa::tools::cmd_bench(args);
    if (cmd == "decode") return fa::tools::cmd_decode(args);
    if (cmd == "-h" || cmd == "--help" || cmd == "help") {
      usage();
      return 0;
    }
    std::cerr << "fa2: unknown command '" << cmd << "'\n";
    usage();
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "fa2 " << cmd << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "fa2 " << cmd << ": failed: " << e.what() << "\n";
    return 1;
  }
}
