// Pointwise kernels, the bias add and its column sum, and the f32 <-> bf16 casts.
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace shardline::kernels::cuda {
namespace {

using detail::GridFor;
using detail::kBlockThreads;

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi), as the CPU twin
constexpr float kGeluCubic = 0.044715f;

__global__ void BiasBroadcastKernel(float* out, const float* bias, int64_t total, int C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = bias[i % C];
  }
}

__global__ void BiasAddKernel(float* out, const float* bias, int64_t total, int C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] += bias[i % C];
  }
}

// Block (32, kRowGroups): threadIdx.x picks a column of this block's 32, threadIdx.y a row phase.
// Each thread sums rows y, y+kRowGroups, ... of its column (consecutive x read consecutive floats,
// so every row step is one 128-byte transaction per warp), then the kRowGroups partials are added
// in a fixed order. No atomics: the result does not depend on scheduling.
constexpr int kRowGroups = 16;

__global__ void ColumnSumKernel(float* dst, const float* src, int N, int C) {
  __shared__ float partial[kRowGroups][detail::kWarpSize + 1];
  const int c = blockIdx.x * detail::kWarpSize + threadIdx.x;
  float sum = 0.0f;
  if (c < C) {
    for (int n = threadIdx.y; n < N; n += kRowGroups) sum += src[int64_t{n} * C + c];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) total += partial[g][threadIdx.x];
    dst[c] += total;
  }
}

__global__ void GeluForwardKernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] += (0.5f * (1.0f + th) + 0.5f * x * sech2 * du) * dout[i];
  }
}

// SwiGLU: out = silu(gate)·up, as kernels/cpu/elementwise.h.
__global__ void SwiGluForwardKernel(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = gate[i];
    out[i] = x / (1.0f + expf(-x)) * up[i];
  }
}

__global__ void SwiGluBackwardKernel(float* dgate, float* dup, const float* gate, const float* up,
                                     const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = gate[i];
    const float s = 1.0f / (1.0f + expf(-x));
    if (dgate != nullptr) dgate[i] += dout[i] * up[i] * s * (1.0f + x * (1.0f - s));
    if (dup != nullptr) dup[i] += dout[i] * x * s;
  }
}

__global__ void FillKernel(float* out, float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = value;
  }
}

__global__ void AddKernel(float* out, const float* inp1, const float* inp2, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = inp1[i] + inp2[i];
  }
}

__global__ void AccumulateKernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] += src[i];
  }
}

__global__ void ScaleKernel(float* data, float scale, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    data[i] *= scale;
  }
}

__global__ void FloatToBFloat16Kernel(__nv_bfloat16* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);  // nearest-even, as kernels/half.h on the host
  }
}

__global__ void BFloat16ToFloatKernel(float* out, const __nv_bfloat16* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __bfloat162float(in[i]);
  }
}

}  // namespace

namespace launch {

cudaError_t BiasBroadcast(float* out, const float* bias, int N, int C, cudaStream_t stream) {
  const int64_t total = int64_t{N} * C;
  if (total == 0) return cudaSuccess;
  BiasBroadcastKernel<<<GridFor(total), kBlockThreads, 0, stream>>>(out, bias, total, C);
  return detail::LaunchResult();
}

cudaError_t BiasAddForward(float* out, const float* bias, int N, int C, cudaStream_t stream) {
  const int64_t total = int64_t{N} * C;
  if (total == 0) return cudaSuccess;
  BiasAddKernel<<<GridFor(total), kBlockThreads, 0, stream>>>(out, bias, total, C);
  return detail::LaunchResult();
}

cudaError_t ColumnSumAccumulate(float* dst, const float* src, int N, int C, cudaStream_t stream) {
  if (C == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((C + detail::kWarpSize - 1) / detail::kWarpSize);
  ColumnSumKernel<<<blocks, dim3(detail::kWarpSize, kRowGroups), 0, stream>>>(dst, src, N, C);
  return detail::LaunchResult();
}

cudaError_t GeluForward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluForwardKernel<<<GridFor(n), kBlockThreads, 0, stream>>>(out, inp, n);
  return detail::LaunchResult();
}

cudaError_t GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluBackwardKernel<<<GridFor(n), kBlockThreads, 0, stream>>>(dinp, inp, dout, n);
  return detail::LaunchResult();
}

cudaError_t SwiGluForward(float* out, const float* gate, const float* up, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SwiGluForwardKernel<<<GridFor(n), kBlockThreads, 0, stream>>>(out, gate, up, n);
  return detail::LaunchResult();
}

cudaError_t SwiGluBackward(float* dgate, float* dup, const float* gate, const float* up,
                           const float* dout, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SwiGluBackwardKernel<<<GridFor(n), kBlockThreads, 0, stream>>>(dgate, dup, gate, up, dout, n);
  return detail::LaunchResult();
}

cudaError_t Add(float* out, const float* inp1, const float* inp2, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<GridFor(n), kBlockThreads, 0, stream>>>(out, inp1, inp2, n);
  return detail::LaunchResult();
}

cudaError_t AccumulateInto(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AccumulateKernel<<<GridFor(n), kBlockThreads, 0, stream>>>(dst, src, n);
  return detail::LaunchResult();
}

cudaError_t Fill(float* out, float value, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<GridFor(n), kBlockThreads, 0, stream>>>(out, value, n);
  return detail::LaunchResult();
}

cudaError_t Scale(float* data, float scale, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<GridFor(n), kBlockThreads, 0, stream>>>(data, scale, n);
  return detail::LaunchResult();
}

cudaError_t FloatToBFloat16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FloatToBFloat16Kernel<<<GridFor(n), kBlockThreads, 0, stream>>>(
      reinterpret_cast<__nv_bfloat16*>(out), in, n);
  return detail::LaunchResult();
}

cudaError_t BFloat16ToFloat(float* out, const uint16_t* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  BFloat16ToFloatKernel<<<GridFor(n), kBlockThreads, 0, stream>>>(
      out, reinterpret_cast<const __nv_bfloat16*>(in), n);
  return detail::LaunchResult();
}

}  // namespace launch
}  // namespace shardline::kernels::cuda
