# Tensor cores: HMMA (mma.sync) and LDSM (ldmatrix) in the attention kernels, no local memory
# anywhere, and no LDGSTS (cp.async) yet: the copies become asynchronous in step 08. Each kernel
# has at least the HMMA of one K/V tile with BOTH matmuls on tensor cores, 2·(D/16)·(BLOCK_N/8)
# per warp: 64 at D = 64 and 128 at D = 128 (BLOCK_N = 64). A kernel that does P·V on CUDA cores
# (seed bug #6) keeps only Q·Kᵀ's half, at either head dim.
# Cases: ragged cross-attention, and N = 8192 at D = 128, where low-precision state would drift.
fa_step(04 fp32_state BASE 03
  STATIC REQUIRE HMMA LDSM FORBID LDGSTS HMMA_PER_KV_TILE 64 KERNEL attention_kernel
  CASES "ragged=--b 1 --h 3 --nq 1013 --nkv 1531 --d 64"
        "d128_long=--b 1 --h 2 --n 8192 --d 128")
