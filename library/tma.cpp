// Tensor maps for the tensor memory accelerator (library/tma.h).
#include "library/tma.h"

#include <cuda_runtime.h>

#include <mutex>
#include <string>

namespace fa {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, looked up once (nullptr if the driver has none).
EncodeTiled encode_tiled() {
  static EncodeTiled fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    // By version from CUDA 12.5 (the unversioned lookup is gone in CUDA 13); before, the one lookup
    // there is, which gives the driver's default version of the function (12.0's signature).
#if CUDART_VERSION >= 12050
    const cudaError_t rc =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t rc = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
    if (rc == cudaSuccess && found == cudaDriverEntryPointSuccess) fn = reinterpret_cast<EncodeTiled>(p);
    cudaGetLastError();  // leave no sticky error behind
  });
  return fn;
}

}  // namespace

Status make_tile_map(CUtensorMap* map, const char* what, const void* base, int64_t batch, int64_t heads, int64_t seqlen,
                     int64_t head_dim, const Strides& strides, int box_rows, DType dtype) {
  // Innermost first: (D, N, H, B). Strides in bytes for dims 1..3; a dimension of size 1 is
  // never stepped along, so any legal stride does (16, the smallest, stands in for its own).
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(seqlen), cuuint64_t(heads), cuuint64_t(batch)};
  const int64_t elem_strides[3] = {strides.seq, strides.head, strides.batch};
  // A broadcast (stride 0 along a dimension longer than 1) is refused here, before the driver
  // sees it: some drivers encode it, but no test shows the copy engine reading it right.
  const char* axes[3] = {"sequence", "head", "batch"};
  for (int i = 0; i < 3; ++i)
    if (dims[i + 1] > 1 && elem_strides[i] == 0)
      return Status::Unsupported(std::string("TMA cannot describe ") + what + ": its " + axes[i] +
                                 " stride is 0 (a broadcast); the TMA steps need a separate copy per " + axes[i] +
                                 " entry");
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr)
    return Status::Unsupported("the CUDA driver offers no cuTensorMapEncodeTiled (TMA needs driver >= 12.0)");
  cuuint64_t byte_strides[3];
  for (int i = 0; i < 3; ++i) byte_strides[i] = dims[i + 1] == 1 ? 16 : cuuint64_t(elem_strides[i]) * 2;
  const cuuint32_t box[4] = {cuuint32_t(kTmaBoxCols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  // The copy engine moves bytes and converts nothing: both types are 2 bytes an element, so strides,
  // boxes and the zeros past N are the same. The map names the type all the same, as it is.
  const CUtensorMapDataType type =
      dtype == DType::fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r =
      encode(map, type, 4, const_cast<void*>(base), dims, byte_strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::Unsupported(
        std::string("TMA cannot describe ") + what + " (sizes B=" + std::to_string(batch) +
        " H=" + std::to_string(heads) + " N=" + std::to_string(seqlen) + " D=" + std::to_string(head_dim) +
        ", element strides batch=" + std::to_string(strides.batch) + " head=" + std::to_string(strides.head) +
        " seq=" + std::to_string(strides.seq) + "; error " + std::to_string(int(r)) +
        "): strides must be multiples of 8 elements below 2^39");
  return Status::Ok();
}

Status make_accum_map(CUtensorMap* map, const float* base, int64_t planes, int64_t seqlen, int64_t head_dim,
                      int box_rows) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr)
    return Status::Unsupported("the CUDA driver offers no cuTensorMapEncodeTiled (TMA needs driver >= 12.0)");
  const cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(seqlen), cuuint64_t(planes)};
  const cuuint64_t byte_strides[2] = {cuuint64_t(head_dim) * 4, cuuint64_t(seqlen * head_dim) * 4};
  const cuuint32_t box[3] = {cuuint32_t(kTmaAccumBoxCols), cuuint32_t(box_rows), 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(base), dims, byte_strides, box,
                            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::Unsupported("TMA cannot describe the dQ accumulator (B·H_q=" + std::to_string(planes) +
                               " N=" + std::to_string(seqlen) + " D=" + std::to_string(head_dim) + "; error " +
                               std::to_string(int(r)) + ")");
  return Status::Ok();
}

Status make_qkv_tile_maps(QkvTileMaps* maps, const AttentionParams& p, int block_m, int block_n) {
  // Packed sequences (varlen): one batch entry of total_q (total_kv) rows; the kernel steps to a
  // sequence by its first row.
  const bool packed = p.cu_seqlens_q != nullptr;
  const int64_t batch = packed ? 1 : p.batch;
  const int64_t rows_q = packed ? p.total_q : p.seqlen_q, rows_kv = packed ? p.total_kv : p.seqlen_kv;
  if (Status st = make_tile_map(&maps->q, "q", p.q, batch, p.heads_q, rows_q, p.head_dim, p.q_stride, block_m, p.dtype);
      !st.ok())
    return st;
  if (Status st =
          make_tile_map(&maps->k, "k", p.k, batch, p.heads_kv, rows_kv, p.head_dim, p.k_stride, block_n, p.dtype);
      !st.ok())
    return st;
  return make_tile_map(&maps->v, "v", p.v, batch, p.heads_kv, rows_kv, p.head_dim, p.v_stride, block_n, p.dtype);
}

}  // namespace fa
