# Kernel benchmarks (not part of ctest): our CPU GEMM path against OpenBLAS called directly.
add_executable(gemm_bench ${CMAKE_CURRENT_LIST_DIR}/gemm_bench.cc)
target_link_libraries(gemm_bench PRIVATE shardline_kernels benchmark::benchmark)
