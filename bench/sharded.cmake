# Sharded execution: step time and its split for every (tp, pp, dp) that fits, and the pipeline
# bubble against 1F1B's ideal (bench/sharded_step_bench.cc).
find_package(OpenMP REQUIRED)
add_executable(sharded_step_bench ${CMAKE_CURRENT_LIST_DIR}/sharded_step_bench.cc)
target_link_libraries(sharded_step_bench PRIVATE shardline_forked_world shardline_model
  shardline_data OpenMP::OpenMP_CXX)
