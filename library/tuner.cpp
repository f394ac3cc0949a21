#include "library/tuner.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace fa::tuner {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

size_t element_bytes(DType t) {
  switch (t) {
    case DType::bf16:
    case DType::fp16:
      return 2;
  }
  return 2;
}

// One file for every tuner of the process: the keys carry the build id, so steps never collide.
// Its path is read from the environment on first use (FA_AUTOTUNE_CACHE before the first call).
autotune::Cache& file_cache() {
  static autotune::Cache cache(autotune::default_cache_path());
  return cache;
}

struct TunerList {
  std::mutex mu;
  std::vector<const Tuner*> tuners;  // in order of registration
};

// Function-local: steps construct their tuners during static initialisation, in any order.
TunerList& tuner_list() {
  static TunerList list;
  return list;
}

// Timing synchronises the stream, which a stream being captured into a CUDA graph must not do.
// A stream whose state cannot be read counts as captured: the heuristic is always safe.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

// The outputs the candidates write while they are timed: never the caller's O or LSE (an
// in-place call with O aliasing Q would otherwise be corrupted by the first candidate).
class ScratchOutputs {
 public:
  explicit ScratchOutputs(cudaStream_t stream) : stream_(stream) {}
  ~ScratchOutputs() {
    if (o_) cudaFreeAsync(o_, stream_);
    if (lse_) cudaFreeAsync(lse_, stream_);
  }
  ScratchOutputs(const ScratchOutputs&) = delete;
  ScratchOutputs& operator=(const ScratchOutputs&) = delete;

  // Points `p`'s O (contiguous (B, H, N, D)) and, if it writes one, its LSE at scratch memory.
  // Packed sequences (varlen) write O as (total_q, H, D) and the LSE as (H, total_q), at rows their
  // offsets name: the scratch has the packed tensors' shape, total_q rows whatever slice is timed.
  // False when the memory is not there; the CUDA error is cleared, the call goes on untuned.
  bool redirect(AttentionParams& p) {
    const bool packed = p.cu_seqlens_q != nullptr;
    const size_t rows = size_t(p.heads_q) * size_t(packed ? p.total_q : p.batch * p.seqlen_q);
    if (cudaMallocAsync(&o_, rows * size_t(p.head_dim) * element_bytes(p.dtype), stream_) != cudaSuccess ||
        (p.lse && cudaMallocAsync(reinterpret_cast<void**>(&lse_), rows * sizeof(float), stream_) != cudaSuccess)) {
      cudaGetLastError();
      return false;
    }
    p.o = o_;
    p.o_stride =
        packed ? Strides{0, p.head_dim, p.heads_q * p.head_dim, 1} : bhnd_strides(p.heads_q, p.seqlen_q, p.head_dim);
    if (p.lse) p.lse = lse_;
    return true;
  }

 private:
  cudaStream_t stream_;
  void* o_ = nullptr;
  float* lse_ = nullptr;
};

// " (timed on B=1 H_q=9 H_kv=9)" when the tuner timed a slice of the problem, else "".
std::string slice_note(const AttentionParams& full, const AttentionParams& slice) {
  if (slice.batch == full.batch && slice.heads_q == full.heads_q) return "";
  return " (timed on B=" + std::to_string(slice.batch) + " H_q=" + std::to_string(slice.heads_q) +
         " H_kv=" + std::to_string(slice.heads_kv) + ")";
}

}  // namespace

std::string KernelConfig::name() const {
  std::string s = "BLOCK_M=" + std::to_string(block_m) + " BLOCK_N=" + std::to_string(block_n) +
                  " warps=" + std::to_string(num_warps);
  if (stages > 0) s += " stages=" + std::to_string(stages);
  if (!variant.empty()) s += " " + variant;
  return s;
}

double tuning_flops(const AttentionParams& p) {
  return 4.0 * double(p.batch) * double(p.heads_q) * double(p.seqlen_q) * double(p.seqlen_kv) * double(p.head_dim);
}

