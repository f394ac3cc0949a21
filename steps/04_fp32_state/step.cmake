# Tensor cores: HMMA (mma.sync) and LDSM (ldmatrix) in the attention kernels, no local memory
# anywhere, and no LDGSTS (cp.async) yet: the copies become asynchronous in step 08. 64 HMMA per
# kernel is one 64-key tile of the smallest config at D = 64 with BOTH matmuls on tensor cores
# (32 for Q·Kᵀ + 32 for P·V): a kernel that does P·V on CUDA cores (seed bug #6) has only half.
# Cases: ragged cross-attention, and N = 8192 at D = 128, where low-precision state would drift.
fa_step(04 fp32_state BASE 03
  STATIC REQUIRE HMMA LDSM FORBID LDGSTS MIN_COUNT HMMA:64 KERNEL attention_kernel
  CASES "ragged=--b 1 --h 3 --nq 1013 --nkv 1531 --d 64"
        "d128_long=--b 1 --h 2 --n 8192 --d 128")
