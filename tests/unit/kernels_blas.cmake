# The CPU BLAS (kernels/cpu/blas.h): which library Sgemm() loaded and what its sgemm computes,
# three times: as the build loads it (oneMKL when configure found it in SHARDLINE_MKL_DIR, and then
# the test insists on it, or the AMD choice), forced onto the fallback, the system OpenBLAS
# (SHARDLINE_BLAS=openblas), and forced onto oneDNN (SHARDLINE_BLAS=onednn, AMD's AVX-512 choice).
find_package(OpenMP REQUIRED)
shardline_test(kernels_blas_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kernels_blas_test.cc
  LIBS shardline_kernels OpenMP::OpenMP_CXX LABELS unit TIMEOUT 120)
if(EXISTS "${SHARDLINE_MKL_DIR}/lib/libmkl_rt.so.3" OR EXISTS "${SHARDLINE_MKL_DIR}/lib/libmkl_rt.so.2")
  target_compile_definitions(kernels_blas_test PRIVATE SHARDLINE_TEST_EXPECT_MKL=1)
endif()
gtest_discover_tests(kernels_blas_test TEST_SUFFIX .openblas DISCOVERY_TIMEOUT 60
  PROPERTIES TIMEOUT 120 LABELS unit
  ENVIRONMENT SHARDLINE_BLAS=openblas)
gtest_discover_tests(kernels_blas_test TEST_SUFFIX .onednn DISCOVERY_TIMEOUT 60
  PROPERTIES TIMEOUT 120 LABELS unit
  ENVIRONMENT SHARDLINE_BLAS=onednn)
