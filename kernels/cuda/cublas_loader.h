// cuBLAS, loaded with dlopen on first use rather than linked (as kernels/cpu/blas.h does for
// OpenBLAS). Linked in, libcublas and libcublasLt (~700 MB of shared objects) are mapped and
// relocated by every process that links shardline_kernels: about 0.15 s and 200 MB of touched
// pages at each start of the coordinator, the agents and the CLI, which never multiply on a GPU.
// Loading it only when a Blas is created keeps them free of it.
#pragma once

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace shardline::kernels::cuda {

// The cuBLAS entry points the CUDA kernels use.
struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSgemm_v2) sgemm;
  // cublasGemmEx has a C++ overload (cudaDataType compute type), so its type is spelled out.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// Loads libcublas.so.<major of the headers> on the first call (thread-safe) and returns its entry
// points, or FailedPrecondition naming the libraries tried and dlerror() when it cannot.
absl::StatusOr<const CublasApi*> Cublas();

}  // namespace shardline::kernels::cuda
