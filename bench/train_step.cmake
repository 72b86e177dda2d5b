# One GPT training step (ZeroGrad + Forward + Backward + AdamWStep) in tokens/s; compared with
# PyTorch on the same model by bench/train_step_compare.py. Not part of ctest.
find_package(OpenMP REQUIRED)
add_executable(train_step_bench ${CMAKE_CURRENT_LIST_DIR}/train_step_bench.cc)
target_link_libraries(train_step_bench PRIVATE shardline_model shardline_kernels OpenMP::OpenMP_CXX)
# The same step on one CUDA device (the engine on the CUDA backend), with MFU; compared with PyTorch on the GPU by
# bench/train_step_compare.py --device cuda (scripts/gpu-check.sh runs that).
if(SHARDLINE_CUDA)
  add_executable(train_step_gpu_bench ${CMAKE_CURRENT_LIST_DIR}/train_step_gpu_bench.cc)
  target_link_libraries(train_step_gpu_bench PRIVATE shardline_model shardline_kernels)
endif()