AttentionParams tuning_slice(const AttentionParams& p, double budget_flops) {
  AttentionParams slice = p;
  if (tuning_flops(p) <= budget_flops || p.batch < 1 || p.heads_q < 1 || p.heads_kv < 1) return slice;
  const double per_head = 4.0 * double(p.seqlen_q) * double(p.seqlen_kv) * double(p.head_dim);
  const double per_batch = per_head * double(p.heads_q);
  slice.batch = std::clamp(int64_t(budget_flops / per_batch), int64_t(1), p.batch);
  if (per_batch <= budget_flops) return slice;
  // One batch entry is still over: its leading KV-head groups, each with all its query heads.
  const int64_t group = std::max<int64_t>(p.heads_q / p.heads_kv, 1);
  slice.heads_kv = std::clamp(int64_t(budget_flops / (per_head * double(group))), int64_t(1), p.heads_kv);
  slice.heads_q = slice.heads_kv * group;
  return slice;
}

const KernelConfig* pick_heuristic(const std::vector<KernelConfig>& configs, const AttentionParams& p, int sm_count,
                                   int smem_limit) {
  const KernelConfig* most = nullptr;
  int64_t most_blocks = -1;
  for (const KernelConfig& c : configs) {
    if (c.head_dim != p.head_dim || c.smem_bytes > smem_limit) continue;
    const int64_t blocks = ceil_div(p.seqlen_q, std::max(c.block_m, 1)) * p.batch * p.heads_q;
    if (blocks >= 2 * int64_t(sm_count)) return &c;
    if (blocks > most_blocks) {
      most = &c;
      most_blocks = blocks;
    }
  }
  return most;
}

Tuner::Tuner(int step, std::string build_id, std::vector<KernelConfig> configs, bool kv_buckets)
    : step_(step), build_id_(std::move(build_id)), configs_(std::move(configs)), kv_buckets_(kv_buckets) {
  // The cache and run_config know a configuration by its name: two with one name would be one.
  for (size_t i = 0; i < configs_.size() && duplicate_.empty(); ++i)
    for (size_t j = i + 1; j < configs_.size(); ++j)
      if (configs_[i].head_dim == configs_[j].head_dim && configs_[i].name() == configs_[j].name()) {
        duplicate_ = step_label() + " lists two configurations named '" + configs_[i].name() + "' for head dim " +
                     std::to_string(configs_[i].head_dim) + " (set KernelConfig::variant to tell them apart)";
        break;
      }
  TunerList& list = tuner_list();
  std::lock_guard<std::mutex> lock(list.mu);
  list.tuners.push_back(this);
}

Tuner::~Tuner() {
  TunerList& list = tuner_list();
  std::lock_guard<std::mutex> lock(list.mu);
  list.tuners.erase(std::remove(list.tuners.begin(), list.tuners.end(), this), list.tuners.end());
}

const Tuner* find_tuner(int step) {
  TunerList& list = tuner_list();
  std::lock_guard<std::mutex> lock(list.mu);
  for (auto it = list.tuners.rbegin(); it != list.tuners.rend(); ++it)
    if ((*it)->step() == step) return *it;
  return nullptr;
}

std::string Tuner::step_label() const {
  char buf[24];
  std::snprintf(buf, sizeof buf, "step %02d", step_);
  return buf;
}

autotune::Key Tuner::make_key(const AttentionParams& p) const {
  autotune::Key key = kv_buckets_ ? autotune::kv_bucketed(autotune::shape_key(p)) : autotune::shape_key(p);
  key.gpu = autotune::current_device().name;
  key.build_id = build_id_;  // seed bug #10: without it, timings of an old build are reused
  return key;
}

std::string Tuner::key(const AttentionParams& p) const {
  return make_key(p).str();
}

std::vector<const KernelConfig*> Tuner::fitting(int64_t head_dim) const {
  const int smem_limit = autotune::current_max_smem_optin();
  std::vector<const KernelConfig*> out;
  for (const KernelConfig& c : configs_)
    if (c.head_dim == head_dim && c.smem_bytes <= smem_limit) out.push_back(&c);
  return out;
}

const KernelConfig* Tuner::find_config(int64_t head_dim, const std::string& name) const {
  for (const KernelConfig& c : configs_)
    if (c.head_dim == head_dim && c.name() == name) return &c;
  return nullptr;
}

const KernelConfig* Tuner::heuristic(const AttentionParams& p) const {
  const autotune::DeviceFacts& dev = autotune::current_device();
  return pick_heuristic(configs_, p, dev.sm_count, dev.max_smem_optin);
}

void Tuner::remember(const std::string& key_text, const KernelConfig* config) const {
  std::lock_guard<std::mutex> lock(mu_);
  chosen_[key_text] = config;
}

