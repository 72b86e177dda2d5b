// What a node offers: its CPU devices as asked, or its CUDA devices through the CUDA runtime.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "protocol/shardline.capnp.h"

namespace shardline::agent {

struct LocalDevice {
  wire::DeviceKind kind = wire::DeviceKind::CPU;
  int index = 0;
  uint64_t memory_bytes = 0;
  std::string name;
};

// `spec` is "cpu:N" (N CPU devices sharing this host's memory), "cuda" (every visible GPU; an
// error when there is none) or "auto" (the GPUs when there are any, else one CPU device per core).
absl::StatusOr<std::vector<LocalDevice>> DiscoverDevices(const std::string& spec);

// Visible CUDA devices; FailedPrecondition with the CUDA runtime's reason when none can be used,
// Unimplemented when built without CUDA.
absl::StatusOr<std::vector<LocalDevice>> CudaDevices();

}  // namespace shardline::agent
