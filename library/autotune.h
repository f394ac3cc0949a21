// The pieces of the run-time tuner (library/tuner.h puts them together): the problem key, the
// cache of results in memory and in a text file, the per-device facts the tuner needs, and the
// timing of candidate configurations.
//
// Everything that decides the winner is in the key:
//   - the shape: N_q, N_kv, D, B, H_q and H_kv (GQA changes how much K/V each block reuses, so
//     B·H_q alone is not enough), the causal mask and its alignment, the dtype;
//   - the layout class of the four tensors' strides: "bhnd" (all contiguous (B, H, N, D)),
//     "bnhd" (all contiguous (B, N, H, D)) or "strided" (anything else): the stride of a row
//     decides how well a tile's loads coalesce;
//   - whether LSE is written (its stores are part of the time);
//   - the split-KV request (Part V): a split call runs other kernels and a combine;
//   - the GPU's name;
//   - the BUILD of the kernels. This is seed bug #10: a cache that outlives a kernel change hands
//     out timings of code that no longer exists, and "my fix did nothing" follows. The build
//     system hashes what each step compiles into FA_BUILD_ID, so any rebuild of a step's kernels
//     starts from an empty cache for that step.
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

/// What a tuning result depends on (see the header comment).
struct Key {
  int64_t seqlen_q = 0;   ///< N_q
  int64_t seqlen_kv = 0;  ///< N_kv, or with kv_bucket its bucket: the power of two at or above it
  /// seqlen_kv is a bucket (kv_bucketed()): a tuner whose calls' caches grow by one key per call
  /// (decode) would otherwise tune again on every call. Printed as "nkv<=".
  bool kv_bucket = false;
  int64_t head_dim = 0;         ///< D
  int64_t batch = 0;            ///< B
  int64_t heads_q = 0;          ///< H_q
  int64_t heads_kv = 0;         ///< H_kv
  std::string causal = "none";  ///< "none", "top_left" or "bottom_right"
  std::string dtype = "bf16";   ///< element type of Q, K, V and O
  std::string layout = "bhnd";  ///< "bhnd", "bnhd" or "strided" (layout_class)
  bool lse = false;             ///< LSE is written
  /// Split-KV: "none" (no split: num_splits 1, or 0 without a workspace), "auto" (0 with a
  /// workspace: the step chooses) or the count asked for. A split call launches other kernels.
  std::string split = "none";
  /// A sliding window: "none", or "left,right,alignment" (its own kernels, its own timings).
  std::string window = "none";
  /// Score modifications: "none", or which of "softcap", "alibi", "sinks" the call has, joined by
  /// '+' (their own kernels, their own timings: the cap makes the forward SFU-bound).
  std::string mods = "none";
  std::string gpu;       ///< device name, e.g. "NVIDIA H200"
  std::string build_id;  ///< identifies the compiled kernels (FA_BUILD_ID of the step)
  /// One line of text without tabs, the cache's lookup key, e.g. "nq=4096 nkv=4096 d=64 b=2
  /// hq=16 hkv=4 causal=none dtype=bf16 layout=bhnd lse=0 gpu=NVIDIA H200 build=1f0c...".
  /// Plain string appends: it is built on every call of a tuned step.
  std::string str() const;
};

/// "bhnd" when Q, K, V and O are all contiguous (B, H, N, D), "bnhd" when all are contiguous
/// (B, N, H, D), else "strided".
const char* layout_class(const AttentionParams& p);

/// The problem part of the key of `p` (gpu and build_id left empty for the caller to fill).
Key shape_key(const AttentionParams& p);

/// `k` with its N_kv replaced by its bucket, the power of two at or above it (kv_bucket set).
Key kv_bucketed(Key k);

/// A short stable id of `text` (64-bit FNV-1a as 16 hex digits).
std::string hash_hex(std::string_view text);

/// False when the environment says FA_AUTOTUNE=0.
bool enabled();

/// The cache file path from the environment (see the header comment).
std::string default_cache_path();

/// What the tuner needs to know about a device. Queried once per device: the queries are slow
/// next to a kernel launch.
struct DeviceFacts {
  std::string name;        ///< e.g. "NVIDIA H200"
  int max_smem_optin = 0;  ///< opt-in dynamic shared memory per block, in bytes
  int sm_count = 0;        ///< streaming multiprocessors
};

/// The facts of the current CUDA device; all empty or zero without one.
const DeviceFacts& current_device();

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
  /// The file behind the cache ("" for memory only).
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
  std::string name;                         ///< the configuration's name
  std::function<Status(cudaStream_t)> run;  ///< launches it once, asynchronously
};

/// What time_candidates measured.
struct Timings {
  int best = -1;                  ///< index of the fastest candidate that ran, -1 if none did
  std::vector<double> median_ms;  ///< per candidate; +inf when it failed to launch
};

/// Runs each candidate once (warm-up; a launch error disqualifies it), then `reps` interleaved
/// rounds that time every candidate once each with CUDA events on `stream`, and picks the
/// smallest median. Synchronises `stream`.
/// With FA_AUTOTUNE_VERBOSE=1 prints `label` and every candidate's median to stderr.
Timings time_candidates(const std::vector<Candidate>& candidates, cudaStream_t stream, int reps = 5,
                        const std::string& label = "");

}  // namespace fa::autotune
