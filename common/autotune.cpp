#include "common/autotune.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <utility>

#include "common/timer.h"

namespace fa::autotune {

// No iostreams on the library's paths: the C interface runs inside other programs (Python with
// PyTorch) whose C++ runtime state a stream's locale machinery may not share. Plain strings and
// stdio only.
std::string Key::str() const {
  std::string s = "nq=" + std::to_string(seqlen_q) + " nkv=" + std::to_string(seqlen_kv) +
                  " d=" + std::to_string(head_dim) + " bh=" + std::to_string(batch_heads) + " causal=" + causal +
                  " dtype=" + dtype + " gpu=" + gpu + " build=" + build_id;
  std::replace(s.begin(), s.end(), '\t', ' ');  // tabs separate the fields of the file
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

Key shape_key(const AttentionParams& p) {
  Key k;
  k.seqlen_q = p.seqlen_q;
  k.seqlen_kv = p.seqlen_kv;
  k.head_dim = p.head_dim;
  k.batch_heads = p.batch * p.heads_q;
  k.causal = !p.causal ? "none" : (p.causal_align == CausalAlign::bottom_right ? "bottom_right" : "top_left");
  k.dtype = "bf16";
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
  return !(v && std::string(v) == "0");
}

std::string default_cache_path() {
  if (const char* p = std::getenv("FA_AUTOTUNE_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/fa2_course/autotune.txt";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/fa2_course/autotune.txt";
  return "";  // nowhere to write: memory only
}

std::string current_gpu_name() {
  static std::mutex mu;
  static std::map<int, std::string> names;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = names.find(dev);
  if (it != names.end()) return it->second;
  cudaDeviceProp prop{};
  std::string name;
  if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
    name = prop.name;
  else
    cudaGetLastError();
  names[dev] = name;
  return name;
}

int current_max_smem_optin() {
  int dev = 0, bytes = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return bytes;
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
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!candidates[i].run(stream).ok() || cudaStreamSynchronize(stream) != cudaSuccess) {
      cudaGetLastError();
      continue;  // does not launch here (e.g. too much shared memory): never the winner
    }
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      cudaEventRecord(start, stream);
      const bool ok = candidates[i].run(stream).ok();
      cudaEventRecord(stop, stream);
      float elapsed = 0;
      if (!ok || cudaEventSynchronize(stop) != cudaSuccess ||
          cudaEventElapsedTime(&elapsed, start, stop) != cudaSuccess) {
        cudaGetLastError();
        ms.clear();
        break;
      }
      ms.push_back(elapsed);
    }
    if (ms.empty()) continue;
    t.median_ms[i] = median(std::move(ms));
    if (t.best < 0 || t.median_ms[i] < t.median_ms[size_t(t.best)]) t.best = int(i);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (const char* v = std::getenv("FA_AUTOTUNE_VERBOSE"); v && std::string(v) == "1") {
    std::fprintf(stderr, "[autotune] %s\n", label.c_str());
    for (size_t i = 0; i < candidates.size(); ++i)
      std::fprintf(stderr, "[autotune]   %-40s %9.4f ms%s\n", candidates[i].name.c_str(), t.median_ms[i],
                   int(i) == t.best ? "  <- best" : "");
  }
  return t;
}

}  // namespace fa::autotune
