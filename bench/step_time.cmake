# The planner's predicted step time against the measured step of real local CPU train jobs, per
# layout, with the issue's 25% target (bench/step_time_prediction_bench.cc). Not part of ctest:
# it drives the LocalCluster fixture of tests/integration (added before bench/, and a library
# target is visible from any directory), which runs the built `shardline` binary.
add_executable(step_time_prediction_bench ${CMAKE_CURRENT_LIST_DIR}/step_time_prediction_bench.cc)
target_link_libraries(step_time_prediction_bench PRIVATE shardline_test_cluster
  shardline_monitoring_testing shardline_cli)
add_dependencies(step_time_prediction_bench shardline)
