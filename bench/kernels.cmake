# Kernel benchmarks (not part of ctest): our CPU GEMM path against OpenBLAS called directly.
add_executable(gemm_bench ${CMAKE_CURRENT_LIST_DIR}/gemm_bench.cc)
target_link_libraries(gemm_bench PRIVATE shardline_kernels benchmark::benchmark)
# The products of a decode step (kernels/cpu/skinny_matmul.h) against sgemm, weights streamed.
add_executable(skinny_matmul_bench ${CMAKE_CURRENT_LIST_DIR}/skinny_matmul_bench.cc)
find_package(OpenMP REQUIRED)
target_link_libraries(skinny_matmul_bench PRIVATE shardline_kernels OpenMP::OpenMP_CXX)
