// fa2 bench: the course's one benchmark. Every step over a sweep of shapes, each point checked
// once against the fp32 GPU reference and then timed (harness/timer.h's time_step) `--repeats`
// times; `fa2 ladder` is a preset of it (one shape, every step, a column per lesson).
//
// The default sweep is the one production kernels are quoted on (docs/performance.md): a fixed
// 16k-token batch (B = 16384 / N) with hidden size 2048 (H = 2048 / D), for D in {64, 128},
// N in {1k .. 16k}, causal and not, plus the seeds' shape B=2, H=16, N=4096, D=64. Holding
// B·N and H·D fixed keeps the work per point comparable while N, and with it the share of
// the work spent on the softmax and the causal diagonal, changes.
//
// `--direction bwd` times the backward instead (the steps that have one, step 17 on), with the FLOPs
// counted as flash-attention counts them: 2.5 × the forward's; `fwd,bwd` both. `--deterministic`
// runs the backward points in the deterministic mode (steps without one are listed as unsupported);
// `--dtype fp16` gives every point fp16 tensors (the steps without fp16, every lesson, are listed as
// unsupported; the production kernels' backwards take the types their forwards do). The backward is
// checked by its tests against the fp64 reference (steps/17_backward_mma/tests), not here.
//
// `--list` prints the plan without a GPU (`--list --json`: the sweep, each point's FLOP count, the
// tolerances and the timing options, which scripts/compare.py reads instead of keeping copies).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/device_buffer.h"
#include "harness/cli.h"
#include "harness/flops.h"
#include "harness/gpu.h"
#include "harness/random.h"
#include "harness/timer.h"
#include "fa/registry.h"
#include "tools/commands.h"

#ifndef FA_GIT_COMMIT
#define FA_GIT_COMMIT "unknown"
#endif

