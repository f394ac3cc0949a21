// fa2 bench: every step over a sweep of shapes, each point checked once and then timed twice.
//
// The default sweep is the one production kernels are quoted on (docs/performance.md): a fixed
// 16k-token batch (B = 16384 / N) with hidden size 2048 (H = 2048 / D), for D in {64, 128},
// N in {1k .. 16k}, causal and not, plus the seeds' shape B=2, H=16, N=4096, D=64. Holding
// B·N and H·D fixed keeps the work per point comparable while N, and with it the share of
// the work spent on the softmax and the causal diagonal, changes.
//
// Per shape: generate the inputs once, compute the fp32 GPU reference once, check every step
// against it (a mismatch is reported and makes the exit code non-zero), then time every step
// that passed, `--repeats` times (rows repeat = 0, 1, ...) so the CSV shows the run-to-run spread.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/cli.h"
#include "harness/cuda_check.h"
#include "harness/flops.h"
#include "harness/gpu.h"
#include "harness/timer.h"
#include "fa/registry.h"
#include "tools/commands.h"

#ifndef FA_GIT_COMMIT
#define FA_GIT_COMMIT "unknown"
#endif

namespace fa::tools {
namespace {

struct BenchShape {
  int64_t batch = 0, heads = 0, seqlen = 0, head_dim = 0;
  bool causal = false;
  std::string family;  // "16k-tokens", "seed" or "custom"
};

// A measured (or skipped) point of the sweep, one per step × shape × repeat.
struct BenchRow {
  int step = 0;
  BenchShape shape;
  int repeat = 0;
  std::string config;
  double median_ms = 0, min_ms = 0, max_ms = 0, tflops = 0, max_abs_err = 0;
  int iters = 0;
};

struct Note {
  int step;
  BenchShape shape;
  std::string text;
  bool failure;
};

std::string commit_id() {
  if (const char* env = std::getenv("FA_COMMIT"); env && *env) return env;
  return FA_GIT_COMMIT;
}

std::string shape_label(const BenchShape& s) {
  std::ostringstream os;
  os << "B=" << s.batch << " H=" << s.heads << " N=" << s.seqlen << " D=" << s.head_dim << (s.causal ? " causal" : "");
  return os.str();
}

// One CSV field: quoted when it holds a comma or a quote.
std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\n") == std::string::npos) return v;
  std::string out = "\"";
  for (char c : v) out += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// The sweep the options ask for. Any of --n, --d, --b, --h replaces the default grid values
// and drops the seed shape (add it back with explicit --b 2 --h 16 --n 4096 --d 64).
std::vector<BenchShape> build_sweep(const CliArgs& cli) {
  const int64_t tokens = cli.get_int("tokens", 16384);
  const int64_t hidden = cli.get_int("hidden", 2048);
  if (tokens < 1 || hidden < 1) throw std::invalid_argument("--tokens and --hidden must be >= 1");
  const std::vector<int64_t> ns = cli.get_int_list("n", {1024, 2048, 4096, 8192, 16384});
  const std::vector<int64_t> ds = cli.get_int_list("d", {64, 128});
  const bool custom = cli.has("n") || cli.has("d") || cli.has("b") || cli.has("h");
  std::vector<bool> causal_modes;
  if (!cli.flag("causal-only")) causal_modes.push_back(false);
  if (!cli.flag("no-causal")) causal_modes.push_back(true);
  if (causal_modes.empty()) throw std::invalid_argument("--causal-only and --no-causal exclude each other");

  std::vector<BenchShape> out;
  for (int64_t d : ds) {
    if (d < 1) throw std::invalid_argument("--d values must be >= 1");
    for (bool causal : causal_modes) {
      for (int64_t n : ns) {
        if (n < 1) throw std::invalid_argument("--n values must be >= 1");
        BenchShape s;
        s.seqlen = n;
        s.head_dim = d;
        s.causal = causal;
        s.batch = cli.has("b") ? cli.get_int("b", 1) : std::max<int64_t>(1, tokens / n);
        s.heads = cli.has("h") ? cli.get_int("h", 1) : std::max<int64_t>(1, hidden / d);
        if (s.batch < 1 || s.heads < 1) throw std::invalid_argument("--b and --h must be >= 1");
        s.family = custom ? "custom" : "16k-tokens";
        out.push_back(s);
      }
    }
  }
  if (!custom && !cli.flag("no-seed-shape")) {
    for (bool causal : causal_modes) {
      BenchShape s;
      s.batch = 2;
      s.heads = 16;
      s.seqlen = 4096;
      s.head_dim = 64;
      s.causal = causal;
      s.family = "seed";
      out.push_back(s);
    }
  }
  return out;
}

ProblemShape problem_shape(const BenchShape& s) {
  ProblemShape shape;
  shape.batch = s.batch;
  shape.heads_q = shape.heads_kv = s.heads;
  shape.seqlen_q = shape.seqlen_kv = s.seqlen;
  shape.head_dim = s.head_dim;
  shape.causal = s.causal;
  return shape;
}

AttentionParams params_for(const BenchShape& s) {
  return validation_params(problem_shape(s));  // validation only: the pointers are never dereferenced
}

// Why `step` is not run on `s`, or "" when it is. Decided before any GPU work, so the plan can
// be printed with --dry-run.
std::string skip_reason(const StepInfo& step, const BenchShape& s, const std::vector<int64_t>& slow_steps,
                        int64_t slow_max_n) {
  if (Status st = validate(params_for(s), step.caps); !st.ok()) return "not supported: " + st.message();
  const bool slow = std::find(slow_steps.begin(), slow_steps.end(), step.number) != slow_steps.end();
  if (slow && slow_max_n > 0 && s.seqlen > slow_max_n)
    return "skipped: CUDA-core step, too slow above N=" + std::to_string(slow_max_n) +
           " (change with --slow-max-n, 0 = no limit)";
  return "";
}

// A one-line progress bar on stderr; plain lines when stderr is not a terminal (CI logs).
class Progress {
 public:
  explicit Progress(size_t total) : total_(std::max<size_t>(total, 1)), tty_(isatty(fileno(stderr)) != 0) {}

