// Token and position embeddings and their backward passes.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace shardline::kernels::cuda {
namespace {

using detail::GridFor;
using detail::kBlockThreads;

// One thread per output element: consecutive threads copy consecutive floats of one row.
__global__ void TokenEmbeddingForwardKernel(float* out, const int32_t* tokens, const float* wte,
                                            int64_t total, int C, int v0, int v1) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / C;
    const int c = static_cast<int>(i % C);
    const int32_t token = tokens[n];
    out[i] = token >= v0 && token < v1 ? wte[int64_t{token - v0} * C + c] : 0.0f;
  }
}

// Scatter-add with atomicAdd: a token repeated in the batch adds into the same row from several
// threads. The order of those additions is not fixed, so dwte may differ from the CPU's in the last
// bits (the CPU twin splits columns across threads instead; on a GPU that leaves too little work).
__global__ void TokenEmbeddingBackwardKernel(float* dwte, const float* dout, const int32_t* tokens,
                                             int64_t total, int C, int v0, int v1) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / C;
    const int c = static_cast<int>(i % C);
    const int32_t token = tokens[n];
    if (token >= v0 && token < v1) atomicAdd(&dwte[int64_t{token - v0} * C + c], dout[i]);
  }
}

__global__ void PositionEmbeddingForwardKernel(float* out, const float* wpe, int64_t total, int T,
                                               int C) {
  const int64_t tc = int64_t{T} * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] += wpe[i % tc];  // i = (b·T + t)·C + c, and (t·C + c) = i mod T·C
  }
}

// Each row at its own position (an inference step's tokens of several sequences).
__global__ void PositionEmbeddingAtKernel(float* out, const float* wpe, const int32_t* positions,
                                          int64_t total, int C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / C;
    out[i] += wpe[int64_t{positions[n]} * C + i % C];
  }
}

// One thread per (t, c), summing over the batch in order: deterministic, as the CPU twin.
__global__ void PositionEmbeddingBackwardKernel(float* dwpe, const float* dout, int B, int T,
                                                int C) {
  const int64_t tc = int64_t{T} * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < tc;
       i += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f;
    for (int b = 0; b < B; ++b) sum += dout[b * tc + i];
    dwpe[i] += sum;
  }
}

}  // namespace

namespace launch {

cudaError_t TokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int N, int C,
                                  int v0, int v1, cudaStream_t stream) {
  const int64_t total = int64_t{N} * C;
  if (total == 0) return cudaSuccess;
  TokenEmbeddingForwardKernel<<<GridFor(total), kBlockThreads, 0, stream>>>(out, tokens, wte, total,
                                                                            C, v0, v1);
  return detail::LaunchResult();
}

cudaError_t TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int N,
                                   int C, int v0, int v1, cudaStream_t stream) {
  const int64_t total = int64_t{N} * C;
  if (total == 0) return cudaSuccess;
  TokenEmbeddingBackwardKernel<<<GridFor(total), kBlockThreads, 0, stream>>>(dwte, dout, tokens,
                                                                             total, C, v0, v1);
  return detail::LaunchResult();
}

cudaError_t PositionEmbeddingForward(float* out, const float* wpe, int B, int T, int C,
                                     cudaStream_t stream) {
  const int64_t total = int64_t{B} * T * C;
  if (total == 0) return cudaSuccess;
  PositionEmbeddingForwardKernel<<<GridFor(total), kBlockThreads, 0, stream>>>(out, wpe, total, T,
                                                                               C);
  return detail::LaunchResult();
}

cudaError_t PositionEmbeddingAt(float* out, const float* wpe, const int32_t* positions, int N,
                                int C, cudaStream_t stream) {
  const int64_t total = int64_t{N} * C;
  if (total == 0) return cudaSuccess;
  PositionEmbeddingAtKernel<<<GridFor(total), kBlockThreads, 0, stream>>>(out, wpe, positions,
                                                                          total, C);
  return detail::LaunchResult();
}

cudaError_t PositionEmbeddingBackward(float* dwpe, const float* dout, int B, int T, int C,
                                      cudaStream_t stream) {
  const int64_t tc = int64_t{T} * C;
  if (tc == 0) return cudaSuccess;
  PositionEmbeddingBackwardKernel<<<GridFor(tc), kBlockThreads, 0, stream>>>(dwpe, dout, B, T, C);
  return detail::LaunchResult();
}

}  // namespace launch
}  // namespace shardline::kernels::cuda
