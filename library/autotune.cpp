#include "library/autotune.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "library/median.h"

namespace fa::autotune {

// No iostreams on the library's paths: the C interface runs inside other programs (Python with
// PyTorch) whose C++ runtime state a stream's locale machinery may not share. Plain strings and
// stdio only.
namespace {

void append_field(std::string& s, const char* name, int64_t value) {
  s += name;
  s += std::to_string(value);
}

void append_field(std::string& s, const char* name, const std::string& value) {
  s += name;
  s += value;
}

bool same(const Strides& a, const Strides& b) {
  return a.batch == b.batch && a.head == b.head && a.seq == b.seq && a.dim == b.dim;
}

// True when all four tensors of `p` have the strides `strides_of(heads, seqlen, dim)` gives.
bool all_have(const AttentionParams& p, Strides (*strides_of)(int64_t, int64_t, int64_t)) {
  return same(p.q_stride, strides_of(p.heads_q, p.seqlen_q, p.head_dim)) &&
         same(p.k_stride, strides_of(p.heads_kv, p.seqlen_kv, p.head_dim)) &&
         same(p.v_stride, strides_of(p.heads_kv, p.seqlen_kv, p.head_dim)) &&
         same(p.o_stride, strides_of(p.heads_q, p.seqlen_q, p.head_dim));
}

}  // namespace

std::string Key::str() const {
  std::string s;
  s.reserve(160 + gpu.size() + build_id.size());
  append_field(s, "nq=", seqlen_q);
  append_field(s, kv_bucket ? " nkv<=" : " nkv=", seqlen_kv);
  append_field(s, " d=", head_dim);
  append_field(s, " b=", batch);
  append_field(s, " hq=", heads_q);
  append_field(s, " hkv=", heads_kv);
  append_field(s, " causal=", causal);
  append_field(s, " dtype=", dtype);
  append_field(s, " layout=", layout);
  s += lse ? " lse=1" : " lse=0";
  if (split != "none") append_field(s, " split=", split);     // unsplit keys read as before Part V
  if (window != "none") append_field(s, " window=", window);  // keys without a window read as before
  if (mods != "none") append_field(s, " mods=", mods);        // likewise without modifications
  append_field(s, " gpu=", gpu);
  append_field(s, " build=", build_id);
  std::replace(s.begin(), s.end(), '\t', ' ');  // tabs separate the fields of the file
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

const char* layout_class(const AttentionParams& p) {
  if (all_have(p, &bhnd_strides)) return "bhnd";
  if (all_have(p, &bnhd_strides)) return "bnhd";
  return "strided";
}

Key shape_key(const AttentionParams& p) {
  Key k;
  k.seqlen_q = p.seqlen_q;
  k.seqlen_kv = p.seqlen_kv;
  k.head_dim = p.head_dim;
  k.batch = p.batch;
  k.heads_q = p.heads_q;
  k.heads_kv = p.heads_kv;
  k.causal = !p.causal ? "none" : (p.causal_align == CausalAlign::bottom_right ? "bottom_right" : "top_left");
  k.dtype = dtype_name(p.dtype);
  k.layout = layout_class(p);
  k.lse = p.lse != nullptr;
  k.split = p.num_splits > 1 ? std::to_string(p.num_splits) : (p.num_splits == 0 && p.workspace ? "auto" : "none");
  if (p.has_window())
    k.window = std::to_string(p.window_left) + "," + std::to_string(p.window_right) +
               (p.causal_align == CausalAlign::bottom_right ? ",bottom_right" : ",top_left");
  if (p.has_score_mods()) {
    std::string m;
    for (const auto& [on, name] :
         {std::pair{p.softcap != 0.0f, "softcap"}, std::pair{p.alibi_slopes != nullptr, "alibi"},
          std::pair{p.sinks != nullptr, "sinks"}})
      if (on) m += (m.empty() ? "" : "+") + std::string(name);
    k.mods = m;
  }
  return k;
}

Key kv_bucketed(Key k) {
  int64_t bucket = 1;
  while (bucket < k.seqlen_kv) bucket *= 2;
  k.seqlen_kv = bucket;
  k.kv_bucket = true;
  return k;
}

std::string hash_hex(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (char c : text) h = (h ^ uint8_t(c)) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool enabled() {
  const char* v = std::getenv("FA_AUTOTUNE");
  return !(v && std::strcmp(v, "0") == 0);
}

std::string default_cache_path() {
  if (const char* p = std::getenv("FA_AUTOTUNE_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/fa2_course/autotune.txt";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/fa2_course/autotune.txt";
  return "";  // nowhere to write: memory only
}

namespace {

DeviceFacts query_device(int dev) {
  DeviceFacts f;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
    f.name = prop.name;
    f.sm_count = prop.multiProcessorCount;
  }
  if (cudaDeviceGetAttribute(&f.max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    f.max_smem_optin = 0;
  cudaGetLastError();  // a failed query leaves no error behind for the caller's next check
  return f;
}

}  // namespace

const DeviceFacts& current_device() {
  static const DeviceFacts none;
  static std::mutex mu;
  static std::map<int, DeviceFacts> facts;  // never erased: references into it stay valid
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return none;
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = facts.find(dev);
  if (it == facts.end()) it = facts.emplace(dev, query_device(dev)).first;
  return it->second;
}

int current_max_smem_optin() {
  return current_device().max_smem_optin;
}

Cache::Cache(std::string path) : path_(std::move(path)) {}

void Cache::load_locked() {
  if (loaded_) return;
  loaded_ = true;
  if (path_.empty()) return;
  FILE* in = std::fopen(path_.c_str(), "r");
  if (!in) return;
  std::string line;
  char chunk[512];
  while (std::fgets(chunk, sizeof chunk, in)) {
    line += chunk;
    if (line.empty() || (line.back() != '\n' && !std::feof(in))) continue;  // a longer line: read on
    std::string full;
    full.swap(line);  // `line` starts empty for the next one, whatever happens to this one
    if (full.back() == '\n') full.pop_back();
    const size_t t1 = full.find('\t');
    if (t1 == std::string::npos) continue;  // not ours: skip
    const size_t t2 = full.find('\t', t1 + 1);
    const std::string key = full.substr(0, t1);
    const std::string config = full.substr(t1 + 1, t2 == std::string::npos ? std::string::npos : t2 - t1 - 1);
    if (!key.empty() && !config.empty()) entries_[key] = config;  // later lines win
  }
  std::fclose(in);
}

std::optional<std::string> Cache::find(const Key& key) {
  std::lock_guard<std::mutex> lock(mu_);
  load_locked();
  auto it = entries_.find(key.str());
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void Cache::put(const Key& key, const std::string& config, double ms) {
  std::lock_guard<std::mutex> lock(mu_);
  load_locked();
  entries_[key.str()] = config;
  if (path_.empty()) return;
  std::error_code ec;
  const std::filesystem::path file(path_);
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  // One short line per append (O_APPEND): concurrent processes do not interleave within a line.
  char ms_text[32];
  std::snprintf(ms_text, sizeof ms_text, "%.6g", ms);
  const std::string line = key.str() + '\t' + config + '\t' + ms_text + '\n';
  if (FILE* f = std::fopen(path_.c_str(), "a")) {
    std::fwrite(line.data(), 1, line.size(), f);
    std::fclose(f);
  }
}

Timings time_candidates(const std::vector<Candidate>& candidates, cudaStream_t stream, int reps,
                        const std::string& label) {
  Timings t;
  t.median_ms.assign(candidates.size(), std::numeric_limits<double>::infinity());
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    cudaGetLastError();
    if (start) cudaEventDestroy(start);
    return t;
  }
  // Warm-up: one run each; a candidate that does not launch here (e.g. too much shared memory)
  // is never the winner.
  std::vector<bool> alive(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    alive[i] = candidates[i].run(stream).ok() && cudaStreamSynchronize(stream) == cudaSuccess;
    if (!alive[i]) cudaGetLastError();
  }
  // Interleaved rounds, each timing every candidate once: a clock or load change on the shared GPU
  // then shifts every candidate's samples alike instead of favouring whichever ran in a quiet spell,
  // which matters because neighbouring configs are often within 1-2% of each other.
  std::vector<std::vector<double>> ms(candidates.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (!alive[i]) continue;
      cudaEventRecord(start, stream);
      const bool ok = candidates[i].run(stream).ok();
      cudaEventRecord(stop, stream);
      float elapsed = 0;
      if (!ok || cudaEventSynchronize(stop) != cudaSuccess ||
          cudaEventElapsedTime(&elapsed, start, stop) != cudaSuccess) {
        cudaGetLastError();
        alive[i] = false;
        continue;
      }
      ms[i].push_back(elapsed);
    }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!alive[i] || ms[i].empty()) continue;
    t.median_ms[i] = median(std::move(ms[i]));
    if (t.best < 0 || t.median_ms[i] < t.median_ms[size_t(t.best)]) t.best = int(i);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (const char* v = std::getenv("FA_AUTOTUNE_VERBOSE"); v && std::strcmp(v, "1") == 0) {
    std::fprintf(stderr, "[autotune] %s\n", label.c_str());
    for (size_t i = 0; i < candidates.size(); ++i)
      std::fprintf(stderr, "[autotune]   %-40s %9.4f ms%s\n", candidates[i].name.c_str(), t.median_ms[i],
                   int(i) == t.best ? "  <- best" : "");
  }
  return t;
}

}  // namespace fa::autotune
