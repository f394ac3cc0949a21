// fa2 decode: the inference benchmark (Part V). Decode calls, a few query rows per sequence against
// a long KV cache, for every step asked, each point checked once against the fp32 GPU reference and
// then timed like fa2 bench (harness/timer.h: L2 flushed, runs queued behind a spin, median).
//
// A decode call reads its KV cache and little else, so its speed is quoted as the cache's bytes read
// per second, 2·B·H_kv·N_kv·D·2 bytes over the call's time (the combine included), next to the
// copy rate the memory delivers. The default shapes are Part V's table: D = 128, GQA 32/8, one
// query row, (B, N_kv) from one long sequence to 256 short ones.
//
// A step that splits the keys (Capabilities::split_kv) gets a workspace of kMaxKvSplits splits and
// `--splits`: `auto` lets it choose (AttentionParams::num_splits = 0), a number asks for that many;
// a list times each. The split count an `auto` call used is read back from the workspace: every
// split writes all B·H_q·N_q rows of its partial O (D floats) and LSE (one float), and nothing else
// writes there, so the floats no longer holding the poison pattern are S·rows·(D + 1).
//
// `--seqlens` passes every sequence's length in device memory (AttentionParams::seqlens_kv, all at
// N_kv) to the steps that read one: the ragged-cache path, timed on the same keys. `--ragged` gives
// the sequences different lengths, ragged_length(): N_kv times a permutation of 8/8, 5/8, 2/8, 7/8,
// 4/8, 1/8, 6/8, 3/8 over the batch; only the steps that read lengths run, each sequence is checked
// against the fp32 GPU reference on its own keys, and the bytes are those of the keys that exist.
//
// `--page-size P` (a power of two dividing N_kv) gives the steps that read a block table
// (Capabilities::paged_kv) the same keys in a paged cache: pools of (B·N_kv/P, P, H_kv, D) pages, and
// sequence b's page i is pool page i·B + b, the pages of sequences that grew together interleaved,
// as a serving engine hands them out. The cache is then (B, N_kv, H_kv, D) for every step (a page is
// a contiguous run of its rows); the steps that do not page read it unpaged. `--layout bnhd`
// lays an unpaged cache out the same way (the default is (B, H_kv, N_kv, D)), so that a paged run
// and a contiguous one read the same rows.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/check.h"
#include "harness/cli.h"
#include "harness/cuda_check.h"
#include "harness/device_buffer.h"
#include "harness/gpu.h"
#include "harness/timer.h"
#include "reference/gpu_reference.h"
#include "fa/registry.h"
#include "tools/commands.h"

namespace fa::tools {
namespace {

struct DecodeShape {
  int64_t batch = 0, seqlen_kv = 0;
};

struct DecodePoint {
  int step = 0;
  DecodeShape shape;
  std::string splits_asked;  // "auto", "1", "4", ... or "-" for a step that does not split
  int splits_used = 1;
  std::string status = "ok", note;
  double max_abs_err = -1;
  std::vector<double> medians_ms;
  double min_ms = 0, max_ms = 0;
  int64_t tokens = 0;  // the keys that exist (B·N_kv, or the ragged lengths' sum): the bytes' count
};

// "B:N_kv,B:N_kv,...", N_kv with an optional k suffix (×1024).
std::vector<DecodeShape> parse_shapes(const std::string& spec) {
  std::vector<DecodeShape> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos) throw std::invalid_argument("--shapes takes B:N_kv pairs (got '" + item + "')");
    std::string n = item.substr(colon + 1);
    int64_t scale = 1;
    if (!n.empty() && (n.back() == 'k' || n.back() == 'K')) scale = 1024, n.pop_back();
    DecodeShape s;
    try {
      s.batch = std::stoll(item.substr(0, colon));
      s.seqlen_kv = std::stoll(n) * scale;
    } catch (const std::exception&) {
      throw std::invalid_argument("--shapes takes B:N_kv pairs (got '" + item + "')");
    }
    if (s.batch < 1 || s.seqlen_kv < 1) throw std::invalid_argument("--shapes: B and N_kv must be >= 1");
    out.push_back(s);
  }
  if (out.empty()) throw std::invalid_argument("--shapes is empty");
  return out;
}

