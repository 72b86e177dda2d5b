# `shardline slurm`: the allocation's variables and scontrol's output, and the errors of the
# binary where an allocation cannot be used (the real cluster: tests/integration/slurm.cmake).
shardline_test(cli_slurm_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cli_slurm_test.cc
  LIBS shardline_cli shardline_common
  LABELS unit TIMEOUT 120)
add_dependencies(cli_slurm_test shardline)
