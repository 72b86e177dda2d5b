# Unit tests for kernels/: tensors and allocators, and every CPU kernel against a double-precision
# reference and finite differences. The whole set runs in a few seconds on 2 cores.
shardline_test(kernels_tensor_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_tensor_test.cc
  LIBS shardline_kernels LABELS unit TIMEOUT 60)
shardline_test(kernels_ops_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_ops_test.cc
  LIBS shardline_kernels LABELS unit TIMEOUT 120)
shardline_test(kernels_attention_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_attention_test.cc
  LIBS shardline_kernels LABELS unit TIMEOUT 120)
shardline_test(kernels_paged_attention_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_paged_attention_test.cc
  LIBS shardline_kernels OpenMP::OpenMP_CXX LABELS unit TIMEOUT 120)
shardline_test(kernels_llama_ops_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_llama_ops_test.cc
  LIBS shardline_kernels LABELS unit TIMEOUT 60)
