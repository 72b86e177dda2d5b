// Internal to kernels/cuda/*.cu: launch geometry and warp/block reductions. Device code only,
// C++17, no Abseil or spdlog (nvcc compiles this).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardline::kernels::cuda::detail {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;
// 256 threads: enough warps per block to hide memory latency in the pointwise kernels, and a
// multiple of every warp-per-row kernel's rows per block.
inline constexpr int kBlockThreads = 256;

// Blocks for a grid-stride loop over n elements. Capped so that the grid fits any device (and the
// loop then covers the rest): 2^16 blocks of 256 threads keep every SM of an H100 busy many times.
inline unsigned GridFor(int64_t n, int threads = kBlockThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < (int64_t{1} << 16) ? blocks : (int64_t{1} << 16));
}

__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  }
  return x;
}

__device__ __forceinline__ double WarpSumDouble(double x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// Returns the last launch's configuration error (and clears it), or cudaSuccess. Errors inside the
// kernel surface later, at the next synchronising call.
inline cudaError_t LaunchResult() { return cudaGetLastError(); }

}  // namespace shardline::kernels::cuda::detail