namespace fa::tools {

std::string commit_id() {
  if (const char* env = std::getenv("FA_COMMIT"); env && *env) return env;
  return FA_GIT_COMMIT;
}

std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\n") == std::string::npos) return v;
  std::string out = "\"";
  for (char c : v) out += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

namespace {

struct BenchShape {
  int64_t batch = 0, heads = 0, seqlen = 0, head_dim = 0;
  bool causal = false;
  std::string family;  // "16k-tokens", "seed", "ladder" or "custom"
};

// What one run does: the same structure for both presets, only the defaults differ.
struct Plan {
  bool ladder = false;
  std::vector<const StepInfo*> steps;
  std::vector<BenchShape> sweep;
  std::vector<int64_t> slow_steps;
  int64_t slow_max_n = 0;
  double max_ms = 0, point_budget_ms = 0;
  int repeats = 1;
  TimingOptions timing;
  std::vector<bool> backward;  // the directions: false = forward, true = backward
  bool deterministic = false;  // --deterministic: the backward points run BackwardParams::deterministic
  DType dtype = DType::bf16;   // --dtype: the element type of Q, K, V and O
};

// One (step, shape) of the plan: its verdict, and one Timing per repeat once it is timed.
struct Point {
  const StepInfo* step = nullptr;
  size_t shape = 0;
  std::string status = "ok";  // ok | unsupported | skipped | fail
  std::string note, config;
  double max_abs_err = -1, rel_err = -1, flops = 0;
  bool backward = false;  // times the step's backward (its FLOPs: 2.5 × the forward's)
  TimingOptions timing;
  std::vector<Timing> times;
};

std::string shape_label(const BenchShape& s) {
  std::ostringstream os;
  os << "B=" << s.batch << " H=" << s.heads << " N=" << s.seqlen << " D=" << s.head_dim << (s.causal ? " causal" : "");
  return os.str();
}

std::string step_label(const StepInfo& st) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%02d_%s", st.number, st.name.c_str());
  return buf;
}

// A point's step, with " bwd" when it times the backward.
std::string point_label(const Point& p) {
  return step_label(*p.step) + (p.backward ? " bwd" : "");
}

std::string json_string(const std::string& v) {
  std::string out = "\"";
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

ProblemShape problem_shape(const BenchShape& s, DType dtype) {
  ProblemShape shape;
  shape.dtype = dtype;
  shape.batch = s.batch;
  shape.heads_q = shape.heads_kv = s.heads;
  shape.seqlen_q = shape.seqlen_kv = s.seqlen;
  shape.head_dim = s.head_dim;
  shape.causal = s.causal;
  shape.kv_pad_rows = 0;  // contiguous tensors, as a model (and PyTorch) would pass them
  return shape;
}

// The sweep the options ask for. --n and --d replace the default grid values (B and H still follow
// from --tokens and --hidden); --b or --h give a custom grid. Either drops the seed shape.
std::vector<BenchShape> build_sweep(const CliArgs& cli, bool ladder) {
  const int64_t tokens = cli.get_int("tokens", 16384);
  const int64_t hidden = cli.get_int("hidden", 2048);
  if (tokens < 1 || hidden < 1) throw std::invalid_argument("--tokens and --hidden must be >= 1");
  const std::vector<int64_t> default_n =
      ladder ? std::vector<int64_t>{4096}
             : (cli.flag("quick") ? std::vector<int64_t>{1024, 4096}
                                  : std::vector<int64_t>{1024, 2048, 4096, 8192, 16384});
  const std::vector<int64_t> ns = cli.get_int_list("n", default_n);
  const std::vector<int64_t> ds =
      cli.get_int_list("d", ladder ? std::vector<int64_t>{64} : std::vector<int64_t>{64, 128});
  const bool custom = ladder || cli.has("b") || cli.has("h");
  std::vector<bool> causal_modes;
  if (!cli.flag("causal-only")) causal_modes.push_back(false);
  if (!cli.flag("no-causal")) causal_modes.push_back(true);
  if (causal_modes.empty()) throw std::invalid_argument("--causal-only and --no-causal exclude each other");

  std::vector<BenchShape> out;
  auto add = [&](int64_t b, int64_t h, int64_t n, int64_t d, bool causal, const char* family) {
    if (n < 1) throw std::invalid_argument("--n values must be >= 1");
    if (d < 1) throw std::invalid_argument("--d values must be >= 1");
    if (b < 1 || h < 1) throw std::invalid_argument("--b and --h must be >= 1");
    out.push_back({b, h, n, d, causal, family});
  };
  for (int64_t d : ds)
    for (bool causal : causal_modes)
      for (int64_t n : ns) {
        if (custom)
          add(cli.get_int("b", 2), cli.get_int("h", 16), n, d, causal, ladder ? "ladder" : "custom");
        else
          add(std::max<int64_t>(1, tokens / std::max<int64_t>(n, 1)),
              std::max<int64_t>(1, hidden / std::max<int64_t>(d, 1)), n, d, causal, "16k-tokens");
      }
  if (!custom && !cli.has("n") && !cli.has("d") && !cli.flag("no-seed-shape"))
    for (bool causal : causal_modes) add(2, 16, 4096, 64, causal, "seed");
  return out;
}

Plan make_plan(const CliArgs& cli, bool ladder) {
  Plan plan;
  plan.ladder = ladder;
  std::vector<int64_t> all;
  for (const StepInfo& s : steps()) all.push_back(s.number);
  for (int64_t n : cli.get_int_list("steps", all)) {
    const StepInfo* st = find_step(int(n));
    if (!st) throw std::invalid_argument(unknown_step_message(int(n)));
    plan.steps.push_back(st);
  }
  plan.sweep = build_sweep(cli, ladder);
  plan.slow_steps = cli.get_int_list("slow-steps", {0, 1, 2});
  plan.slow_max_n = cli.get_int("slow-max-n", ladder ? 0 : 4096);
  plan.max_ms = cli.get_double("max-ms-per-point", ladder ? 0.0 : 1000.0);
  plan.point_budget_ms = cli.get_double("point-budget-ms", 1000.0);
  plan.repeats = int(cli.get_int("repeats", ladder ? 1 : 2));
  plan.timing.iters = int(cli.get_int("iters", ladder ? 10 : 20));
  plan.timing.warmup = int(cli.get_int("warmup", ladder ? 2 : 3));
  plan.timing.flush_l2 = !cli.flag("no-flush");
  plan.deterministic = cli.flag("deterministic");
  const std::string dtype = cli.get("dtype", "bf16");
  if (dtype != "bf16" && dtype != "fp16") throw std::invalid_argument("--dtype is bf16 or fp16 (got '" + dtype + "')");
  plan.dtype = dtype == "fp16" ? DType::fp16 : DType::bf16;
  const std::string directions = cli.get("direction", "fwd");
  for (const std::string& d : {std::string("fwd"), std::string("bwd")})
    if (("," + directions + ",").find("," + d + ",") != std::string::npos) plan.backward.push_back(d == "bwd");
  if (plan.backward.empty() || (directions != "fwd" && directions != "bwd" && directions != "fwd,bwd"))
    throw std::invalid_argument("--direction is fwd, bwd or fwd,bwd (got '" + directions + "')");
  if (plan.repeats < 1 || plan.timing.iters < 1 || plan.timing.warmup < 0)
    throw std::invalid_argument("--repeats and --iters must be >= 1, --warmup >= 0");
  return plan;
}

// Every (shape, step) point, with the verdict that can be reached before any GPU work.
std::vector<Point> plan_points(const Plan& plan) {
  std::vector<Point> points;
  for (size_t i = 0; i < plan.sweep.size(); ++i) {
    const BenchShape& s = plan.sweep[i];
    const AttentionParams vp = validation_params(problem_shape(s, plan.dtype));  // stand-in pointers, no GPU
    for (bool backward : plan.backward)
      for (const StepInfo* st : plan.steps) {
        Point p;
        p.step = st;
        p.shape = i;
        p.backward = backward;
        p.flops = backward ? attention_backward_flops(vp) : attention_flops(vp);
        const bool slow =
            std::find(plan.slow_steps.begin(), plan.slow_steps.end(), st->number) != plan.slow_steps.end();
        if (backward && !st->backward) {
          p.status = "unsupported";
          p.note = "no backward: step " + std::to_string(st->number) + " teaches the forward only";
        } else if (backward && plan.deterministic && !st->caps.deterministic_backward) {
          p.status = "unsupported";
          p.note = "no deterministic backward in step " + std::to_string(st->number);
        } else if (Status v = validate_input(vp, st->caps); !v.ok()) {  // the GPU is judged when the point runs
          p.status = "unsupported";
          p.note = "not supported: " + v.message();
        } else if (slow && plan.slow_max_n > 0 && s.seqlen > plan.slow_max_n) {
          p.status = "skipped";
          p.note = "skipped: CUDA-core step, too slow above N=" + std::to_string(plan.slow_max_n) +
                   " (change with --slow-max-n, 0 = no limit)";
        }
        points.push_back(p);
      }
  }
  return points;
}

std::string skip_rules(const Plan& plan) {
  std::string list;
  for (size_t i = 0; i < plan.slow_steps.size(); ++i) list += (i ? "," : "") + std::to_string(plan.slow_steps[i]);
  std::ostringstream os;
  if (plan.slow_max_n > 0)
    os << "Skipped: steps " << list << " (fp32 on CUDA cores, very slow) above N=" << plan.slow_max_n
       << " (--slow-max-n).\n";
  if (plan.max_ms > 0)
    os << "Skipped: any step whose single run takes longer than " << plan.max_ms << " ms (--max-ms-per-point).\n";
  return os.str();
}

void print_plan(const Plan& plan, const std::vector<Point>& points) {
  size_t timed = 0;
  for (const Point& p : points) timed += p.status == "ok" ? size_t(plan.repeats) : 0;
  std::printf("fa2 %s plan: %zu shapes, %zu steps, %d repeats, %zu timed points\n", plan.ladder ? "ladder" : "bench",
              plan.sweep.size(), plan.steps.size(), plan.repeats, timed);
  for (size_t i = 0; i < plan.sweep.size(); ++i) {
    std::printf("  %-34s [%s] steps:", shape_label(plan.sweep[i]).c_str(), plan.sweep[i].family.c_str());
    for (const Point& p : points)
      if (p.shape == i && p.status == "ok") std::printf(" %02d%s", p.step->number, p.backward ? "bwd" : "");
    std::printf("\n");
  }
  for (const Point& p : points)
    if (p.status != "ok")
      std::printf("  step %02d%s, %s: %s\n", p.step->number, p.backward ? " bwd" : "",
                  shape_label(plan.sweep[p.shape]).c_str(), p.note.c_str());
  std::printf("%s", skip_rules(plan).c_str());
}

void print_plan_json(const Plan& plan, const std::vector<Point>& points) {
  auto tol = [](const Tolerance& t) {
    return "{\"atol\": " + num(t.atol) + ", \"rtol\": " + num(t.rtol) + ", \"max_rel_norm\": " + num(t.max_rel_norm) +
           "}";
  };
  std::ostringstream os;
  os << "{\n  \"commit\": " << json_string(commit_id()) << ",\n  \"dtype\": " << json_string(dtype_name(plan.dtype))
     << ",\n  \"tolerance\": {\"o\": " << tol(output_tolerance(plan.dtype)) << ", \"lse\": " << tol(lse_tolerance())
     << "},\n  \"timing\": {\"warmup\": " << plan.timing.warmup << ", \"iters\": " << plan.timing.iters
     << ", \"repeats\": " << plan.repeats << ", \"flush_l2\": " << (plan.timing.flush_l2 ? "true" : "false")
     << ", \"point_budget_ms\": " << num(plan.point_budget_ms) << ", \"max_ms_per_point\": " << num(plan.max_ms)
     << ", \"slow_max_n\": " << plan.slow_max_n << ", \"slow_steps\": [";
  for (size_t i = 0; i < plan.slow_steps.size(); ++i) os << (i ? ", " : "") << plan.slow_steps[i];
  os << "]},\n  \"steps\": [";
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const StepInfo& st = *plan.steps[i];
    os << (i ? "," : "") << "\n    {\"number\": " << st.number << ", \"name\": " << json_string(st.name)
       << ", \"base\": " << st.base << ", \"lesson\": " << json_string(st.lesson)
       << ", \"causal\": " << (st.caps.causal ? "true" : "false") << ", \"lse\": " << (st.caps.lse ? "true" : "false")
       << "}";
  }
  os << "\n  ],\n  \"shapes\": [";
  for (size_t i = 0; i < plan.sweep.size(); ++i) {
    const BenchShape& s = plan.sweep[i];
    os << (i ? "," : "") << "\n    {\"family\": " << json_string(s.family) << ", \"B\": " << s.batch
       << ", \"H\": " << s.heads << ", \"N\": " << s.seqlen << ", \"D\": " << s.head_dim
       << ", \"causal\": " << (s.causal ? "true" : "false");
    char flops[80];
    const AttentionParams vp = validation_params(problem_shape(s, plan.dtype));
    std::snprintf(flops, sizeof flops, "%.17g, \"flops_bwd\": %.17g", attention_flops(vp),
                  attention_backward_flops(vp));
    os << ", \"flops\": " << flops;
    std::string run, not_run;
    std::string run_bwd;
    for (const Point& p : points) {
      if (p.shape != i) continue;
      if (p.backward) {
        if (p.status == "ok") run_bwd += (run_bwd.empty() ? "" : ", ") + std::to_string(p.step->number);
        continue;
      }
      if (p.status == "ok")
        run += (run.empty() ? "" : ", ") + std::to_string(p.step->number);
      else
        not_run += std::string(not_run.empty() ? "" : ", ") + "{\"step\": " + std::to_string(p.step->number) +
                   ", \"status\": " + json_string(p.status) + ", \"note\": " + json_string(p.note) + "}";
    }
    os << ", \"run\": [" << run << "], \"not_run\": [" << not_run << "], \"run_bwd\": [" << run_bwd << "]}";
  }
  os << "\n  ]\n}\n";
  std::printf("%s", os.str().c_str());
}

// A one-line progress bar on stderr; plain lines when stderr is not a terminal (CI logs).
class Progress {
 public:
  explicit Progress(size_t total) : total_(std::max<size_t>(total, 1)), tty_(isatty(fileno(stderr)) != 0) {}
  void show(size_t done, const std::string& what) {
    if (!tty_) {
      std::fprintf(stderr, "[bench %zu/%zu] %s\n", done, total_, what.c_str());
      return;
    }
    constexpr int kWidth = 30;
    std::string bar(size_t(double(done) / double(total_) * kWidth), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\x1b[K[%s] %3d%% %zu/%zu %s", bar.c_str(), int(100.0 * double(done) / double(total_)), done,
                 total_, what.c_str());
    std::fflush(stderr);
  }
  void note(const std::string& text) { std::fprintf(stderr, "%s  %s\n", tty_ ? "\r\x1b[K" : "", text.c_str()); }
  void finish(size_t done) {
    std::fprintf(stderr, "%s[bench] done: %zu of %zu planned points\n", tty_ ? "\r\x1b[K" : "", done, total_);
  }

 private:
  size_t total_;
  bool tty_;
};

bool is_out_of_memory(const std::string& message) {
  return message.find("cudaErrorMemoryAllocation") != std::string::npos ||
         message.find("out of memory") != std::string::npos;
}

// Times a point: the step's forward (time_step), or its backward on `bp`'s gradients with the
// forward's O and LSE from `p` (the last forward run on the shape left them there).
// The shape's backward buffers `bp` on the forward call `p` (whose O and LSE the backward reads).
BackwardParams with_forward(BackwardParams bp, const AttentionParams& p) {
  bp.fwd = p;
  return bp;
}

Timing time_point(const Point& pt, const AttentionParams& p, const BackwardParams& shape_bp, const TimingOptions& opt) {
  if (!pt.backward) return time_step(*pt.step, p, opt);
  const BackwardParams bp = with_forward(shape_bp, p);
  const StepInfo& st = *pt.step;
  return time_on_stream(
      [&](cudaStream_t stream) {
        if (Status s = st.backward(bp, stream); !s.ok()) throw std::runtime_error("backward: " + s.message());
      },
      opt);
}

// Checks every runnable point of shape `i` once, then times the ones that passed: all of them
// once, then all again, so slow drifts (clocks, temperature) show up as spread between repeats
// rather than as a bias against whichever step ran last.
void measure_shape(const Plan& plan, size_t i, std::vector<Point*>& points, Progress& bar, size_t& done) {
  const BenchShape& s = plan.sweep[i];
  ProblemShape ps = problem_shape(s, plan.dtype);
  ps.seed = 2024 + i;
  ps.with_lse = true;
  AttentionProblem prob(ps);
  bar.show(done, shape_label(s) + ": fp32 GPU reference");
  const ReferenceData ref = compute_reference(prob, ReferenceKind::gpu);
  std::vector<std::pair<Point*, AttentionParams>> ready;
  // The backward's tensors, made once per shape for every backward point: dO random, dQ, dK, dV
  // contiguous, and the workspace.
  const AttentionParams shape_p = prob.params();
  const size_t q_elems = size_t(shape_p.batch * shape_p.heads_q * shape_p.seqlen_q * shape_p.head_dim);
  const size_t kv_elems = size_t(shape_p.batch * shape_p.heads_kv * shape_p.seqlen_kv * shape_p.head_dim);
  DeviceBuffer<__nv_bfloat16> d_o, dq, dk, dv;
  DeviceBuffer<unsigned char> workspace;
  BackwardParams bp;
  if (std::any_of(points.begin(), points.end(), [](const Point* p) { return p->backward; })) {
    d_o = DeviceBuffer<__nv_bfloat16>(q_elems);
    dq = DeviceBuffer<__nv_bfloat16>(q_elems);
    dk = DeviceBuffer<__nv_bfloat16>(kv_elems);
    dv = DeviceBuffer<__nv_bfloat16>(kv_elems);
    workspace = DeviceBuffer<unsigned char>(backward_workspace_bytes(shape_p));
    // dO in the points' type (bf16 values, or fp16 bits in the same 16-bit storage).
    std::vector<__nv_bfloat16> host(q_elems);
    for (size_t e = 0; e < q_elems; ++e) host[e] = float_to_element(normal_at(ps.seed + 1, e), plan.dtype);
    d_o.upload(host);
    bp = contiguous_backward_params(shape_p, d_o.get(), dq.get(), dk.get(), dv.get(), workspace.get(),
                                    workspace.bytes());
    bp.deterministic = plan.deterministic;
  }
  for (Point* pt : points) {
    const StepInfo& st = *pt->step;
    bar.show(done, shape_label(s) + ": checking step " + std::to_string(st.number));
    CheckResult r = run_and_check(st, prob, ref);
    AttentionParams p = prob.params();
    if (!st.caps.lse) p.lse = nullptr;
    pt->max_abs_err = pt->backward ? -1 : r.o.max_abs_err;  // a backward point's check is its tests'
    pt->rel_err = pt->backward ? -1 : r.o.rel_norm;
    if (!r.status.ok() && is_out_of_memory(r.status.message())) {
      // Not a wrong answer: the shape does not fit next to the step's own buffers (step 00's N²
      // score matrix with large --b/--h).
      pt->status = "skipped";
      pt->note = "skipped: out of device memory: " + r.status.message();
    } else if (!r.ok()) {
      pt->status = "fail";
      pt->note = "FAILED check: " + r.summary();
    } else if (Status bs = pt->backward ? st.backward(with_forward(bp, p), nullptr) : Status::Ok(); !bs.ok()) {
      pt->status = bs.unsupported() ? "unsupported" : "fail";
      pt->note = "backward: " + bs.message();
    } else if (const double probe = time_point(*pt, p, bp, {0, 1, false}).median_ms;
               plan.max_ms > 0 && probe > plan.max_ms) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "skipped: one run takes %.0f ms > --max-ms-per-point %.0f", probe, plan.max_ms);
      pt->status = "skipped";
      pt->note = buf;
    } else {
      // The tuner's configuration is the forward's; a backward has its own fixed one per head dim,
      // which the step's lesson states, so a backward row names no configuration.
      pt->config = pt->backward ? "backward (the step's own configuration)" : describe_config(st, p);
      pt->timing = fit_to_budget(plan.timing, probe, plan.point_budget_ms);
      ready.push_back({pt, p});
      continue;
    }
    bar.note("step " + std::to_string(st.number) + ", " + shape_label(s) + ": " + pt->note);
    done += size_t(plan.repeats);
  }
  for (int rep = 0; rep < plan.repeats; ++rep)
    for (auto& [pt, p] : ready) {
      bar.show(done, shape_label(s) + ": step " + std::to_string(pt->step->number) + " repeat " + std::to_string(rep));
      pt->times.push_back(time_point(*pt, p, bp, pt->timing));
      ++done;
    }
}

