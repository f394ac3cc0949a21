// The run-time tuner of steps 06 and 07: time every compiled kernel configuration the first time
// a problem key is seen, remember the winner in memory and in a text file, reuse it afterwards.
//
// Everything that decides the winner is in the key: the shape (N_q, N_kv, D, B·H_q, causal and
// its alignment, dtype), the GPU, and the BUILD of the kernels. The last one is seed bug #10: a
// cache that outlives a kernel change hands out timings of code that no longer exists, and "my
// fix did nothing" follows. Each step derives its build id from its own compilation, so any
// rebuild starts from an empty cache.
//
// Environment:
//   FA_AUTOTUNE=0          never time anything; use the step's documented heuristic
//   FA_AUTOTUNE_VERBOSE=1  print every configuration's time to stderr when tuning
//   FA_AUTOTUNE_CACHE=path the cache file (default $XDG_CACHE_HOME/fa2_course/autotune.txt, else
//                          $HOME/.cache/fa2_course/autotune.txt). One line per result:
//                          <key> TAB <config name> TAB <median ms>; later lines win.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fa/params.h"

namespace fa::autotune {

/// What a tuning result depends on.
struct Key {
  int64_t seqlen_q = 0, seqlen_kv = 0, head_dim = 0, batch_heads = 0;
  std::string causal = "none";  // "none", "top_left" or "bottom_right"
  std::string dtype = "bf16";
  std::string gpu;       // device name, e.g. "NVIDIA H200"
  std::string build_id;  // identifies the compiled kernels (see build_id_of)
  /// One line of text without tabs, e.g. "nq=4096 nkv=4096 d=64 bh=32 causal=none dtype=bf16
  /// gpu=NVIDIA H200 build=1f0c...": the cache's lookup key.
  std::string str() const;
};

/// The shape part of the key of `p` (gpu and build_id left empty for the caller to fill).
Key shape_key(const AttentionParams& p);

/// A short stable id of `text` (64-bit FNV-1a as 16 hex digits), e.g. of __FILE__ __DATE__ __TIME__.
std::string hash_hex(std::string_view text);

/// False when the environment says FA_AUTOTUNE=0.
bool enabled();

/// The cache file path from the environment (see the header comment).
std::string default_cache_path();

/// Name of the current CUDA device ("" without one). Cached per device: the query is slow.
std::string current_gpu_name();

/// Opt-in shared memory per block of the current device, in bytes (0 without a device).
int current_max_smem_optin();

/// Tuning results in memory, backed by an append-only text file. Thread-safe. An unreadable or
/// unwritable file is not an error: the cache then lives in memory only.
class Cache {
 public:
  /// `path` empty: memory only.
  explicit Cache(std::string path);
  /// The configuration stored for `key`, if any (reads the file on first use).
  std::optional<std::string> find(const Key& key);
  /// Remembers `config` for `key` and appends it to the file.
  void put(const Key& key, const std::string& config, double ms);
  const std::string& path() const { return path_; }

 private:
  void load_locked();
  std::mutex mu_;
  std::string path_;
  bool loaded_ = false;
  std::map<std::string, std::string> entries_;  // key.str() → config name
};

/// One configuration to time: its name and a launcher that runs it on a stream.
struct Candidate {
  std::string name;
  std::function<Status(cudaStream_t)> run;
};

struct Timings {
  int best = -1;                  // index of the fastest candidate that ran, -1 if none did
  std::vector<double> median_ms;  // per candidate; +inf when it failed to launch
};

/// Runs each candidate once (warm-up; a launch error disqualifies it), then `reps` times, each
/// timed with CUDA events on `stream`, and picks the smallest median. Synchronises `stream`.
/// With FA_AUTOTUNE_VERBOSE=1 prints `label` and every candidate's median to stderr.
Timings time_candidates(const std::vector<Candidate>& candidates, cudaStream_t stream, int reps = 5,
                        const std::string& label = "");

}  // namespace fa::autotune
