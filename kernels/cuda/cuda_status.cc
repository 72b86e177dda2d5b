#include "kernels/cuda/cuda_status.h"

#include <string>

#include "kernels/cuda/cublas_loader.h"

namespace shardline::kernels::cuda {

absl::Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  // cudaGetLastError resets the slot unless the error is sticky (the context is then unusable and
  // every later call reports it anyway).
  cudaGetLastError();
  std::string message =
      std::string(what) + ": " + cudaGetErrorName(error) + ": " + cudaGetErrorString(error);
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasStatus(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  // cuBLAS names its statuses only once loaded (a status normally comes from a loaded cuBLAS).
  absl::StatusOr<const CublasApi*> api = Cublas();
  std::string message = std::string(what) + ": ";
  if (api.ok()) {
    message += std::string((*api)->status_name(status)) + ": " + (*api)->status_string(status);
  } else {
    message += "cublasStatus_t " + std::to_string(static_cast<int>(status));
  }
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnimplementedError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

DeviceGuard::DeviceGuard(int device) {
  status_ = CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice");
  if (!status_.ok() || previous_ == device) return;
  status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  switched_ = status_.ok();
}

DeviceGuard::~DeviceGuard() {
  if (switched_) cudaSetDevice(previous_);
}

}  // namespace shardline::kernels::cuda