double median_ms(const Point& p) {
  std::vector<double> ms;
  for (const Timing& t : p.times) ms.push_back(t.median_ms);
  return ms.empty() ? 0 : median(ms);
}

void write_csv(const std::string& path, const Plan& plan, const std::vector<Point>& points) {
  std::ofstream csv(path);
  if (!csv) throw std::invalid_argument("cannot write --csv file '" + path + "'");
  csv << "step,B,H_q,H_kv,N_q,N_kv,D,causal,dtype,median_ms,tflops,gpu,sm_clock_mhz,commit,config,repeat,"
         "min_ms,max_ms,iters,max_abs_err,family,name,rel_err,status,note,direction\n";
  const std::string gpu = csv_field(gpu_name()), commit = csv_field(commit_id());
  const int clock = gpu_sm_clock_mhz();
  for (const Point& p : points) {
    const BenchShape& s = plan.sweep[p.shape];
    const size_t rows = std::max<size_t>(p.times.size(), 1);
    for (size_t rep = 0; rep < rows; ++rep) {
      const Timing* t = rep < p.times.size() ? &p.times[rep] : nullptr;
      auto opt = [](bool have, double v) { return have ? num(v) : std::string(); };
      csv << p.step->number << ',' << s.batch << ',' << s.heads << ',' << s.heads << ',' << s.seqlen << ',' << s.seqlen
          << ',' << s.head_dim << ',' << (s.causal ? 1 : 0) << ',' << dtype_name(plan.dtype) << ','
          << opt(t, t ? t->median_ms : 0) << ',' << opt(t, t ? p.flops / (t->median_ms * 1e-3) / 1e12 : 0) << ',' << gpu
          << ',' << clock << ',' << commit << ',' << csv_field(p.config) << ',' << rep << ','
          << opt(t, t ? t->min_ms : 0) << ',' << opt(t, t ? t->max_ms : 0) << ','
          << (t ? std::to_string(p.timing.iters) : "") << ',' << opt(p.max_abs_err >= 0, p.max_abs_err) << ','
          << s.family << ',' << p.step->name << ',' << opt(p.rel_err >= 0, p.rel_err) << ',' << p.status << ','
          << csv_field(p.note) << ',' << (p.backward ? "bwd" : "fwd") << '\n';
    }
  }
}