  void show(size_t done, const std::string& what) {
    done_ = done;
    what_ = what;
    if (!tty_) {
      std::fprintf(stderr, "[bench %zu/%zu] %s\n", done, total_, what.c_str());
      return;
    }
    draw();
  }
  // A message on its own line above the bar.
  void note(const std::string& text) {
    if (tty_) std::fprintf(stderr, "\r\x1b[K");
    std::fprintf(stderr, "  %s\n", text.c_str());
    if (tty_) draw();
  }
  void finish(size_t done) {
    if (tty_) std::fprintf(stderr, "\r\x1b[K");
    std::fprintf(stderr, "[bench] done: %zu of %zu planned points\n", done, total_);
  }

 private:
  void draw() {
    constexpr int kWidth = 30;
    const int filled = int(double(done_) / double(total_) * kWidth);
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\x1b[K[%s] %3d%% %zu/%zu %s", bar.c_str(), int(100.0 * double(done_) / double(total_)),
                 done_, total_, what_.c_str());
    std::fflush(stderr);
  }

  size_t total_, done_ = 0;
  bool tty_;
  std::string what_;
};

bool is_out_of_memory(const std::string& message) {
  return message.find("cudaErrorMemoryAllocation") != std::string::npos ||
         message.find("out of memory") != std::string::npos;
}

// One run of `step`, timed with events: the probe that decides whether a point is affordable.
double time_one_run(const StepInfo& step, const AttentionParams& p) {
  const TimingOptions once{/*warmup=*/0, /*iters=*/1, /*flush_l2=*/false};
  return time_on_stream(
             [&](cudaStream_t stream) {
               Status st = step.forward(p, stream);
               if (!st.ok()) throw std::runtime_error(st.message());
             },
             once)
      .median_ms;
}

void usage_note(std::FILE* f, int64_t slow_max_n, const std::vector<int64_t>& slow_steps, double max_ms) {
  std::string list;
  for (size_t i = 0; i < slow_steps.size(); ++i) {
    if (i) list += ',';
    list += std::to_string(slow_steps[i]);
  }
  std::fprintf(f, "Skipped by default: steps %s (fp32 on CUDA cores, very slow) above N=%lld (--slow-max-n);\n",
               list.c_str(), (long long)slow_max_n);
  std::fprintf(f, "any step whose single run takes longer than %.0f ms (--max-ms-per-point).\n", max_ms);
}

}  // namespace

int cmd_bench(const std::vector<std::string>& args) {
  CliArgs cli(args, {"causal-only", "no-causal", "no-seed-shape", "dry-run", "no-flush"},
              {"steps", "n", "d", "b", "h", "tokens", "hidden", "csv", "iters", "warmup", "repeats", "slow-steps",
               "slow-max-n", "max-ms-per-point", "point-budget-ms"});
  std::vector<int64_t> all;
  for (const StepInfo& s : steps()) all.push_back(s.number);
  const std::vector<int64_t> wanted = cli.get_int_list("steps", all);
  for (int64_t n : wanted)
    if (!find_step(int(n))) throw std::invalid_argument(unknown_step_message(int(n)));
  const std::vector<BenchShape> sweep = build_sweep(cli);
  const std::vector<int64_t> slow_steps = cli.get_int_list("slow-steps", {0, 1, 2});
  const int64_t slow_max_n = cli.get_int("slow-max-n", 4096);
  const double max_ms = cli.get_double("max-ms-per-point", 1000.0);
  const double point_budget_ms = cli.get_double("point-budget-ms", 1000.0);
  const int repeats = int(cli.get_int("repeats", 2));
  TimingOptions opt;
  opt.iters = int(cli.get_int("iters", 20));
  opt.warmup = int(cli.get_int("warmup", 3));
  opt.flush_l2 = !cli.flag("no-flush");
  if (repeats < 1 || opt.iters < 1 || opt.warmup < 0)
    throw std::invalid_argument("--repeats and --iters must be >= 1, --warmup >= 0");

  // The plan: which (shape, step) pairs run, and why the others do not.
  std::vector<Note> notes;
  std::vector<std::vector<const StepInfo*>> runnable(sweep.size());
  size_t total_points = 0;
  for (size_t i = 0; i < sweep.size(); ++i) {
    for (int64_t n : wanted) {
      const StepInfo* st = find_step(int(n));
      std::string why = skip_reason(*st, sweep[i], slow_steps, slow_max_n);
      if (why.empty())
        runnable[i].push_back(st);
      else
        notes.push_back({st->number, sweep[i], why, false});
    }
    total_points += runnable[i].size() * size_t(repeats);
  }

  if (cli.flag("dry-run")) {
    std::printf("fa2 bench plan: %zu shapes, %zu steps, %d repeats, %zu timed points\n", sweep.size(), wanted.size(),
                repeats, total_points);
    for (size_t i = 0; i < sweep.size(); ++i) {
      std::printf("  %-34s [%s] steps:", shape_label(sweep[i]).c_str(), sweep[i].family.c_str());
      for (const StepInfo* st : runnable[i]) std::printf(" %02d", st->number);
      std::printf("\n");
    }
    for (const Note& n : notes)
      std::printf("  step %02d, %s: %s\n", n.step, shape_label(n.shape).c_str(), n.text.c_str());
    usage_note(stdout, slow_max_n, slow_steps, max_ms);
    return 0;
  }
  if (!require_gpu("bench")) return 1;

  std::ofstream csv;
  if (cli.has("csv")) {
    csv.open(cli.get("csv", ""));
    if (!csv) throw std::invalid_argument("cannot write --csv file '" + cli.get("csv", "") + "'");
    csv << "step,B,H_q,H_kv,N_q,N_kv,D,causal,dtype,median_ms,tflops,gpu,sm_clock_mhz,commit,config,repeat,"
           "min_ms,max_ms,iters,max_abs_err,family\n";
  }
  const std::string gpu = gpu_name();
  const int clock = gpu_sm_clock_mhz();
  const std::string commit = commit_id();
  std::fprintf(stderr, "GPU: %s; commit %s\n", gpu_description().c_str(), commit.c_str());
  usage_note(stderr, slow_max_n, slow_steps, max_ms);

  Progress bar(total_points);
  size_t done = 0;
  bool all_ok = true;
  std::vector<BenchRow> rows;
  for (size_t i = 0; i < sweep.size(); ++i) {
    const BenchShape& s = sweep[i];
    if (runnable[i].empty()) continue;
    ProblemShape ps = problem_shape(s);
    ps.seed = 2024 + i;
    ps.with_lse = true;
    AttentionProblem prob(ps);
    bar.show(done, shape_label(s) + ": fp32 GPU reference");
    const ReferenceData ref = compute_reference(prob, ReferenceKind::gpu);

    // Check every step once; keep the ones that pass, with their config and error.
    struct Ready {
      const StepInfo* step;
      AttentionParams p;
      std::string config;
      double max_abs_err;
      TimingOptions timing;  // --iters/--warmup, fewer for a slow point (--point-budget-ms)
    };
    std::vector<Ready> ready;
    for (const StepInfo* st : runnable[i]) {
      bar.show(done, shape_label(s) + ": checking step " + std::to_string(st->number));
      CheckResult r = run_and_check(*st, prob, ref);
      if (!r.status.ok() && is_out_of_memory(r.status.message())) {
        // Not a wrong answer: this shape does not fit next to the step's own buffers (step 00's
        // N² score matrix with large --b/--h). Report it and move on.
        notes.push_back({st->number, s, "skipped: out of device memory: " + r.status.message(), false});
        bar.note("step " + std::to_string(st->number) + ", " + shape_label(s) + ": skipped, out of device memory");
        done += size_t(repeats);
        continue;
      }
      if (!r.ok()) {
        all_ok = false;
        notes.push_back({st->number, s, "FAILED check: " + r.summary(), true});
        bar.note("step " + std::to_string(st->number) + ", " + shape_label(s) + ": FAILED check: " + r.summary());
        done += size_t(repeats);
        continue;
      }
      AttentionParams p = prob.params();
      if (!st->caps.lse) p.lse = nullptr;
      const double probe_ms = time_one_run(*st, p);
      if (probe_ms > max_ms) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "skipped: one run takes %.0f ms > --max-ms-per-point %.0f", probe_ms, max_ms);
        notes.push_back({st->number, s, buf, false});
        bar.note("step " + std::to_string(st->number) + ", " + shape_label(s) + ": " + buf);
        done += size_t(repeats);
        continue;
      }
      ready.push_back(
          {st, p, fa::describe_config(*st, p), r.o.max_abs_err, fit_to_budget(opt, probe_ms, point_budget_ms)});
    }

