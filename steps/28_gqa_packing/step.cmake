# Step 27's split-KV kernel with a KV head's query heads packed into the rows of one Q tile (Part
# V). The shared suite (GQA and MQA cases included) runs it unsplit; step 27's split tests run it
# split; its own tests pack groups of 1 to 32 heads, tiles whose edge falls inside a query's group,
# causal both ways and the (B, N, H, D) layout, where a query's heads are adjacent in memory.
fa_step(28 gqa_packing BASE 27
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 08 27)
