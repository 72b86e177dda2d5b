#include "worker/agent/devices.h"

#include <unistd.h>

#include <charconv>

#ifdef SHARDLINE_WITH_NCCL
#include <cuda_runtime_api.h>
#endif

namespace shardline::agent {

absl::StatusOr<std::vector<LocalDevice>> CudaDevices() {
#ifdef SHARDLINE_WITH_NCCL
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(std::string("no usable CUDA device: ") +
                                         cudaGetErrorString(err));
  }
  if (count == 0) return absl::FailedPreconditionError("no usable CUDA device: none visible");
  std::vector<LocalDevice> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    devices.push_back({wire::DeviceKind::CUDA, i, prop.totalGlobalMem, prop.name});
  }
  return devices;
#else
  return absl::UnimplementedError("this build has no CUDA support");
#endif
}

absl::StatusOr<std::vector<LocalDevice>> DiscoverDevices(const std::string& spec) {
  const uint64_t host_memory =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  auto cpus = [&](int n) {
    std::vector<LocalDevice> devices;
    for (int i = 0; i < n; ++i) {
      devices.push_back({wire::DeviceKind::CPU, i, host_memory / static_cast<uint64_t>(n), "cpu"});
    }
    return devices;
  };
  if (spec == "auto") {
    auto gpus = CudaDevices();
    if (gpus.ok()) return gpus;
    return cpus(static_cast<int>(std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN))));
  }
  if (spec == "cuda") return CudaDevices();
  if (spec.rfind("cpu:", 0) == 0) {
    int n = 0;
    const char* begin = spec.data() + 4;
    const char* end = spec.data() + spec.size();
    auto [ptr, ec] = std::from_chars(begin, end, n);
    if (ec != std::errc() || ptr != end || n < 1 || n > 1024) {
      return absl::InvalidArgumentError("--devices '" + spec +
                                        "': the CPU device count must be an integer in 1..1024");
    }
    return cpus(n);
  }
  return absl::InvalidArgumentError("--devices '" + spec + "': use cpu:N, cuda or auto");
}

}  // namespace shardline::agent
