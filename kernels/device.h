// Where a tensor's bytes live.
#pragma once

#include <cstdint>
#include <string_view>

namespace shardline::kernels {

// An actor drives exactly one device, so the kind is enough; which CUDA device is the process's
// current one (set once at actor start).
enum class Device : uint8_t { kCpu, kCuda };

inline std::string_view DeviceName(Device device) {
  return device == Device::kCpu ? "cpu" : "cuda";
}

}  // namespace shardline::kernels
