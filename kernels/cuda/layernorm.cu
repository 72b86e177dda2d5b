// LayerNorm and RMSNorm over the last dimension. Forward and the input gradient: one warp per row.
// Weight and bias gradients: a column reduction over rows with a fixed summation order (no
// atomics), so a backward pass is reproducible run to run.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace shardline::kernels::cuda {
namespace {

using detail::kWarpSize;

constexpr int kRowsPerBlock = detail::kBlockThreads / kWarpSize;
constexpr int kRowGroups = 16;  // row phases per column block in the dweight/dbias reduction

unsigned RowBlocks(int N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

__global__ void LayerNormForwardKernel(float* out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int N, int C,
                                       float eps) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (n >= N) return;
  const float* x = inp + int64_t{n} * C;
  // Two passes, as the CPU twin: E[x²]−E[x]² cancels badly when activations have a large mean.
  // The row is re-read from L1/L2, not DRAM, on the second and third pass.
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) sum += x[c];
  const float m = detail::WarpSum(sum) / static_cast<float>(C);
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = x[c] - m;
    sq += d * d;
  }
  const float var = detail::WarpSum(sq) / static_cast<float>(C);
  const float s = 1.0f / sqrtf(var + eps);
  float* y = out + int64_t{n} * C;
  for (int c = lane; c < C; c += kWarpSize) y[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

// dx = s·(g − mean(g) − norm·mean(g·norm)) with norm = (x − m)·s and g = weight·dy.
__global__ void LayerNormInputGradKernel(float* dinp, const float* dout, const float* inp,
                                         const float* weight, const float* mean, const float* rstd,
                                         int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (n >= N) return;
  const float* x = inp + int64_t{n} * C;
  const float* dy = dout + int64_t{n} * C;
  const float m = mean[n];
  const float s = rstd[n];
  float g_sum = 0.0f;
  float g_norm_sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float g = weight[c] * dy[c];
    g_sum += g;
    g_norm_sum += g * (x[c] - m) * s;
  }
  const float g_mean = detail::WarpSum(g_sum) / static_cast<float>(C);
  const float g_norm_mean = detail::WarpSum(g_norm_sum) / static_cast<float>(C);
  float* dx = dinp + int64_t{n} * C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float norm = (x[c] - m) * s;
    dx[c] += (weight[c] * dy[c] - g_mean - norm * g_norm_mean) * s;
  }
}

// Block (32, kRowGroups) per 32 columns, as ColumnSumKernel in elementwise.cu.
__global__ void LayerNormParamGradKernel(float* dweight, float* dbias, const float* dout,
                                         const float* inp, const float* mean, const float* rstd,
                                         int N, int C) {
  __shared__ float partial_w[kRowGroups][kWarpSize + 1];
  __shared__ float partial_b[kRowGroups][kWarpSize + 1];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  float w = 0.0f;
  float b = 0.0f;
  if (c < C) {
    for (int n = threadIdx.y; n < N; n += kRowGroups) {
      const float dy = dout[int64_t{n} * C + c];
      w += (inp[int64_t{n} * C + c] - mean[n]) * rstd[n] * dy;
      b += dy;
    }
  }
  partial_w[threadIdx.y][threadIdx.x] = w;
  partial_b[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total_w = 0.0f;
    float total_b = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) {
      total_w += partial_w[g][threadIdx.x];
      total_b += partial_b[g][threadIdx.x];
    }
    if (dweight != nullptr) dweight[c] += total_w;
    if (dbias != nullptr) dbias[c] += total_b;
  }
}

// RMSNorm: y = x·s·weight with s = 1/sqrt(mean(x²) + eps), as kernels/cpu/rmsnorm.h.
__global__ void RmsNormForwardKernel(float* out, float* rstd, const float* inp, const float* weight,
                                     int N, int C, float eps) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (n >= N) return;
  const float* x = inp + int64_t{n} * C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) sq += x[c] * x[c];
  const float s = 1.0f / sqrtf(detail::WarpSum(sq) / static_cast<float>(C) + eps);
  float* y = out + int64_t{n} * C;
  for (int c = lane; c < C; c += kWarpSize) y[c] = x[c] * s * weight[c];
  if (lane == 0) rstd[n] = s;
}