const KernelConfig* Tuner::remembered(const autotune::Key& key, const std::string& key_text) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = chosen_.find(key_text);
    if (it != chosen_.end()) return it->second;
  }
  // A result of an earlier process with this very build: used if the config still fits.
  const std::optional<std::string> name = file_cache().find(key);
  if (!name) return nullptr;
  const KernelConfig* c = find_config(key.head_dim, *name);
  if (!c || c->smem_bytes > autotune::current_max_smem_optin()) return nullptr;
  remember(key_text, c);
  return c;
}

const KernelConfig* Tuner::tune(const AttentionParams& p, const autotune::Key& key, cudaStream_t stream) const {
  const std::vector<const KernelConfig*> configs = fitting(p.head_dim);
  if (configs.empty()) return nullptr;
  if (configs.size() == 1) {  // nothing to choose: no scratch, no timing; the cache line says so (0 ms)
    file_cache().put(key, configs[0]->name(), 0.0);
    return configs[0];
  }
  AttentionParams timed = tuning_slice(p);
  const std::string label = key.str() + slice_note(p, timed);
  ScratchOutputs scratch(stream);
  if (!scratch.redirect(timed)) return nullptr;
  std::vector<autotune::Candidate> candidates;
  candidates.reserve(configs.size());
  for (const KernelConfig* c : configs)
    candidates.push_back({c->name(), [c, timed](cudaStream_t s) { return c->launch(timed, s); }});
  const autotune::Timings timings = autotune::time_candidates(candidates, stream, kTuneRounds, label);
  if (timings.best < 0) return nullptr;
  const KernelConfig* best = configs[size_t(timings.best)];
  file_cache().put(key, best->name(), timings.median_ms[size_t(timings.best)]);
  return best;
}

const KernelConfig* Tuner::choose(const AttentionParams& p, cudaStream_t stream) const {
  if (!autotune::enabled()) return heuristic(p);
  const autotune::Key key = make_key(p);
  const std::string key_text = key.str();
  if (const KernelConfig* c = remembered(key, key_text)) return c;
  if (capturing(stream)) return heuristic(p);
  if (const KernelConfig* c = tune(p, key, stream)) {
    remember(key_text, c);
    return c;
  }
  return heuristic(p);
}

Status Tuner::run(const AttentionParams& p, cudaStream_t stream) const {
  if (!duplicate_.empty()) return Status::Error(duplicate_);
  const KernelConfig* c = choose(p, stream);
  if (!c)
    return Status::Unsupported(step_label() + " has no kernel configuration for head dim " +
                               std::to_string(p.head_dim) + " that fits this GPU's shared memory per block (" +
                               std::to_string(autotune::current_max_smem_optin()) + " bytes)");
  return c->launch(p, stream);
}

Status Tuner::run_config(const AttentionParams& p, const std::string& name, cudaStream_t stream) const {
  if (!duplicate_.empty()) return Status::Error(duplicate_);
  const KernelConfig* c = find_config(p.head_dim, name);
  if (!c)
    return Status::Unsupported(step_label() + " has no config '" + name + "' for head dim " +
                               std::to_string(p.head_dim));
  const int smem_limit = autotune::current_max_smem_optin();
  if (c->smem_bytes > smem_limit)
    return Status::Unsupported("config '" + name + "' of " + step_label() + " needs more shared memory (" +
                               std::to_string(c->smem_bytes) + " bytes per block) than this GPU allows (" +
                               std::to_string(smem_limit) + " bytes)");
  return c->launch(p, stream);
}

int Tuner::min_block_m() const {
  int rows = 0;
  for (const KernelConfig& c : configs_)
    if (rows == 0 || c.block_m < rows) rows = c.block_m;
  return rows;
}

std::vector<std::string> Tuner::config_names(int head_dim) const {
  std::vector<std::string> names;
  for (const KernelConfig& c : configs_)
    if (c.head_dim == head_dim) names.push_back(c.name());
  return names;
}

std::string Tuner::describe(const AttentionParams& p) const {
  const auto described = [&p](const KernelConfig* c, const char* how) {
    if (!c) return "none (no config for head dim " + std::to_string(p.head_dim) + " fits this GPU)";
    return c->name() + " (" + how + ")";
  };
  if (!autotune::enabled()) return described(heuristic(p), "heuristic, FA_AUTOTUNE=0");
  const autotune::Key key = make_key(p);
  if (const KernelConfig* c = remembered(key, key.str())) return described(c, "tuned");
  return described(heuristic(p), "not tuned yet; heuristic");
}

}  // namespace fa::tuner
