# Step 30's kernel on a batch packed end to end (Part V): each sequence's queries and keys found from
# its offsets (cu_seqlens), its own lengths and causal diagonal. The shared suite runs it unpacked;
# steps 27-30's tests run it split, packed, ragged and paged; its own tests pack sequences of
# different query and key lengths, some with none, against the reference sequence by sequence.
fa_step(31 varlen BASE 30
  STATIC REQUIRE HMMA LDSM LDGSTS KERNEL attention_kernel
  TESTS_FROM 06 07 08 27 28 29 30)
