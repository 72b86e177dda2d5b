// AdamW and the pieces of global-norm gradient clipping.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace shardline::kernels::cuda {
namespace {

using detail::kBlockThreads;
using detail::kWarpSize;

// Same arithmetic, in the same order, as the CPU twin, so the two agree to rounding of sqrtf.
__global__ void AdamWKernel(float* params, const float* grads, float* m, float* v, int64_t n,
                            launch::AdamWParams p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grads[i];
    const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * g;
    const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / p.correction1;
    const float v_hat = vi / p.correction2;
    params[i] -= p.learning_rate * (m_hat / (sqrtf(v_hat) + p.eps) + p.weight_decay * params[i]);
  }
}

// Σ x² in double per block, then one atomicAdd per block. The order of the block additions varies
// from run to run, which in double is far below anything that reaches the f32 clip factor.
__global__ void SumOfSquaresKernel(double* sum, const float* data, int64_t n) {
  __shared__ double warp_sums[kBlockThreads / kWarpSize];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double x = data[i];
    acc += x * x;
  }
  acc = detail::WarpSumDouble(acc);
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kBlockThreads / kWarpSize; ++w) total += warp_sums[w];
    atomicAdd(sum, total);
  }
}

__global__ void ClipKernel(float* data, int64_t n, const double* sum_sq, double max_norm) {
  const double norm = sqrt(*sum_sq);
  if (!isfinite(norm)) return;
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient >= 1.0) return;
  const float scale = static_cast<float>(coefficient);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    data[i] *= scale;
  }
}

// A reduction wants fewer blocks than a pointwise kernel: each block ends in an atomic.
unsigned ReductionGrid(int64_t n) {
  const int64_t blocks = (n + kBlockThreads - 1) / kBlockThreads;
  return static_cast<unsigned>(blocks < 1024 ? blocks : 1024);
}

}  // namespace

namespace launch {

cudaError_t AdamWUpdate(float* params, const float* grads, float* m, float* v, int64_t n,
                        const AdamWParams& p, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AdamWKernel<<<detail::GridFor(n), kBlockThreads, 0, stream>>>(params, grads, m, v, n, p);
  return detail::LaunchResult();
}

cudaError_t SumOfSquaresAccumulate(double* sum, const float* data, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SumOfSquaresKernel<<<ReductionGrid(n), kBlockThreads, 0, stream>>>(sum, data, n);
  return detail::LaunchResult();
}

cudaError_t ClipBySumOfSquares(float* data, int64_t n, const double* sum_sq, double max_norm,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ClipKernel<<<detail::GridFor(n), kBlockThreads, 0, stream>>>(data, n, sum_sq, max_norm);
  return detail::LaunchResult();
}

}  // namespace launch
}  // namespace shardline::kernels::cuda