// A markdown table cell: '|' escaped (check summaries say "max|err|").
std::string cell(const std::string& v) {
  std::string out;
  for (char c : v) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// The terminal table: one line per (shape, step), the repeats side by side, each step's speed-up
// over the previous timed step on the same shape.
void print_table(const Plan& plan, const std::vector<Point>& points) {
  if (plan.ladder)
    std::printf("\nFlashAttention-2 step ladder — %s — %s — commit %s\n\n", dtype_name(plan.dtype).c_str(),
                gpu_description().c_str(), commit_id().c_str());
  else
    std::printf(
        "\nfa2 bench — %s — commit %s — %s, median of %d runs (fewer above a %.0f ms budget), L2 %s, %d "
        "repeats\n\n",
        gpu_description().c_str(), commit_id().c_str(), dtype_name(plan.dtype).c_str(), plan.timing.iters,
        plan.point_budget_ms, plan.timing.flush_l2 ? "flushed" : "not flushed", plan.repeats);
  std::printf(
      "| step |%s shape | max err | rel err | ms (per repeat) | TFLOP/s | spread | × previous | check | config |\n",
      plan.ladder ? " lesson |" : "");
  std::printf("|---|%s---|---|---|---|---|---|---|---|---|\n", plan.ladder ? "---|" : "");
  double prev = 0;
  size_t prev_shape = size_t(-1);
  for (const Point& p : points) {
    if (p.shape != prev_shape) prev = 0;
    prev_shape = p.shape;
    std::string ms, err = "—", rel = "—", tf = "—", spread = "—", speedup = "—";
    double lo = 1e300, hi = 0;
    char buf[64];
    for (const Timing& t : p.times) {
      std::snprintf(buf, sizeof buf, "%s%.3f", ms.empty() ? "" : " / ", t.median_ms);
      ms += buf;
      lo = std::min(lo, t.median_ms);
      hi = std::max(hi, t.median_ms);
    }
    if (p.max_abs_err >= 0) std::snprintf(buf, sizeof buf, "%.2e", p.max_abs_err), err = buf;
    if (p.rel_err >= 0) std::snprintf(buf, sizeof buf, "%.2e", p.rel_err), rel = buf;
    if (!p.times.empty()) {
      const double m = median_ms(p);
      std::snprintf(buf, sizeof buf, "%.1f", p.flops / (m * 1e-3) / 1e12), tf = buf;
      std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * (hi - lo) / lo), spread = buf;
      if (prev > 0) std::snprintf(buf, sizeof buf, "%.2f×", prev / m), speedup = buf;
      prev = m;
    }
    std::printf("| %s |%s%s%s %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", point_label(p).c_str(),
                plan.ladder ? " " : "", plan.ladder ? p.step->lesson.c_str() : "", plan.ladder ? " |" : "",
                shape_label(plan.sweep[p.shape]).c_str(), err.c_str(), rel.c_str(), ms.empty() ? "—" : ms.c_str(),
                tf.c_str(), spread.c_str(), speedup.c_str(), p.status == "ok" ? "pass" : cell(p.note).c_str(),
                p.config.empty() ? "—" : p.config.c_str());
  }
  std::printf("\n%s", skip_rules(plan).c_str());
}

