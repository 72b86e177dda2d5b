# CUDA kernels (kernels/cuda/) against their CPU twins, and the CUDA caching allocator. Labelled
# `gpu` (one label: gtest_discover_tests in CMake 3.25 splits a list of labels): scripts/gpu-check.sh
# runs them with `ctest -L gpu` where a GPU is visible; elsewhere every test that needs one is
# reported as skipped, with cudaGetDeviceCount's reason.
if(SHARDLINE_CUDA)
  shardline_test(kernels_cuda_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_cuda_test.cc
    LIBS shardline_kernels LABELS gpu TIMEOUT 300)
endif()
# The backend interface (kernels/backend.h): the CPU backend's own code, and every operation of the
# CUDA backend against the CPU backend (skipped, with the reason, without a GPU). Labelled `gpu`
# for scripts/gpu-check.sh; it runs in every ctest too (its CPU cases need no GPU).
shardline_test(kernels_backend_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_backend_test.cc
  LIBS shardline_kernels LABELS gpu TIMEOUT 120)
