// The input validation every step shares: one function, called by every step's forward and by the
// C interface (fa_validate, fa_forward) and through it by the Python package, so that none of them
// can disagree about what is accepted. It holds every rule, the launch-time limits of the step's
// kernels and the GPU check included: what validate accepts, forward runs.
//
// Sizes are multiplied in 128 bits (u128): B, H, N and D are each int64, and their products wrap in
// 64 bits long before any of them is refused on its own (B = H_q = 2^32 makes B·H_q = 0 in int64).
#include <algorithm>
#include <iterator>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>

#include <cuda_runtime.h>

#include "fa/registry.h"

namespace fa {
namespace {

using u128 = unsigned __int128;
constexpr u128 kAddressSpace = u128(1) << 64;
constexpr int64_t kInt32Max = 0x7fffffff;
// TMA tensor maps (library/tma.cpp): strides are 40-bit byte counts, multiples of 16.
constexpr int64_t kTmaMaxStrideElements = (int64_t(1) << 39) - 8;
constexpr int kElementBytes = 2;  // bf16 and fp16 alike: every DType is 16 bits wide
constexpr int kLseBytes = 4;      // fp32

// No iostreams on the library's paths (see library/autotune.cpp): plain string building only.
std::string list_dims(const std::vector<int>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s;
}

std::string list_dtypes(const std::vector<DType>& types) {
  std::string s;
  for (size_t i = 0; i < types.size(); ++i) s += (i ? ", " : "") + dtype_name(types[i]);
  return s;
}

bool has_dtype(const std::vector<DType>& types, DType t) {
  return std::find(types.begin(), types.end(), t) != types.end();
}

// The element type: one of the enum's (a DType cast from an integer may be neither), and one the
// step is compiled for. `what` names the kernel in the refusal ("this step", "the backward").
Status check_dtype(DType t, const std::vector<DType>& types, const std::string& what) {
  if (!dtype_known(t))
    return Status::Unsupported("invalid attention input: " + dtype_name(t) +
                               " is not an element type (DType: 0 = bf16, 1 = fp16)");
  if (!has_dtype(types, t))
    return Status::Unsupported("invalid attention input: element type " + dtype_name(t) + " is not supported by " +
                               what + "; supported: " + list_dtypes(types));
  return Status::Ok();
}

std::string str(u128 x) {  // std::to_string has no 128-bit overload
  if (x == 0) return "0";
  std::string s;
  for (; x; x /= 10) s.insert(s.begin(), char('0' + int(x % 10)));
  return s;
}

bool aligned(const void* p, unsigned bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

Status fail(const std::string& m) {
  return Status::Unsupported("invalid attention input: " + m);
}

// One rank-4 tensor of the call, as validate sees it.
struct Tensor {
  const char* name;
  const void* ptr;
  int64_t size[4];    // (batch, head, sequence, dim)
  int64_t stride[4];  // in elements
};

constexpr const char* kAxes[4] = {"batch", "head", "sequence", "dim"};

// A tensor of the call `p`: (B, H_q, N_q, D) on the query side (Q, O, dO, dQ), else (B, H_kv, N_kv, D).
// With a block table, K and V are pools of pages: (num_pages, H_kv, page_size, D), `batch` the page.
// With varlen offsets, Q and O (or K and V) are packed: (1, H, total, D), the batch stride unused.
Tensor call_tensor(const AttentionParams& p, const char* name, const void* ptr, bool q_side, const Strides& s) {
  if (q_side && p.cu_seqlens_q)
    return Tensor{name, ptr, {1, p.heads_q, p.total_q, p.head_dim}, {0, s.head, s.seq, s.dim}};
  if (!q_side && p.cu_seqlens_kv)
    return Tensor{name, ptr, {1, p.heads_kv, p.total_kv, p.head_dim}, {0, s.head, s.seq, s.dim}};
  if (!q_side && p.block_table)
    return Tensor{name, ptr, {p.num_pages, p.heads_kv, p.page_size, p.head_dim}, {s.batch, s.head, s.seq, s.dim}};
  return Tensor{name,
                ptr,
                {p.batch, q_side ? p.heads_q : p.heads_kv, q_side ? p.seqlen_q : p.seqlen_kv, p.head_dim},
                {s.batch, s.head, s.seq, s.dim}};
}

u128 elements(const Tensor& t) {
  return u128(uint64_t(t.size[0])) * u128(uint64_t(t.size[1])) * u128(uint64_t(t.size[2])) * u128(uint64_t(t.size[3]));
}

// Bytes from a tensor's first element to one past its last: (Σ (size − 1)·stride + 1) elements.
// A dimension of size 1 never steps, so its stride does not count (PyTorch gives such dimensions
// arbitrary strides). Strides are >= 0 when this is called, and the sum fits in 128 bits.
u128 extent_bytes(const Tensor& t, int elem_bytes) {
  u128 span = 1;
  for (int a = 0; a < 4; ++a)
    if (t.size[a] > 1) span += u128(uint64_t(t.size[a] - 1)) * u128(uint64_t(t.stride[a]));
  return span * u128(elem_bytes);
}

// The bytes the ALiBi slopes span: H_q floats, or with a batch stride B − 1 strides more.
u128 slopes_bytes(const AttentionParams& p) {
  const u128 last = u128(uint64_t(p.batch > 0 ? p.batch - 1 : 0)) * u128(uint64_t(p.alibi_slopes_stride_batch));
  return (last + u128(uint64_t(p.heads_q))) * 4;
}

bool overlaps(const void* a, u128 a_bytes, const void* b, u128 b_bytes) {
  const u128 a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

// ---- the rules, in the order validate applies them ----------------------------------------------

// Every tensor's element count fits in 63 bits, so that every later product of sizes in int64 (grid
// sizes, offsets, byte counts) is exact.
Status check_sizes(const Tensor& t) {
  if (elements(t) > (u128(1) << 60))
    return fail(std::string(t.name) + " has " + str(elements(t)) + " elements (B·H·N·D); at most 2^60 are supported");
  return Status::Ok();
}

Status check_strides(const Tensor& t, bool output, const Capabilities& caps) {
  if (t.stride[3] != 1) return fail(std::string(t.name) + " must have unit stride along the head dim");
  for (int a = 0; a < 3; ++a) {
    if (t.size[a] == 1) continue;  // never stepped along: any stride will do
    if (t.stride[a] < 0) return fail(std::string(t.name) + " strides must be >= 0");
    // An input may broadcast (stride 0: one K/V shared by every batch entry); an output may not,
    // or two rows of O would be written to the same place.
    if (t.stride[a] == 0 && output)
      return fail(std::string(t.name) + " must not have a zero " + kAxes[a] + " stride (its " + kAxes[a] +
                  " entries would overwrite each other)");
    if (t.stride[a] == 0 && !caps.broadcast)
      return fail(std::string(t.name) + " has a zero " + kAxes[a] +
                  " stride (a broadcast); this step reads its inputs through TMA tensor maps, which need one row "
                  "per " +
                  kAxes[a] + " entry");
    // 16-byte rows: every step loads a row of D 16-bit values with 16-byte vector loads.
    if (t.stride[a] % 8)
      return fail(std::string(t.name) + " strides must be multiples of 8 elements (16-byte aligned rows)");
    if (caps.tma && t.stride[a] > kTmaMaxStrideElements)
      return fail(std::string(t.name) + "'s " + kAxes[a] + " stride " + std::to_string(t.stride[a]) +
                  " is past what a TMA tensor map holds (byte strides below 2^40: at most " +
                  std::to_string(kTmaMaxStrideElements) + " elements)");
  }
  return Status::Ok();
}

// A TMA step addresses its tiles with 32-bit coordinates (batch, head, row) in the tensor maps.
Status check_tma_sizes(const Tensor& t) {
  for (int a = 0; a < 3; ++a)
    if (t.size[a] > kInt32Max)
      return fail(std::string(t.name) + "'s " + kAxes[a] + " size " + std::to_string(t.size[a]) +
                  " is past this step's TMA coordinates (32-bit: at most 2147483647)");
  return Status::Ok();
}

// The tensor lies inside the address space: its last byte is below 2^64.
Status check_address_range(const char* name, const void* ptr, u128 bytes) {
  if (u128(reinterpret_cast<uintptr_t>(ptr)) + bytes > kAddressSpace)
    return fail(std::string(name) + " would run past the end of the address space (" + str(bytes) +
                " bytes from its base): its sizes or strides are wrong");
  return Status::Ok();
}

// No two elements of the output share an address. Sorted by stride, each axis must step past
// everything the axes inside it span: stride ≥ Σ (size − 1)·stride of the smaller ones, + 1. That is
// exact for the layouts PyTorch makes (any permutation of a dense or padded tensor) and refuses the
// rare interleaved layout that is injective without nesting; a zero stride is refused before.
Status check_no_self_overlap(const Tensor& t) {
  int order[4] = {0, 1, 2, 3};
  std::sort(order, order + 4, [&](int x, int y) { return t.stride[x] < t.stride[y]; });
  u128 span = 0;  // elements spanned by the axes so far, minus one
  const char* inner = nullptr;
  for (int i : order) {
    if (t.size[i] == 1) continue;
    if (inner && u128(uint64_t(t.stride[i])) <= span)
      return fail(std::string(t.name) + "'s " + kAxes[i] + " stride (" + std::to_string(t.stride[i]) +
                  ") is within the span of its " + inner + " axis (" + str(span + 1) +
                  " elements): two of its elements would be written to the same place");
    span += u128(uint64_t(t.size[i] - 1)) * u128(uint64_t(t.stride[i]));
    inner = kAxes[i];
  }
  return Status::Ok();
}

// The block-table entries a sequence needs: ⌈N_kv / page_size⌉ (a page size not yet judged counts
// as 1: the table's extent is asked before or without check_paged's verdict, never a division by 0).
int64_t pages_per_sequence(const AttentionParams& p) {
  const int64_t page = std::max<int64_t>(p.page_size, 1);
  return (p.seqlen_kv + page - 1) / page;
}

// A paged KV cache (Part V): the step reads one, the page size is a power of two (the kernel
// shifts and masks a key's index into page and row), there are pages, and the table has a row of
// at least ⌈N_kv / page_size⌉ entries per sequence, 4-byte aligned. The page numbers themselves are
// in device memory, out of the host's sight: the kernel clamps them to [0, num_pages).
Status check_paged(const AttentionParams& p, const Capabilities& caps) {
  if (!p.block_table) {
    if (p.page_size != 0 || p.num_pages != 0 || p.block_table_stride != 0)
      return fail(
          "page_size, num_pages and block_table_stride are for a paged KV cache: set block_table, or zero them");
    return Status::Ok();
  }
  if (!caps.paged_kv)
    return fail(
        "this step reads K and V as (B, H_kv, N_kv, D) tensors: block_table must be null (paged KV caches "
        "are Part V's)");
  if (!aligned(p.block_table, 4)) return fail("block_table must be 4-byte aligned (int32)");
  if (p.page_size < 1 || p.page_size > kInt32Max || (p.page_size & (p.page_size - 1)) != 0)
    return fail("page_size must be a power of two (got " + std::to_string(p.page_size) + ")");
  if (p.num_pages < 1 || p.num_pages > kInt32Max)
    return fail("num_pages must be in [1, 2^31 - 1] (got " + std::to_string(p.num_pages) + ")");
  // The kernels address a page's rows in 32 bits (device/paged_kv.h): the strides between pages and
  // between a page's rows below 2^31 elements, and a page's rows with their D columns too. An axis
  // of one (one page, one key per page) is never stepped: its stride is anything, as PyTorch makes it.
  for (auto [name, s] : {std::pair{"k", p.k_stride}, {"v", p.v_stride}}) {
    if (p.num_pages == 1) s.batch = 0;
    if (p.page_size == 1) s.seq = 0;
    if (s.batch < 0 || s.batch > kInt32Max || s.seq < 0 || s.seq > kInt32Max ||
        (p.page_size - 1) * s.seq + p.head_dim > kInt32Max)  // each factor below 2^31: no overflow
      return fail(std::string(name) +
                  "'s pool is too far apart for a page's 32-bit addressing: its stride between pages (" +
                  std::to_string(s.batch) + ") and a page's rows ((page_size - 1) · " + std::to_string(s.seq) +
                  " + D) must be in [0, 2^31 - 1] elements");
  }
  const int64_t pages = pages_per_sequence(p);
  if (p.batch > 1 && p.block_table_stride < pages)  // one sequence: its stride is never stepped
    return fail("block_table_stride (" + std::to_string(p.block_table_stride) +
                ") must hold a sequence's pages: N_kv / page_size rounded up = " + std::to_string(pages));
  if (p.batch > 1 && p.block_table_stride > (int64_t(1) << 40))
    return fail("block_table_stride " + std::to_string(p.block_table_stride) + " is not a table's");
  return Status::Ok();
}

// Variable-length sequences (Part V): the step reads offsets, both arrays or neither, 4-byte
// aligned, the packed tensors' rows given, and no other per-sequence option beside them. The offsets'
// values are the kernel's to clamp to the tensors.
Status check_varlen(const AttentionParams& p, const Capabilities& caps) {
  if (!p.cu_seqlens_q && !p.cu_seqlens_kv) {
    if (p.total_q != 0 || p.total_kv != 0)
      return fail(
          "total_q and total_kv are for variable-length sequences: set cu_seqlens_q and cu_seqlens_kv, or "
          "zero them");
    return Status::Ok();
  }
  if (!caps.varlen)
    return fail(
        "this step reads (B, H, N, D) tensors: cu_seqlens_q and cu_seqlens_kv must be null (variable-length "
        "sequences are Part V's)");
  if (!p.cu_seqlens_q || !p.cu_seqlens_kv)
    return fail("variable-length sequences need both cu_seqlens_q and cu_seqlens_kv (B + 1 offsets each)");
  if (!aligned(p.cu_seqlens_q, 4) || !aligned(p.cu_seqlens_kv, 4))
    return fail("cu_seqlens_q and cu_seqlens_kv must be 4-byte aligned (int32)");
  if (p.total_q < 1 || p.total_kv < 1)
    return fail("total_q and total_kv (the packed tensors' rows) must be >= 1 (got " + std::to_string(p.total_q) +
                ", " + std::to_string(p.total_kv) + ")");
  if (p.seqlens_kv || p.block_table)
    return fail(
        "variable-length sequences take their key lengths from cu_seqlens_kv: seqlens_kv and block_table "
        "must be null");
  return Status::Ok();
}

// Appending to the cache (Part V): both tensors or neither, a step that writes its caches, the
// lengths the rows go after (seqlens_kv), and at least one and at most N_kv new rows. The tensors'
// own checks (sizes, strides, overlaps) follow with the others' in validate_input.
Status check_append(const AttentionParams& p, const Capabilities& caps) {
  if (!p.k_new && !p.v_new) {
    if (p.seqlen_new != 0) return fail("seqlen_new is for appending to the cache: set k_new and v_new, or zero it");
    return Status::Ok();
  }
  if (!p.k_new || !p.v_new) return fail("appending to the cache needs both k_new and v_new");
  if (!caps.kv_append)
    return fail(
        "this step reads the caches only: k_new and v_new must be null (appending in the call is Part V's, "
        "step 32)");
  if (!p.seqlens_kv)
    return fail(
        "appending to the cache needs seqlens_kv: sequence b's new rows are written after its "
        "seqlens_kv[b] keys");
  if (p.seqlen_new < 1 || p.seqlen_new > p.seqlen_kv)
    return fail("seqlen_new must be in [1, N_kv = " + std::to_string(p.seqlen_kv) + "] with k_new (got " +
                std::to_string(p.seqlen_new) + ")");
  return Status::Ok();
}

// A sliding window: each side −1 (unbounded) or a key count, and a step that takes one: a call the
// library cannot honour is refused, never run without its window. With the per-sequence options
// (lengths, pages, packed sequences, an append, splits) the production decode kernel takes it; a
// step without those options refuses them by their own capabilities.
Status check_window(const AttentionParams& p, const Capabilities& caps) {
  if (p.window_left < -1 || p.window_right < -1)
    return fail("window_left and window_right must be -1 (unbounded) or >= 0 (got " + std::to_string(p.window_left) +
                ", " + std::to_string(p.window_right) + ")");
  if (!p.has_window()) return Status::Ok();
  if (!caps.sliding_window)
    return fail("this step has no sliding window: window_left and window_right must be -1 (got " +
                std::to_string(p.window_left) + ", " + std::to_string(p.window_right) + ")");
  return Status::Ok();
}

// The score modifications (params.h): each well formed, and taken by the step; a call the step
// cannot honour is refused, never run without its softcap, bias or sinks.
Status check_score_mods(const AttentionParams& p, const Capabilities& caps) {
  if (!(p.softcap >= 0.0f) || !std::isfinite(p.softcap))
    return fail("softcap must be 0 (off) or positive and finite (got " + std::to_string(p.softcap) + ")");
  // The kernels' tanh (1 − 2/(e^2x + 1), kernels/score_mod.h) errs by about 1.3e-5 absolute, so the
  // capped score by about 1.3e-5·softcap: 1.3e-2 at the limit, a bf16 logit's rounding. Past it the
  // error grows with the cap (every score 0 by 1e9); a cap of 1000 moves a score of 20 by 3e-3.
  if (p.softcap > kMaxSoftcap)
    return fail("softcap must be at most " + std::to_string(int(kMaxSoftcap)) + " (got " + std::to_string(p.softcap) +
                "): a cap that large changes no score by more than bf16's rounding; pass 0 for no cap");
  if (p.softcap > 0.0f && !caps.softcap)
    return fail("this step has no softcap: softcap must be 0 (got " + std::to_string(p.softcap) + ")");
  if (p.alibi_slopes) {
    if (!caps.alibi) return fail("this step has no ALiBi: alibi_slopes must be null");
    if (p.alibi_slopes_stride_batch != 0 && p.alibi_slopes_stride_batch < p.heads_q)
      return fail(
          "alibi_slopes_stride_batch must be 0 (one slope per head) or at least H_q = " + std::to_string(p.heads_q) +
          " (one per batch entry and head; got " + std::to_string(p.alibi_slopes_stride_batch) + ")");
  }
  if (p.sinks && !caps.sinks) return fail("this step has no attention sinks: sinks must be null");
  if ((p.alibi_slopes && !aligned(p.alibi_slopes, 4)) || (p.sinks && !aligned(p.sinks, 4)))
    return fail("alibi_slopes and sinks must be 4-byte aligned fp32 arrays");
  return Status::Ok();
}

// The launch limits of the step's kernels: the same numbers its launcher obeys.
Status check_launch_limits(const AttentionParams& p, const Capabilities& caps) {
  if (caps.max_seqlen > 0 && (p.seqlen_q > caps.max_seqlen || p.seqlen_kv > caps.max_seqlen))
    return fail("N_q and N_kv must be at most " + std::to_string(caps.max_seqlen) + " for this step (got N_q=" +
                std::to_string(p.seqlen_q) + ", N_kv=" + std::to_string(p.seqlen_kv) + ")");
  const u128 batch_heads = u128(uint64_t(p.batch)) * u128(uint64_t(p.heads_q));
  if (caps.max_batch_heads > 0 && batch_heads > u128(caps.max_batch_heads))
    return fail("B·H_q must be at most " + std::to_string(caps.max_batch_heads) + " for this step (got " +
                str(batch_heads) + ")");
  if (caps.max_tensor_elements > 0) {
    const u128 largest = std::max(batch_heads * u128(uint64_t(p.seqlen_q)),
                                  u128(uint64_t(p.batch)) * u128(uint64_t(p.heads_kv)) * u128(uint64_t(p.seqlen_kv))) *
                         u128(uint64_t(p.head_dim));
    if (largest > u128(caps.max_tensor_elements))
      return fail("tensors of " + str(largest) + " elements exceed this step's limit of " +
                  std::to_string(caps.max_tensor_elements));
  }
  if (caps.max_work_tiles > 0) {
    const int64_t rows = std::max(caps.work_tile_rows, 1);
    const u128 tiles = u128(uint64_t((p.seqlen_q + rows - 1) / rows)) * batch_heads;
    if (tiles > u128(caps.max_work_tiles))
      return fail("this step numbers its work in 32 bits: at most " + std::to_string(caps.max_work_tiles) +
                  " tiles of " + std::to_string(rows) + " query rows, B·H_q·⌈N_q/" + std::to_string(rows) + "⌉ (got " +
                  str(tiles) + ")");
  }
  return Status::Ok();
}

// The compute capability of the current device, read once per device (0: no usable device).
int device_compute_capability() {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};  // major·10 + minor, 0 until read
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // leave no sticky error behind
    return 0;
  }
  if (device >= 0 && device < kDevices)
    if (const int cc = known[device].load(std::memory_order_relaxed)) return cc;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const int cc = major * 10 + minor;
  if (device >= 0 && device < kDevices) known[device].store(cc, std::memory_order_relaxed);
  return cc;
}

}  // namespace

Status validate(const AttentionParams& p, const Capabilities& caps) {
  if (Status st = validate_input(p, caps); !st.ok()) return st;
  // Last, since it is the one rule about the machine rather than the call.
  return check_device(caps);
}

Status validate_input(const AttentionParams& p, const Capabilities& caps) {
  if (!p.q || !p.k || !p.v || !p.o) return fail("q, k, v and o must be non-null device pointers");
  if (p.batch < 1 || p.heads_q < 1 || p.heads_kv < 1 || p.seqlen_q < 1 || p.seqlen_kv < 1)
    return fail("B, H_q, H_kv, N_q and N_kv must all be >= 1 (got B=" + std::to_string(p.batch) +
                " H_q=" + std::to_string(p.heads_q) + " H_kv=" + std::to_string(p.heads_kv) +
                " N_q=" + std::to_string(p.seqlen_q) + " N_kv=" + std::to_string(p.seqlen_kv) + ")");
  // Compared in 64 bits: a head dim that equals a supported one only after truncation to int is
  // not supported.
  if (std::none_of(caps.head_dims.begin(), caps.head_dims.end(), [&](int d) { return int64_t(d) == p.head_dim; }))
    return fail("head dim " + std::to_string(p.head_dim) +
                " is not supported; supported: " + list_dims(caps.head_dims));
  if (p.heads_q % p.heads_kv != 0)
    return fail("H_q (" + std::to_string(p.heads_q) + ") must be a multiple of H_kv (" + std::to_string(p.heads_kv) +
                ")");
  if (p.heads_kv != p.heads_q && !caps.gqa) return fail("this step does not support H_kv < H_q");
  if (Status st = check_dtype(p.dtype, caps.dtypes, "this step"); !st.ok()) return st;
  if (p.causal && !caps.causal) return fail("this step does not support the causal mask");
  if (p.lse && !caps.lse) return fail("this step does not write LSE; pass lse = nullptr");
  if (!(p.effective_scale() > 0.0f) || !std::isfinite(p.effective_scale()))
    return fail("softmax scale must be positive and finite");

  if (Status st = check_paged(p, caps); !st.ok()) return st;
  if (Status st = check_varlen(p, caps); !st.ok()) return st;
  if (Status st = check_append(p, caps); !st.ok()) return st;
  if (Status st = check_window(p, caps); !st.ok()) return st;
  if (Status st = check_score_mods(p, caps); !st.ok()) return st;
  auto tensor = [&](const char* name, const void* ptr, bool q_side, const Strides& s) {
    return call_tensor(p, name, ptr, q_side, s);
  };
  const Tensor q = tensor("q", p.q, true, p.q_stride), k = tensor("k", p.k, false, p.k_stride),
               v = tensor("v", p.v, false, p.v_stride), o = tensor("o", p.o, true, p.o_stride);
  for (const Tensor* t : {&q, &k, &v, &o}) {
    if (Status st = check_sizes(*t); !st.ok()) return st;
    if (Status st = check_strides(*t, t == &o, caps); !st.ok()) return st;
    if (caps.tma)
      if (Status st = check_tma_sizes(*t); !st.ok()) return st;
  }
  if (!aligned(p.q, 16) || !aligned(p.k, 16) || !aligned(p.v, 16) || !aligned(p.o, 16))
    return fail("q, k, v and o must be 16-byte aligned");
  if (p.lse && !aligned(p.lse, 4)) return fail("lse must be 4-byte aligned (a contiguous (B, H_q, N_q) fp32 array)");

  const u128 q_bytes = extent_bytes(q, kElementBytes), k_bytes = extent_bytes(k, kElementBytes),
             v_bytes = extent_bytes(v, kElementBytes), o_bytes = extent_bytes(o, kElementBytes);
  // The LSE: (B, H_q, N_q), or with varlen (H_q, total_q), fp32.
  const u128 lse_bytes =
      (p.cu_seqlens_q ? u128(uint64_t(p.total_q)) : u128(uint64_t(p.batch)) * u128(uint64_t(p.seqlen_q))) *
      u128(uint64_t(p.heads_q)) * kLseBytes;
  for (const auto& [t, bytes] : {std::pair{&q, q_bytes}, {&k, k_bytes}, {&v, v_bytes}, {&o, o_bytes}})
    if (Status st = check_address_range(t->name, t->ptr, bytes); !st.ok()) return st;
  if (p.lse)
    if (Status st = check_address_range("lse", p.lse, lse_bytes); !st.ok()) return st;

  if (Status st = check_no_self_overlap(o); !st.ok()) return st;
  // The kernels read Q, K, V while other blocks already write O: O must share no byte with them.
  if (overlaps(p.o, o_bytes, p.q, q_bytes) || overlaps(p.o, o_bytes, p.k, k_bytes) ||
      overlaps(p.o, o_bytes, p.v, v_bytes))
    return fail("o overlaps q, k or v: the output must be a separate buffer (no in-place attention)");
  if (p.lse && (overlaps(p.lse, lse_bytes, p.o, o_bytes) || overlaps(p.lse, lse_bytes, p.q, q_bytes) ||
                overlaps(p.lse, lse_bytes, p.k, k_bytes) || overlaps(p.lse, lse_bytes, p.v, v_bytes)))
    return fail("lse overlaps q, k, v or o: it must be a separate buffer");

  // The score modifications' arrays are read while O and the LSE are written.
  for (const auto& [name, ptr, bytes] :
       {std::tuple{"alibi_slopes", static_cast<const void*>(p.alibi_slopes),
                   p.alibi_slopes ? slopes_bytes(p) : u128(0)},
        std::tuple{"sinks", static_cast<const void*>(p.sinks), u128(uint64_t(p.heads_q)) * kLseBytes}})
    if (ptr && (overlaps(ptr, bytes, p.o, o_bytes) || (p.lse && overlaps(ptr, bytes, p.lse, lse_bytes)) ||
                (p.workspace && overlaps(ptr, bytes, p.workspace, u128(p.workspace_bytes))) ||
                (p.k_new && (overlaps(ptr, bytes, p.k, k_bytes) || overlaps(ptr, bytes, p.v, v_bytes)))))
      return fail(std::string(name) +
                  " overlaps o, lse, the workspace or (with an append) k or v: the call writes those while it reads "
                  "it, so it must be a separate buffer");

  // Split-KV: the count, the step's support, and the workspace the splits need.
  if (p.num_splits < 0 || p.num_splits > kMaxKvSplits)
    return fail("num_splits must be 0 (the step chooses), 1 (no split) or up to " + std::to_string(kMaxKvSplits) +
                " (got " + std::to_string(p.num_splits) + ")");
  if (p.num_splits > 1 && !caps.split_kv)
    return fail("this step does not split the keys: num_splits must be 0 or 1 (split-KV is Part V's)");
  if (p.num_splits > 1) {
    const size_t need = split_kv_workspace_bytes(p, p.num_splits);
    if (!p.workspace || p.workspace_bytes < need)
      return fail("num_splits = " + std::to_string(p.num_splits) + " needs a workspace of " + std::to_string(need) +
                  " bytes (split_kv_workspace_bytes); got " + std::to_string(p.workspace ? p.workspace_bytes : 0));
  }
  if (p.workspace && caps.split_kv) {
    if (!aligned(p.workspace, 16)) return fail("the workspace must be 16-byte aligned");
    if (Status st = check_address_range("workspace", p.workspace, u128(p.workspace_bytes)); !st.ok()) return st;
    const u128 ws_bytes = u128(p.workspace_bytes);
    if (overlaps(p.workspace, ws_bytes, p.q, q_bytes) || overlaps(p.workspace, ws_bytes, p.k, k_bytes) ||
        overlaps(p.workspace, ws_bytes, p.v, v_bytes) || overlaps(p.workspace, ws_bytes, p.o, o_bytes) ||
        (p.lse && overlaps(p.workspace, ws_bytes, p.lse, lse_bytes)))
      return fail("the workspace overlaps q, k, v, o or lse: it must be a separate buffer");
  }

  // Ragged KV caches: the step's support, and an int32 array's alignment (its values are the
  // kernel's to clamp: reading them here would need a synchronisation).
  if (p.seqlens_kv && !caps.seqlens_kv)
    return fail("this step gives every sequence seqlen_kv keys: seqlens_kv must be null (ragged caches are Part V's)");
  if (p.seqlens_kv && !aligned(p.seqlens_kv, 4)) return fail("seqlens_kv must be 4-byte aligned (int32)");
  // The decode kernel behind those options may take fewer element types than the forward.
  if ((p.num_splits > 1 || p.seqlens_kv || p.block_table) && caps.decode_max_packed_rows > 0 &&
      !caps.decode_dtypes.empty() && !has_dtype(caps.decode_dtypes, p.dtype))
    return fail(std::string(p.block_table  ? "a paged KV cache (block_table)"
                            : p.seqlens_kv ? "a length per sequence (seqlens_kv)"
                                           : "split-KV (num_splits > 1)") +
                " is the decode kernel's here, which is built for " + list_dtypes(caps.decode_dtypes) +
                " only; this call is " + dtype_name(p.dtype));
  if ((p.num_splits > 1 || p.seqlens_kv || p.block_table) && caps.decode_max_packed_rows > 0 && p.heads_kv > 0 &&
      p.seqlen_q * (p.heads_q / p.heads_kv) > caps.decode_max_packed_rows)
    return fail(std::string(p.block_table  ? "a paged KV cache (block_table)"
                            : p.seqlens_kv ? "a length per sequence (seqlens_kv)"
                                           : "split-KV (num_splits > 1)") +
                " is for decode calls here: at most " + std::to_string(caps.decode_max_packed_rows) +
                " query rows per KV head (N_q·H_q/H_kv); this call has " +
                std::to_string(p.seqlen_q * (p.heads_q / p.heads_kv)));

  // The offsets are read while O, the LSE and the workspace are written: no byte in common.
  for (const int32_t* cu : {p.cu_seqlens_q, p.cu_seqlens_kv}) {
    if (!cu) continue;
    const u128 cu_bytes = u128(uint64_t(p.batch) + 1) * 4;
    if (Status st = check_address_range("cu_seqlens", cu, cu_bytes); !st.ok()) return st;
    if (overlaps(cu, cu_bytes, p.o, o_bytes) || (p.lse && overlaps(cu, cu_bytes, p.lse, lse_bytes)) ||
        (p.workspace && overlaps(cu, cu_bytes, p.workspace, u128(p.workspace_bytes))))
      return fail(
          "cu_seqlens_q or cu_seqlens_kv overlaps o, lse or the workspace: the call writes those while it "
          "reads the offsets");
  }
  // The block table is read while O, the LSE and the workspace are written: no byte in common.
  if (p.block_table) {
    const u128 table_bytes =
        (u128(uint64_t(p.batch - 1)) * u128(uint64_t(p.block_table_stride)) + u128(uint64_t(pages_per_sequence(p)))) *
        4;
    if (Status st = check_address_range("block_table", p.block_table, table_bytes); !st.ok()) return st;
    if (overlaps(p.block_table, table_bytes, p.o, o_bytes) ||
        (p.lse && overlaps(p.block_table, table_bytes, p.lse, lse_bytes)) ||
        (p.workspace && overlaps(p.block_table, table_bytes, p.workspace, u128(p.workspace_bytes))))
      return fail("block_table overlaps o, lse or the workspace: the call writes those while it reads the table");
  }

  // The new rows: (B, H_kv, seqlen_new, D) tensors read while the caches, O, the LSE and the
  // workspace are written; the caches, written, must not write one element twice or into each other.
  if (p.k_new) {
    const Tensor caches[2] = {k, v};
    for (const Tensor& c : caches)
      if (Status st = check_no_self_overlap(c); !st.ok()) return st;
    if (overlaps(p.k, k_bytes, p.v, v_bytes))
      return fail("k and v overlap: appending writes both caches, which must not share a byte");
    const Strides* strides[2] = {&p.k_new_stride, &p.v_new_stride};
    const void* ptrs[2] = {p.k_new, p.v_new};
    const char* names[2] = {"k_new", "v_new"};
    for (int i = 0; i < 2; ++i) {
      const Strides& st = *strides[i];
      const Tensor t{
          names[i], ptrs[i], {p.batch, p.heads_kv, p.seqlen_new, p.head_dim}, {st.batch, st.head, st.seq, st.dim}};
      if (Status r = check_sizes(t); !r.ok()) return r;
      if (Status r = check_strides(t, false, caps); !r.ok()) return r;
      if (!aligned(t.ptr, 16)) return fail(std::string(t.name) + " must be 16-byte aligned");
      const u128 bytes = extent_bytes(t, kElementBytes);
      if (Status r = check_address_range(t.name, t.ptr, bytes); !r.ok()) return r;
      if (overlaps(t.ptr, bytes, p.k, k_bytes) || overlaps(t.ptr, bytes, p.v, v_bytes) ||
          overlaps(t.ptr, bytes, p.o, o_bytes) || (p.lse && overlaps(t.ptr, bytes, p.lse, lse_bytes)) ||
          (p.workspace && overlaps(t.ptr, bytes, p.workspace, u128(p.workspace_bytes))))
        return fail(std::string(t.name) +
                    " overlaps k, v, o, lse or the workspace: the call writes those while it reads the new rows");
    }
  }

  // Launch limits of the step's kernels, here rather than in its launcher, so that fa_validate
  // accepts exactly what forward accepts.
  return check_launch_limits(p, caps);
}

Status check_device(const Capabilities& caps) {
  if (caps.only_sm == 0) return Status::Ok();
  const std::string needed = std::to_string(caps.only_sm / 10) + "." + std::to_string(caps.only_sm % 10);
  const int cc = device_compute_capability();
  if (cc == 0)
    return Status::Unsupported("this step needs a GPU of compute capability " + needed +
                               " and no CUDA device is usable");
  if (cc != caps.only_sm)
    return Status::Unsupported("this step's kernels are built for compute capability " + needed + " only (sm_" +
                               std::to_string(caps.only_sm) + "a: H100, H200); this GPU is " + std::to_string(cc / 10) +
                               "." + std::to_string(cc % 10));
  return Status::Ok();
}

Status validate_backward(const BackwardParams& bp, const Capabilities& caps) {
  const AttentionParams& p = bp.fwd;
  if (!p.lse) return fail("the backward needs the forward's LSE: lse must be a non-null device pointer");
  if (!bp.d_o || !bp.dq || !bp.dk || !bp.dv) return fail("d_o, dq, dk and dv must be non-null device pointers");
  // Before the forward's rules, so that the refusal names the backward: a forward may take a type
  // (fp16) that no backward does yet.
  if (Status st = check_dtype(p.dtype, caps.dtypes, "this backward"); !st.ok()) return st;
  if (bp.deterministic && !caps.deterministic_backward)
    return fail("this step's backward has no deterministic mode (its dQ atomics race); a later step adds it");
  // Part V's per-sequence options are the forward's: the backward reads every sequence whole.
  if (p.seqlens_kv || p.block_table || p.cu_seqlens_q || p.cu_seqlens_kv || p.k_new || p.v_new)
    return fail(
        "the backward takes no seqlens_kv, block_table, cu_seqlens, k_new or v_new (they are the forward's, for "
        "inference)");
  if (Status st = validate_input(p, caps); !st.ok()) return st;
  if (p.sinks && !bp.dsinks)
    return fail("with sinks the backward needs dsinks (H_q floats for the sinks' gradient); got null");
  if (!p.sinks && bp.dsinks) return fail("dsinks is the sinks' gradient: the call has no sinks");
  if (bp.dsinks && !aligned(bp.dsinks, 4)) return fail("dsinks must be 4-byte aligned (H_q floats)");
  auto tensor = [&](const char* name, const void* ptr, bool q_side, const Strides& s) {
    return call_tensor(p, name, ptr, q_side, s);
  };
  const Tensor q = tensor("q", p.q, true, p.q_stride), k = tensor("k", p.k, false, p.k_stride),
               v = tensor("v", p.v, false, p.v_stride), o = tensor("o", p.o, true, p.o_stride);
  const Tensor d_o = tensor("d_o", bp.d_o, true, bp.do_stride), dq = tensor("dq", bp.dq, true, bp.dq_stride),
               dk = tensor("dk", bp.dk, false, bp.dk_stride), dv = tensor("dv", bp.dv, false, bp.dv_stride);
  for (const Tensor* t : {&d_o, &dq, &dk, &dv}) {
    const bool output = t != &d_o;
    if (Status st = check_sizes(*t); !st.ok()) return st;
    if (Status st = check_strides(*t, output, caps); !st.ok()) return st;
    if (caps.tma)
      if (Status st = check_tma_sizes(*t); !st.ok()) return st;
    if (!aligned(t->ptr, 16)) return fail(std::string(t->name) + " must be 16-byte aligned");
    if (Status st = check_address_range(t->name, t->ptr, extent_bytes(*t, kElementBytes)); !st.ok()) return st;
    if (output)
      if (Status st = check_no_self_overlap(*t); !st.ok()) return st;
  }
  const size_t need = backward_workspace_bytes(p);
  if (!bp.workspace || bp.workspace_bytes < need)
    return fail("the backward needs a workspace of " + std::to_string(need) +
                " bytes (backward_workspace_bytes: dQ's fp32 accumulator, D, the turnstiles, the LSE copy); got " +
                std::to_string(bp.workspace_bytes));
  if (!aligned(bp.workspace, 16)) return fail("the workspace must be 16-byte aligned");
  if (Status st = check_address_range("workspace", bp.workspace, u128(need)); !st.ok()) return st;
  // Every output shares no byte with any other buffer of the call.
  // The LSE: (B, H_q, N_q), or with varlen (H_q, total_q), fp32.
  const u128 lse_bytes =
      (p.cu_seqlens_q ? u128(uint64_t(p.total_q)) : u128(uint64_t(p.batch)) * u128(uint64_t(p.seqlen_q))) *
      u128(uint64_t(p.heads_q)) * kLseBytes;
  const u128 sinks_bytes = u128(uint64_t(p.heads_q)) * kLseBytes;  // H_q floats
  struct Span {
    const char* name;
    const void* ptr;
    u128 bytes;
  };
  const Span spans[] = {{"q", q.ptr, extent_bytes(q, kElementBytes)},
                        {"k", k.ptr, extent_bytes(k, kElementBytes)},
                        {"v", v.ptr, extent_bytes(v, kElementBytes)},
                        {"o", o.ptr, extent_bytes(o, kElementBytes)},
                        {"lse", p.lse, lse_bytes},
                        {"d_o", d_o.ptr, extent_bytes(d_o, kElementBytes)},
                        {"alibi_slopes", p.alibi_slopes, p.alibi_slopes ? slopes_bytes(p) : u128(0)},
                        {"sinks", p.sinks, p.sinks ? sinks_bytes : u128(0)},
                        {"dq", dq.ptr, extent_bytes(dq, kElementBytes)},
                        {"dk", dk.ptr, extent_bytes(dk, kElementBytes)},
                        {"dv", dv.ptr, extent_bytes(dv, kElementBytes)},
                        {"workspace", bp.workspace, u128(need)},
                        {"dsinks", bp.dsinks, bp.dsinks ? sinks_bytes : u128(0)}};
  constexpr int kFirstOutput = 8;  // dq, dk, dv, the workspace and dsinks are written
  for (int i = kFirstOutput; i < int(std::size(spans)); ++i)
    for (int j = 0; j < int(std::size(spans)); ++j)
      if (j != i && (j < kFirstOutput || j > i) && overlaps(spans[i].ptr, spans[i].bytes, spans[j].ptr, spans[j].bytes))
        return fail(std::string(spans[i].name) + " overlaps " + spans[j].name +
                    ": the backward's outputs and workspace must be separate buffers");
  return check_device(caps);
}

}  // namespace fa
