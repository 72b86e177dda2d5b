# The placement planner (not part of ctest): planning time for a 16,384-device cluster and a 1T
# GPT, and the table of plans for dense GPTs from 1B to 1T on A100-80GB and H100 clusters
# (bench/planner_bench.cc).
add_executable(planner_bench ${CMAKE_CURRENT_LIST_DIR}/planner_bench.cc)
target_link_libraries(planner_bench PRIVATE shardline_placement)

# The actors' layer-rate calibration at more shapes than it measures (bench/layer_rate_bench.cc).
add_executable(layer_rate_bench ${CMAKE_CURRENT_LIST_DIR}/layer_rate_bench.cc)
target_link_libraries(layer_rate_bench PRIVATE shardline_worker OpenMP::OpenMP_CXX)
