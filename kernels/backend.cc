#include "kernels/backend.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_backend.h"
#if SHARDLINE_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace shardline::kernels {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  if (options.device == Device::kCpu) {
    if (options.bf16_gemms) {
      return absl::InvalidArgumentError(
          "precision bf16 needs device cuda: the CPU kernels compute in fp32");
    }
    if (options.cpu_allocator != nullptr) {
      return std::make_unique<cpu::CpuBackend>(*options.cpu_allocator);
    }
    return std::make_unique<cpu::CpuBackend>();
  }
  const std::string device = absl::StrCat("device cuda:", options.device_index);
#if SHARDLINE_WITH_CUDA
  auto backend = cuda::CudaBackend::Create(
      options.device_index,
      options.bf16_gemms ? cuda::GemmPrecision::kBFloat16 : cuda::GemmPrecision::kFloat32);
  if (!backend.ok()) return Annotate(backend.status(), device);
  return std::unique_ptr<Backend>(std::move(*backend));
#else
  return absl::FailedPreconditionError(
      device +
      ": this shardline was built without CUDA (nvcc was not found under /usr/local/cuda when it "
      "was configured, or -DSHARDLINE_CUDA=OFF)");
#endif
}

}  // namespace shardline::kernels
