# Built for sm_90a alone (ARCH). Static rules: step 12's (UTMALDG, SYNCS, HGMMA; no LDGSTS, HMMA,
# LDSM; wgmmas not serialised), plus USETMAXREG: ptxas honoured setmaxnreg (when it ignores it,
# warning C7508, the instruction is absent and every warp keeps the entry cap). The no-spill
# rule matters most here: each role is compiled to its setmaxnreg budget. Cases: step 12's.
fa_step(15 intra_wg_overlap BASE 14 ARCH 90a
  STATIC REQUIRE HGMMA UTMALDG SYNCS USETMAXREG FORBID HMMA LDSM LDGSTS MAX_COUNT WARPGROUP.ARRIVE:4
         KERNEL attention_kernel
  CASES_FROM 12
  TESTS_FROM 06 07 08 10)
