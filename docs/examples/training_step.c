/* One attention training step through the C interface (include/fa/c_api.h): the forward with its
 * LSE, then the backward with the workspace the caller allocates. bf16 tensors, contiguous
 * (B, H, N, D), causal, GQA 4/2. The library allocates nothing: everything below comes from the
 * caller (here cudaMalloc; a framework would hand its own allocator's memory), so the two calls can
 * be captured in a CUDA graph.
 *
 * Build (tests/cpu/capi/c_example.sh does exactly this):
 *   cc -std=c11 -I include -I $CUDA/include docs/examples/training_step.c -L build -lfa2_capi \
 *      -L $CUDA/lib64 -lcudart -o training_step
 * Exit 0 on success, 77 without a GPU, 1 on any error (with the library's message). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fa/c_api.h"

enum { B = 2, HQ = 4, HKV = 2, N = 1000, D = 64 };

static int check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return 0;
  fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return 1;
}

/* Contiguous (B, H, N, D) strides, in elements. */
static void set_strides(int64_t s[4], int64_t heads) {
  s[FA_AXIS_BATCH] = heads * N * D;
  s[FA_AXIS_HEAD] = (int64_t)N * D;
  s[FA_AXIS_SEQ] = D;
  s[FA_AXIS_DIM] = 1;
}

/* Fills n bf16 values with a small deterministic pattern (bf16 = the top 16 bits of an fp32). */
static int fill_bf16(void* dst, size_t n, unsigned seed) {
  static uint16_t host[B * HQ * N * D];
  for (size_t i = 0; i < n; ++i) {
    float x = (float)((i * 2654435761u + seed) % 2001) / 1000.0f - 1.0f;
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    host[i] = (uint16_t)(bits >> 16);
  }
  return check_cuda(cudaMemcpy(dst, host, n * sizeof(uint16_t), cudaMemcpyHostToDevice), "upload");
}

int main(void) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("training_step: no GPU, nothing to run\n");
    return 77;
  }
  const size_t q_elems = (size_t)B * HQ * N * D, kv_elems = (size_t)B * HKV * N * D, bf16 = 2;
  void *q, *k, *v, *o, *d_o, *dq, *dk, *dv, *workspace;
  float* lse;
  if (check_cuda(cudaMalloc(&q, q_elems * bf16), "q") || check_cuda(cudaMalloc(&k, kv_elems * bf16), "k") ||
      check_cuda(cudaMalloc(&v, kv_elems * bf16), "v") || check_cuda(cudaMalloc(&o, q_elems * bf16), "o") ||
      check_cuda(cudaMalloc((void**)&lse, (size_t)B * HQ * N * sizeof(float)), "lse") ||
      check_cuda(cudaMalloc(&d_o, q_elems * bf16), "d_o") || check_cuda(cudaMalloc(&dq, q_elems * bf16), "dq") ||
      check_cuda(cudaMalloc(&dk, kv_elems * bf16), "dk") || check_cuda(cudaMalloc(&dv, kv_elems * bf16), "dv"))
    return 1;
  if (fill_bf16(q, q_elems, 1) || fill_bf16(k, kv_elems, 2) || fill_bf16(v, kv_elems, 3) || fill_bf16(d_o, q_elems, 4))
    return 1;

  /* The forward: O and the LSE the backward needs. Zero-fill, then set what is used. */
  fa_attention_params p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse;
  p.batch = B, p.heads_q = HQ, p.heads_kv = HKV, p.seqlen_q = N, p.seqlen_kv = N, p.head_dim = D;
  set_strides(p.strides[FA_TENSOR_Q], HQ);
  set_strides(p.strides[FA_TENSOR_K], HKV);
  set_strides(p.strides[FA_TENSOR_V], HKV);
  set_strides(p.strides[FA_TENSOR_O], HQ);
  p.causal = 1;
  p.causal_align = FA_CAUSAL_BOTTOM_RIGHT;
  p.dtype = FA_DTYPE_BF16;
  char err[512];
  if (fa_forward(FA_STEP_AUTO, &p, NULL, err, sizeof err) != FA_OK) {
    fprintf(stderr, "fa_forward: %s\n", err);
    return 1;
  }

  /* The backward: how much scratch memory it needs for these sizes, then the call. */
  size_t bytes = 0;
  if (fa_backward_workspace_size(&p, &bytes, err, sizeof err) != FA_OK) {
    fprintf(stderr, "fa_backward_workspace_size: %s\n", err);
    return 1;
  }
  if (check_cuda(cudaMalloc(&workspace, bytes), "workspace")) return 1;
  fa_backward_params b;
  memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.fwd = p;
  b.d_o = d_o, b.dq = dq, b.dk = dk, b.dv = dv;
  set_strides(b.strides[FA_TENSOR_DO], HQ);
  set_strides(b.strides[FA_TENSOR_DQ], HQ);
  set_strides(b.strides[FA_TENSOR_DK], HKV);
  set_strides(b.strides[FA_TENSOR_DV], HKV);
  b.workspace = workspace, b.workspace_bytes = bytes;
  b.deterministic = 1; /* bitwise-identical gradients run to run; 0 is faster */
  if (fa_backward(FA_STEP_AUTO, &b, NULL, err, sizeof err) != FA_OK) {
    fprintf(stderr, "fa_backward: %s\n", err);
    return 1;
  }
  if (check_cuda(cudaDeviceSynchronize(), "backward")) return 1;
  printf("training_step: forward and backward ran, B=%d H=%d/%d N=%d D=%d, workspace %zu bytes\n", B, HQ, HKV, N, D,
         bytes);
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse);
  cudaFree(d_o), cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(workspace);
  return 0;
}