std::vector<std::string> parse_list(const std::string& spec) {
  std::vector<std::string> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Sequence b's length under --ragged: N_kv × (8 − 3b mod 8) / 8, at least 1.
int64_t ragged_length(int64_t b, int64_t n_kv) {
  return std::max<int64_t>(1, n_kv * (8 - (3 * b) % 8) / 8);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

}  // namespace

int cmd_decode(const std::vector<std::string>& args) {
  CliArgs cli(
      args, {"causal", "list", "seqlens", "ragged"},
      {"steps", "shapes", "h", "hkv", "nq", "d", "splits", "csv", "iters", "warmup", "repeats", "page-size", "layout"});
  const int64_t page_size = cli.get_int("page-size", 0);
  if (page_size < 0 || (page_size & (page_size - 1)) != 0)
    throw std::invalid_argument("--page-size takes a power of two (got " + std::to_string(page_size) + ")");
  const std::vector<int64_t> step_numbers = cli.get_int_list("steps", {16, 27});
  const std::vector<DecodeShape> shapes =
      parse_shapes(cli.get("shapes", "1:8k,8:8k,32:8k,128:8k,1:128k,4:64k,32:1k,256:1k"));
  const int64_t heads_q = cli.get_int("h", 32), heads_kv = cli.get_int("hkv", 8), n_q = cli.get_int("nq", 1);
  const int64_t head_dim = cli.get_int("d", 128);
  const std::string layout = cli.get("layout", page_size > 0 ? "bnhd" : "bhnd");
  if (layout != "bhnd" && layout != "bnhd")
    throw std::invalid_argument("--layout takes bhnd or bnhd (got '" + layout + "')");
  if (page_size > 0 && layout != "bnhd")
    throw std::invalid_argument("--page-size: a page is a run of (H_kv, D) rows, the layout is bnhd");
  const std::vector<std::string> split_list = parse_list(cli.get("splits", "auto"));
  for (const std::string& s : split_list)
    if (s != "auto" &&
        (s.find_first_not_of("0123456789") != std::string::npos || std::stoi(s) < 1 || std::stoi(s) > kMaxKvSplits))
      throw std::invalid_argument("--splits takes auto or 1.." + std::to_string(kMaxKvSplits) + " (got '" + s + "')");
  TimingOptions opt;
  opt.iters = int(cli.get_int("iters", 50));
  opt.warmup = int(cli.get_int("warmup", 5));
  const int repeats = int(cli.get_int("repeats", 3));
  if (opt.iters < 1 || opt.warmup < 0 || repeats < 1)
    throw std::invalid_argument("--iters and --repeats must be >= 1, --warmup >= 0");

  std::vector<const StepInfo*> steps_run;
  for (int64_t n : step_numbers) {
    const StepInfo* st = find_step(int(n));
    if (!st) throw std::invalid_argument(unknown_step_message(int(n)));
    steps_run.push_back(st);
  }
  auto shape_of = [&](const DecodeShape& d) {
    ProblemShape s;
    s.batch = d.batch, s.heads_q = heads_q, s.heads_kv = heads_kv, s.seqlen_q = n_q, s.seqlen_kv = d.seqlen_kv;
    s.head_dim = head_dim, s.causal = cli.flag("causal"), s.align = CausalAlign::bottom_right;
    s.kv_pad_rows = 0;                              // a contiguous cache, as a model passes it
    if (layout == "bnhd") s.layout = Layout::bnhd;  // (B, N_kv, H_kv, D), flash-attn's; paged: a page is a run of rows
    s.with_lse = true;
    return s;
  };
  std::vector<DecodePoint> points;
  for (const DecodeShape& d : shapes)
    if (page_size > 0 && d.seqlen_kv % page_size != 0)
      throw std::invalid_argument("--page-size " + std::to_string(page_size) + " must divide every N_kv (got " +
                                  std::to_string(d.seqlen_kv) + ")");
  for (const DecodeShape& d : shapes)
    for (const StepInfo* st : steps_run) {
      const std::vector<std::string> asks = st->caps.split_kv ? split_list : std::vector<std::string>{"-"};
      for (const std::string& ask : asks) {
        DecodePoint p;
        p.step = st->number, p.shape = d, p.splits_asked = ask;
        if (Status v = validate_input(validation_params(shape_of(d)), st->caps); !v.ok())
          p.status = "unsupported", p.note = v.message();
        else if (cli.flag("ragged") && !st->caps.seqlens_kv)
          p.status = "unsupported", p.note = "--ragged: the step reads no length per sequence";
        points.push_back(p);
      }
    }
  if (cli.flag("list")) {
    for (const DecodePoint& p : points)
      std::printf("step %02d B=%lld N_kv=%lld splits=%s %s\n", p.step, (long long)p.shape.batch,
                  (long long)p.shape.seqlen_kv, p.splits_asked.c_str(), p.status == "ok" ? "" : p.note.c_str());
    return 0;
  }
  if (!require_gpu("decode")) return 1;
  for (DecodePoint& p : points)
    if (p.status == "ok")
      if (Status st = check_device(find_step(p.step)->caps); !st.ok())
        p.status = "unsupported", p.note = "not on this GPU: " + st.message();

  const double kv_bytes_per_token = 2.0 * double(heads_kv) * double(head_dim) * 2.0;  // K and V, bf16
  for (const DecodeShape& d : shapes) {
    ProblemShape ps = shape_of(d);
    ps.seed = uint64_t(27 + d.batch * 131 + d.seqlen_kv);
    AttentionProblem prob(ps);
    const AttentionParams base = prob.params();
    std::vector<int32_t> lengths(size_t(d.batch), int32_t(d.seqlen_kv));
    if (cli.flag("ragged"))
      for (int64_t b = 0; b < d.batch; ++b) lengths[size_t(b)] = int32_t(ragged_length(b, d.seqlen_kv));
    ReferenceData ref;
    if (!cli.flag("ragged")) {
      ref = compute_reference(prob, ReferenceKind::gpu);
    } else {  // each sequence alone, on its own keys
      const size_t per_seq = size_t(heads_q * n_q);
      DeviceBuffer<float> o_ref(size_t(d.batch) * per_seq * size_t(head_dim)), lse_ref(size_t(d.batch) * per_seq);
      for (int64_t b = 0; b < d.batch; ++b) {
        AttentionParams one = base;
        one.batch = 1;
        one.seqlen_kv = lengths[size_t(b)];
        one.q = static_cast<const __nv_bfloat16*>(base.q) + b * base.q_stride.batch;
        one.k = static_cast<const __nv_bfloat16*>(base.k) + b * base.k_stride.batch;
        one.v = static_cast<const __nv_bfloat16*>(base.v) + b * base.v_stride.batch;
        if (Status st = gpu_reference(one, o_ref.get() + size_t(b) * per_seq * size_t(head_dim),
                                      lse_ref.get() + size_t(b) * per_seq, nullptr);
            !st.ok())
          throw std::runtime_error("reference: " + st.message());
      }
      const std::vector<float> o = o_ref.download(), l = lse_ref.download();
      ref.kind = "gpu-fp32";
      ref.o.assign(o.begin(), o.end());
      ref.lse.assign(l.begin(), l.end());
    }
    int64_t tokens = 0;
    for (int32_t len : lengths) tokens += len;
    const size_t ws_bytes = split_kv_workspace_bytes(base, kMaxKvSplits);
    DeviceBuffer<unsigned char> workspace;
    // --seqlens: every sequence's length passed in device memory (all at N_kv, so the check is the
    // same), to time a ragged-cache step's path.
    DeviceBuffer<int32_t> seqlens(size_t(d.batch));
    seqlens.upload(lengths);
    // --page-size: the same keys paged; sequence b's page i is pool page i·B + b, so one strided copy
    // per sequence and tensor builds the pools.
    const int64_t pages_per_seq = page_size > 0 ? d.seqlen_kv / page_size : 0;
    const int64_t page_elems = page_size * heads_kv * head_dim;
    DeviceBuffer<__nv_bfloat16> k_pool(size_t(d.batch * pages_per_seq * page_elems)),
        v_pool(size_t(d.batch * pages_per_seq * page_elems));
    DeviceBuffer<int32_t> table(size_t(d.batch * pages_per_seq));
    if (page_size > 0) {
      std::vector<int32_t> t(size_t(d.batch * pages_per_seq));
      for (int64_t b = 0; b < d.batch; ++b)
        for (int64_t i = 0; i < pages_per_seq; ++i) t[size_t(b * pages_per_seq + i)] = int32_t(i * d.batch + b);
      table.upload(t);
      for (int64_t b = 0; b < d.batch; ++b)
        for (const auto& [to, from] : {std::pair{k_pool.get(), base.k}, std::pair{v_pool.get(), base.v}})
          FA_CUDA_CHECK(cudaMemcpy2D(to + b * page_elems, size_t(d.batch * page_elems) * 2,
                                     static_cast<const __nv_bfloat16*>(from) + b * base.k_stride.batch,
                                     size_t(page_elems) * 2, size_t(page_elems) * 2, size_t(pages_per_seq),
                                     cudaMemcpyDeviceToDevice));
    }
    std::vector<std::pair<DecodePoint*, AttentionParams>> ready;
    for (DecodePoint& pt : points) {
      if (pt.status != "ok" || pt.shape.batch != d.batch || pt.shape.seqlen_kv != d.seqlen_kv) continue;
      const StepInfo& st = *find_step(pt.step);
      pt.tokens = tokens;
      AttentionParams p = base;
      if (st.caps.split_kv) {
        if (workspace.bytes() == 0) workspace = DeviceBuffer<unsigned char>(ws_bytes);
        p.workspace = workspace.get(), p.workspace_bytes = ws_bytes;
        p.num_splits = pt.splits_asked == "auto" ? 0 : std::stoi(pt.splits_asked);
        FA_CUDA_CHECK(cudaMemset(workspace.get(), 0xFF, ws_bytes));
      }
      if ((cli.flag("seqlens") || cli.flag("ragged")) && st.caps.seqlens_kv) p.seqlens_kv = seqlens.get();
      if (page_size > 0 && st.caps.paged_kv) {
        p.k = k_pool.get(), p.v = v_pool.get();
        p.k_stride = p.v_stride = Strides{page_elems, head_dim, heads_kv * head_dim, 1};
        p.block_table = table.get(), p.block_table_stride = pages_per_seq;
        p.page_size = page_size, p.num_pages = d.batch * pages_per_seq;
        pt.note = "paged";
      }
      prob.poison_outputs();
      const Status s = st.forward(p, nullptr);
      FA_CUDA_CHECK(cudaDeviceSynchronize());
      if (!s.ok()) {
        pt.status = s.unsupported() ? "unsupported" : "fail", pt.note = s.message();
        continue;
      }
      const CompareResult co = compare(prob.output_bhnd(), ref.o, bf16_tolerance());
      const CompareResult cl = compare(prob.lse(), ref.lse, lse_tolerance());
      std::string why;
      pt.max_abs_err = co.max_abs_err;
      if (!co.ok || !cl.ok || !prob.memory_intact(&why)) {
        pt.status = "fail";
        pt.note = "FAILED check: O " + co.summary() + "; LSE " + cl.summary() + (why.empty() ? "" : "; " + why);
        continue;
      }
      if (st.caps.split_kv) {  // the split count used, from the floats the call wrote (see the top)
        std::vector<uint32_t> words(ws_bytes / 4);
        FA_CUDA_CHECK(cudaMemcpy(words.data(), workspace.get(), ws_bytes, cudaMemcpyDeviceToHost));
        const size_t written = size_t(std::count_if(words.begin(), words.end(), [](uint32_t w) { return w != ~0u; }));
        const size_t per_split = size_t(d.batch * heads_q * n_q * (head_dim + 1));
        pt.splits_used = written == 0 ? 1 : int(written / per_split);
        if (written % per_split != 0) pt.note = "workspace written in part: " + std::to_string(written) + " floats";
      }
      ready.push_back({&pt, p});
    }
    for (int rep = 0; rep < repeats; ++rep)
      for (auto& [pt, p] : ready) {
        const StepInfo& st = *find_step(pt->step);
        const Timing t = time_step(st, p, opt);
        pt->medians_ms.push_back(t.median_ms);
        pt->min_ms = rep == 0 ? t.min_ms : std::min(pt->min_ms, t.min_ms);
        pt->max_ms = std::max(pt->max_ms, t.max_ms);
      }
    std::fprintf(stderr, "[decode] B=%lld N_kv=%lld done\n", (long long)d.batch, (long long)d.seqlen_kv);
  }

  std::printf(
      "\nfa2 decode — %s — commit %s — bf16, H_q=%lld H_kv=%lld N_q=%lld D=%lld%s, median of %d runs × %d "
      "repeats, L2 flushed\n\n",
      gpu_description().c_str(), commit_id().c_str(), (long long)heads_q, (long long)heads_kv, (long long)n_q,
      (long long)head_dim, cli.flag("causal") ? " causal" : "", opt.iters, repeats);
  if (cli.flag("ragged"))
    std::printf("Ragged: sequence b holds N_kv·(8 − 3b mod 8)/8 keys; KV TB/s counts the keys that exist.\n\n");
  if (page_size > 0)
    std::printf(
        "Paged: pages of %lld keys, sequence b's page i at pool page i·B + b, for the steps that read a "
        "block table (status \"paged\"); the others read the (B, N_kv, H_kv, D) cache.\n\n",
        (long long)page_size);
  std::printf("| step | B | N_kv | splits asked | used | µs | KV TB/s | max err | status |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::ofstream csv;
  if (cli.has("csv")) {
    csv.open(cli.get("csv", ""));
    if (!csv) throw std::invalid_argument("cannot write --csv file '" + cli.get("csv", "") + "'");
    csv << "step,B,H_q,H_kv,N_q,N_kv,D,causal,splits_asked,splits_used,median_us,min_us,max_us,kv_tb_s,max_abs_err,"
           "status,note,gpu,commit\n";
  }
  bool all_ok = true;
  for (const DecodePoint& p : points) {
    const double ms = median_of(p.medians_ms);
    const double tokens = double(p.tokens > 0 ? p.tokens : p.shape.batch * p.shape.seqlen_kv);
    const double tbs = ms > 0 ? kv_bytes_per_token * tokens / (ms * 1e-3) / 1e12 : 0;
    all_ok = all_ok && p.status != "fail";
    char us[32] = "—", rate[32] = "—", err[32] = "—";
    if (ms > 0) std::snprintf(us, sizeof us, "%.1f", ms * 1e3), std::snprintf(rate, sizeof rate, "%.2f", tbs);
    if (p.max_abs_err >= 0) std::snprintf(err, sizeof err, "%.1e", p.max_abs_err);
    std::printf("| %02d | %lld | %lld | %s | %d | %s | %s | %s | %s |\n", p.step, (long long)p.shape.batch,
                (long long)p.shape.seqlen_kv, p.splits_asked.c_str(), p.splits_used, us, rate, err,
                p.status == "ok" ? (p.note.empty() ? "pass" : p.note.c_str()) : (p.status + ": " + p.note).c_str());
    if (csv)
      csv << p.step << ',' << p.shape.batch << ',' << heads_q << ',' << heads_kv << ',' << n_q << ','
          << p.shape.seqlen_kv << ',' << head_dim << ',' << (cli.flag("causal") ? 1 : 0) << ',' << p.splits_asked << ','
          << p.splits_used << ',' << (ms > 0 ? num(ms * 1e3) : "") << ',' << (ms > 0 ? num(p.min_ms * 1e3) : "") << ','
          << (ms > 0 ? num(p.max_ms * 1e3) : "") << ',' << (ms > 0 ? num(tbs) : "") << ','
          << (p.max_abs_err >= 0 ? num(p.max_abs_err) : "") << ',' << p.status << ',' << csv_field(p.note) << ','
          << csv_field(gpu_name()) << ',' << csv_field(commit_id()) << '\n';
  }
  if (!all_ok) std::fprintf(stderr, "fa2 decode: at least one step FAILED its check (see above)\n");
  return all_ok ? 0 : 3;
}

}  // namespace fa::tools
