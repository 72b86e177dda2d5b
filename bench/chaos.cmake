# 100 seeded faults into one elastic job (bench/chaos_bench.cc): latencies per fault class. Drives
# the LocalCluster fixture and the chaos driver of tests/ (ctest runs a short one).
add_executable(chaos_bench ${CMAKE_CURRENT_LIST_DIR}/chaos_bench.cc
  ${CMAKE_SOURCE_DIR}/tests/support/chaos.cc ${CMAKE_SOURCE_DIR}/tests/support/net_namespaces.cc)
target_link_libraries(chaos_bench PRIVATE shardline_test_cluster shardline_monitoring_testing)
add_dependencies(chaos_bench shardline)