int run_bench(const std::vector<std::string>& args, bool ladder) {
  const char* command = ladder ? "ladder" : "bench";
  CliArgs cli(
      args,
      {"causal-only", "no-causal", "no-seed-shape", "dry-run", "list", "json", "no-flush", "quick", "deterministic"},
      {"steps", "n", "d", "b", "h", "tokens", "hidden", "csv", "iters", "warmup", "repeats", "slow-steps", "slow-max-n",
       "max-ms-per-point", "point-budget-ms", "direction", "dtype"});
  const Plan plan = make_plan(cli, ladder);
  std::vector<Point> points = plan_points(plan);
  if (cli.flag("json") && !cli.flag("list")) throw std::invalid_argument("--json goes with --list (timings: --csv)");
  if (cli.flag("list") || cli.flag("dry-run")) {
    cli.flag("json") ? print_plan_json(plan, points) : print_plan(plan, points);
    return 0;
  }
  if (!require_gpu(command)) return 1;
  // A step built for another GPU generation (the Hopper steps elsewhere) is not run here: its
  // points say so instead of failing.
  for (Point& p : points)
    if (p.status == "ok")
      if (Status st = check_device(p.step->caps); !st.ok()) {
        p.status = "unsupported";
        p.note = "not on this GPU: " + st.message();
      }
  std::fprintf(stderr, "GPU: %s; commit %s\n%s", gpu_description().c_str(), commit_id().c_str(),
               skip_rules(plan).c_str());
  size_t total = 0, done = 0;
  for (const Point& p : points) total += p.status == "ok" ? size_t(plan.repeats) : 0;
  Progress bar(total);
  for (size_t i = 0; i < plan.sweep.size(); ++i) {
    std::vector<Point*> runnable;
    for (Point& p : points)
      if (p.shape == i && p.status == "ok") runnable.push_back(&p);
    if (!runnable.empty()) measure_shape(plan, i, runnable, bar, done);
    // Written after every shape: a long sweep that dies halfway still leaves its finished rows.
    if (cli.has("csv")) write_csv(cli.get("csv", ""), plan, points);
  }
  bar.finish(done);
  print_table(plan, points);
  const bool all_ok = std::none_of(points.begin(), points.end(), [](const Point& p) { return p.status == "fail"; });
  if (!all_ok) std::fprintf(stderr, "fa2 %s: at least one step FAILED its check (see above)\n", command);
  return all_ok ? 0 : 3;
}

}  // namespace

int cmd_bench(const std::vector<std::string>& args) {
  return run_bench(args, false);
}
int cmd_ladder(const std::vector<std::string>& args) {
  return run_bench(args, true);
}

}  // namespace fa::tools
