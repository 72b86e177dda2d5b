# One decode step of the serving engine's forward (model::PagedGptForward) on GPT-2 small: the
# steady figure under bench/serve_compare.py's end-to-end one. Not part of ctest.
find_package(OpenMP REQUIRED)
add_executable(decode_step_bench ${CMAKE_CURRENT_LIST_DIR}/decode_step_bench.cc)
target_link_libraries(decode_step_bench PRIVATE shardline_model shardline_kernels OpenMP::OpenMP_CXX)
