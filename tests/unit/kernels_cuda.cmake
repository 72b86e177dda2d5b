# CUDA kernels (kernels/cuda/) against their CPU twins, and the CUDA caching allocator. Labelled
# `unit` and `gpu`: scripts/gpu-check.sh runs them with `ctest -L gpu` where a GPU is visible;
# elsewhere every test that needs one is reported as skipped, with cudaGetDeviceCount's reason.
if(SHARDLINE_CUDA)
  shardline_test(kernels_cuda_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_cuda_test.cc
    LIBS shardline_kernels LABELS unit TIMEOUT 300)
  # CMake 3.25's gtest_discover_tests splits a list-valued property into separate arguments
  # (`LABELS unit gpu` sets LABELS to `unit` only), so shardline_test cannot give a test two labels.
  # This ctest-time script, included after the discovered tests, labels each of them `unit;gpu`.
  set(kernels_cuda_tests_file "${CMAKE_CURRENT_BINARY_DIR}/kernels_cuda_test[1]_tests.cmake")
  file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/kernels_cuda_test_labels.cmake" CONTENT [==[
if(EXISTS "@kernels_cuda_tests_file@")
  file(STRINGS "@kernels_cuda_tests_file@" kernels_cuda_lines REGEX "^add_test")
  foreach(line IN LISTS kernels_cuda_lines)
    if(line MATCHES "^add_test\\(\\[=\\[(.*)\\]=\\]")
      set_tests_properties("${CMAKE_MATCH_1}" PROPERTIES LABELS "unit;gpu")
    endif()
  endforeach()
endif()
]==] @ONLY)
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES
    "${CMAKE_CURRENT_BINARY_DIR}/kernels_cuda_test_labels.cmake")
endif()