// dx = s·(g − norm·mean(g·norm)) with norm = x·s and g = weight·dy.
__global__ void RmsNormInputGradKernel(float* dinp, const float* dout, const float* inp,
                                       const float* weight, const float* rstd, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (n >= N) return;
  const float* x = inp + int64_t{n} * C;
  const float* dy = dout + int64_t{n} * C;
  const float s = rstd[n];
  float g_norm_sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) g_norm_sum += weight[c] * dy[c] * x[c] * s;
  const float g_norm_mean = detail::WarpSum(g_norm_sum) / static_cast<float>(C);
  float* dx = dinp + int64_t{n} * C;
  for (int c = lane; c < C; c += kWarpSize) {
    dx[c] += (weight[c] * dy[c] - x[c] * s * g_norm_mean) * s;
  }
}

// dweight += Σ_rows x·s·dy: block (32, kRowGroups) per 32 columns, as LayerNormParamGradKernel.
__global__ void RmsNormWeightGradKernel(float* dweight, const float* dout, const float* inp,
                                        const float* rstd, int N, int C) {
  __shared__ float partial[kRowGroups][kWarpSize + 1];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  float w = 0.0f;
  if (c < C) {
    for (int n = threadIdx.y; n < N; n += kRowGroups) {
      w += inp[int64_t{n} * C + c] * rstd[n] * dout[int64_t{n} * C + c];
    }
  }
  partial[threadIdx.y][threadIdx.x] = w;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) total += partial[g][threadIdx.x];
    dweight[c] += total;
  }
}

}  // namespace

namespace launch {

cudaError_t LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                             const float* weight, const float* bias, int N, int C, float eps,
                             cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  LayerNormForwardKernel<<<RowBlocks(N), detail::kBlockThreads, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, N, C, eps);
  return detail::LaunchResult();
}

cudaError_t LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, const float* mean,
                              const float* rstd, int N, int C, cudaStream_t stream) {
  if (N == 0 || C == 0) return cudaSuccess;
  if (dinp != nullptr) {
    LayerNormInputGradKernel<<<RowBlocks(N), detail::kBlockThreads, 0, stream>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    const cudaError_t error = detail::LaunchResult();
    if (error != cudaSuccess) return error;
  }
  if (dweight != nullptr || dbias != nullptr) {
    const unsigned blocks = static_cast<unsigned>((C + kWarpSize - 1) / kWarpSize);
    LayerNormParamGradKernel<<<blocks, dim3(kWarpSize, kRowGroups), 0, stream>>>(
        dweight, dbias, dout, inp, mean, rstd, N, C);
    return detail::LaunchResult();
  }
  return cudaSuccess;
}

cudaError_t RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N,
                           int C, float eps, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  RmsNormForwardKernel<<<RowBlocks(N), detail::kBlockThreads, 0, stream>>>(out, rstd, inp, weight,
                                                                           N, C, eps);
  return detail::LaunchResult();
}

cudaError_t RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                            const float* weight, const float* rstd, int N, int C,
                            cudaStream_t stream) {
  if (N == 0 || C == 0) return cudaSuccess;
  if (dinp != nullptr) {
    RmsNormInputGradKernel<<<RowBlocks(N), detail::kBlockThreads, 0, stream>>>(dinp, dout, inp,
                                                                               weight, rstd, N, C);
    const cudaError_t error = detail::LaunchResult();
    if (error != cudaSuccess) return error;
  }
  if (dweight != nullptr) {
    const unsigned blocks = static_cast<unsigned>((C + kWarpSize - 1) / kWarpSize);
    RmsNormWeightGradKernel<<<blocks, dim3(kWarpSize, kRowGroups), 0, stream>>>(dweight, dout, inp,
                                                                                rstd, N, C);
    return detail::LaunchResult();
  }
  return cudaSuccess;
}

}  // namespace launch
}  // namespace shardline::kernels::cuda
