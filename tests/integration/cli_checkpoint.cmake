# `shardline checkpoint inspect` and `shardline checkpoint export` on the checkpoint folder of a
# real `shardline train` run, through the built binary.
shardline_test(cli_checkpoint_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cli_checkpoint_test.cc
  LIBS shardline_test_cluster shardline_monitoring_testing shardline_training
  LABELS integration TIMEOUT 600)
add_dependencies(cli_checkpoint_test shardline)
