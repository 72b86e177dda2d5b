# Multi-process tests: real coordinator, agents and actors of the built `shardline` binary.
add_library(shardline_test_cluster ${CMAKE_CURRENT_LIST_DIR}/local_cluster.cc)
target_link_libraries(shardline_test_cluster PUBLIC shardline_cli)
target_compile_definitions(shardline_test_cluster PRIVATE
  SHARDLINE_BINARY_PATH="$<TARGET_FILE:shardline>" SHARDLINE_SOURCE_PATH="${CMAKE_SOURCE_DIR}")

foreach(name cluster_comm_check_test cluster_fault_test cluster_bad_input_test up_test train_cli_test)
  shardline_test(${name}
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/${name}.cc
    LIBS shardline_test_cluster shardline_monitoring_testing shardline_comm
    LABELS integration TIMEOUT 600)
  add_dependencies(${name} shardline)
endforeach()
