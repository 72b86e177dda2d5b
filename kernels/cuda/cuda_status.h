// Host-side helpers that turn CUDA runtime and cuBLAS results into absl::Status. Host .cc code
// only: the .cu files return plain cudaError_t and never see Abseil.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string_view>

#include "absl/status/status.h"

namespace shardline::kernels::cuda {

// OK for cudaSuccess; otherwise "<what>: <cudaGetErrorName>: <cudaGetErrorString>" with a code
// chosen by what the caller should do: ResourceExhausted for out-of-memory, FailedPrecondition
// when there is no usable device or driver, Internal for the rest (a kernel fault, a bad launch).
// Clears the runtime's sticky last-error slot for non-sticky errors so one failure is not reported
// again by the next unrelated call.
absl::Status CudaStatus(cudaError_t error, std::string_view what);

// The same for cuBLAS: ResourceExhausted for CUBLAS_STATUS_ALLOC_FAILED, InvalidArgument for
// CUBLAS_STATUS_INVALID_VALUE, Unimplemented for NOT_SUPPORTED, Internal otherwise.
absl::Status CublasStatus(cublasStatus_t status, std::string_view what);

// Makes `device` the calling thread's current device for the guard's lifetime and restores the
// previous one after. Cheap when it already is current (no cudaSetDevice call).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  // Whether switching succeeded; when false the current device is unchanged.
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  absl::Status status_;
};

}  // namespace shardline::kernels::cuda
