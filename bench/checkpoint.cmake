# Checkpoint saves: the training stall of an asynchronous save against a synchronous one, and the
# writer's bandwidth against dd's on the same disk (bench/checkpoint_bench.cc).
find_package(OpenMP REQUIRED)
add_executable(checkpoint_bench ${CMAKE_CURRENT_LIST_DIR}/checkpoint_bench.cc)
target_link_libraries(checkpoint_bench PRIVATE shardline_training shardline_forked_world
  OpenMP::OpenMP_CXX)

# Memory steps (checkpoint.memory_interval): the production loop's step time with them against
# without, on sharded_step_bench's GPT (bench/memory_tier_bench.cc).
add_executable(memory_tier_bench ${CMAKE_CURRENT_LIST_DIR}/memory_tier_bench.cc)
target_link_libraries(memory_tier_bench PRIVATE shardline_training shardline_forked_world
  OpenMP::OpenMP_CXX)
