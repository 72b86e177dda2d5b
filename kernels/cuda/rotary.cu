// Rotary position embedding in the rotate_half layout, in place: the CUDA twin of
// kernels/cpu/rotary.h (the same pairs, angles in float as position·inv_freq, cos and sin in
// float here). One thread per (row, head, pair).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace shardline::kernels::cuda {
namespace {

using detail::GridFor;
using detail::kBlockThreads;

__global__ void RotaryKernel(float* x, int64_t row_stride, int N, int T, int H, int HS,
                             const int32_t* positions, const float* inv_freq, float sign) {
  const int half = HS / 2;
  const int64_t total = int64_t{N} * H * half;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(t % half);
    const int64_t nh = t / half;
    const int h = static_cast<int>(nh % H);
    const int n = static_cast<int>(nh / H);
    const float position = static_cast<float>(positions != nullptr ? positions[n] : n % T);
    float sin_a, cos_a;
    sincosf(position * inv_freq[i], &sin_a, &cos_a);
    sin_a *= sign;
    float* lo = x + int64_t{n} * row_stride + int64_t{h} * HS;
    const float a = lo[i], b = lo[i + half];
    lo[i] = a * cos_a - b * sin_a;
    lo[i + half] = b * cos_a + a * sin_a;
  }
}

}  // namespace

namespace launch {

cudaError_t Rotary(float* x, int64_t row_stride, int N, int T, int H, int HS,
                   const int32_t* positions, const float* inv_freq, bool backward,
                   cudaStream_t stream) {
  const int64_t total = int64_t{N} * H * (HS / 2);
  if (total == 0) return cudaSuccess;
  RotaryKernel<<<GridFor(total), kBlockThreads, 0, stream>>>(x, row_stride, N, T, H, HS, positions,
                                                             inv_freq, backward ? -1.0f : 1.0f);
  return detail::LaunchResult();
}

}  // namespace launch
}  // namespace shardline::kernels::cuda
