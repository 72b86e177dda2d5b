# SLURM for real (slurm-wlm, munge): tests/integration/slurm_cluster_test.sh says what it runs.
add_test(NAME slurm_cluster_test
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/slurm_cluster_test.sh
          $<TARGET_FILE:shardline> ${CMAKE_SOURCE_DIR})
set_tests_properties(slurm_cluster_test PROPERTIES
  TIMEOUT 900 SKIP_RETURN_CODE 77 LABELS "integration;slurm" RUN_SERIAL TRUE)
