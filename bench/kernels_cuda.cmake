# GPU kernel benchmarks (not part of ctest; scripts/gpu-check.sh runs every bench/gpu_* binary).
if(SHARDLINE_CUDA)
  add_executable(gpu_train_step_bench ${CMAKE_CURRENT_LIST_DIR}/gpu_train_step_bench.cc)
  target_link_libraries(gpu_train_step_bench PRIVATE shardline_kernels benchmark::benchmark)
endif()