    // Time: all steps once, then all again, so slow drifts (clocks, temperature) show up as
    // spread between repeats rather than as a bias against whichever step ran last.
    const double flops = attention_flops(prob.params());
    for (int rep = 0; rep < repeats; ++rep) {
      for (const Ready& rd : ready) {
        bar.show(done, shape_label(s) + ": step " + std::to_string(rd.step->number) + " repeat " + std::to_string(rep));
        Timing t = time_on_stream(
            [&](cudaStream_t stream) {
              Status fs = rd.step->forward(rd.p, stream);
              if (!fs.ok()) throw std::runtime_error(fs.message());
            },
            rd.timing);
        BenchRow row;
        row.step = rd.step->number;
        row.shape = s;
        row.repeat = rep;
        row.config = rd.config;
        row.median_ms = t.median_ms;
        row.min_ms = t.min_ms;
        row.max_ms = t.max_ms;
        row.tflops = flops / (t.median_ms * 1e-3) / 1e12;
        row.iters = rd.timing.iters;
        row.max_abs_err = rd.max_abs_err;
        rows.push_back(row);
        ++done;
        if (csv) {
          csv << row.step << ',' << s.batch << ',' << s.heads << ',' << s.heads << ',' << s.seqlen << ',' << s.seqlen
              << ',' << s.head_dim << ',' << (s.causal ? 1 : 0) << ",bf16," << row.median_ms << ',' << row.tflops << ','
              << csv_field(gpu) << ',' << clock << ',' << csv_field(commit) << ',' << csv_field(row.config) << ','
              << rep << ',' << row.min_ms << ',' << row.max_ms << ',' << row.iters << ',' << row.max_abs_err << ','
              << s.family << '\n';
          csv.flush();  // a long sweep that dies halfway still leaves its finished rows
        }
      }
    }
  }
  bar.finish(done);

  // The table: one line per (shape, step), repeats side by side.
  std::printf(
      "\nfa2 bench — %s — commit %s — bf16, median of %d runs (fewer above a %.0f ms budget), L2 %s, %d "
      "repeats\n\n",
      gpu_description().c_str(), commit.c_str(), opt.iters, point_budget_ms, opt.flush_l2 ? "flushed" : "not flushed",
      repeats);
  std::printf("| step | B | H | N | D | causal | ms (per repeat) | TFLOP/s (per repeat) | spread | config |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  std::map<std::string, std::vector<const BenchRow*>> grouped;  // keeps sweep order via index key
  std::vector<std::string> order;
  for (const BenchRow& r : rows) {
    char key[128];
    std::snprintf(key, sizeof key, "%s|%02d", shape_label(r.shape).c_str(), r.step);
    if (!grouped.count(key)) order.push_back(key);
    grouped[key].push_back(&r);
  }
  for (const std::string& key : order) {
    const auto& g = grouped[key];
    const BenchRow& r0 = *g.front();
    std::string ms, tf;
    double lo = 1e300, hi = 0;
    for (size_t k = 0; k < g.size(); ++k) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%.3f", k ? " / " : "", g[k]->median_ms);
      ms += buf;
      std::snprintf(buf, sizeof buf, "%s%.1f", k ? " / " : "", g[k]->tflops);
      tf += buf;
      lo = std::min(lo, g[k]->median_ms);
      hi = std::max(hi, g[k]->median_ms);
    }
    std::printf("| %02d | %lld | %lld | %lld | %lld | %s | %s | %s | %.1f%% | %s |\n", r0.step,
                (long long)r0.shape.batch, (long long)r0.shape.heads, (long long)r0.shape.seqlen,
                (long long)r0.shape.head_dim, r0.shape.causal ? "yes" : "no", ms.c_str(), tf.c_str(),
                lo > 0 ? 100.0 * (hi - lo) / lo : 0.0, r0.config.empty() ? "—" : r0.config.c_str());
  }
  if (!notes.empty()) {
    std::printf("\nNot timed:\n");
    for (const Note& n : notes)
      std::printf("- step %02d, %s: %s\n", n.step, shape_label(n.shape).c_str(), n.text.c_str());
  }
  std::printf("\n");
  usage_note(stdout, slow_max_n, slow_steps, max_ms);
  if (!all_ok) std::fprintf(stderr, "fa2 bench: at least one step FAILED its check (see above)\n");
  return all_ok ? 0 : 3;
}

}  // namespace fa::tools
