// Row softmax: one warp per row (rows are the vocabulary or a head's keys, a few hundred to tens
// of thousands of columns, so a warp keeps every lane busy and needs no shared memory).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace shardline::kernels::cuda {
namespace {

using detail::kWarpSize;

constexpr int kRowsPerBlock = detail::kBlockThreads / kWarpSize;

__global__ void SoftmaxForwardKernel(float* out, const float* inp, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (n >= N) return;  // whole warps leave together, so the shuffles below stay full
  const float* x = inp + int64_t{n} * C;
  float* y = out + int64_t{n} * C;
  float max = -INFINITY;
  for (int c = lane; c < C; c += kWarpSize) max = fmaxf(max, x[c]);
  max = detail::WarpMax(max);
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float e = expf(x[c] - max);
    y[c] = e;
    sum += e;
  }
  const float inv = 1.0f / detail::WarpSum(sum);
  // Each lane rescales exactly the elements it wrote: no other lane's writes need to be visible.
  for (int c = lane; c < C; c += kWarpSize) y[c] *= inv;
}

__global__ void SoftmaxBackwardKernel(float* dinp, const float* dout, const float* out, int N,
                                      int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (n >= N) return;
  const float* dy = dout + int64_t{n} * C;
  const float* y = out + int64_t{n} * C;
  float* dx = dinp + int64_t{n} * C;
  float dot = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) dot += dy[c] * y[c];
  dot = detail::WarpSum(dot);
  for (int c = lane; c < C; c += kWarpSize) dx[c] += y[c] * (dy[c] - dot);
}

unsigned RowBlocks(int N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

namespace launch {

cudaError_t SoftmaxForward(float* out, const float* inp, int N, int C, cudaStream_t stream) {
  if (N == 0 || C == 0) return cudaSuccess;
  SoftmaxForwardKernel<<<RowBlocks(N), detail::kBlockThreads, 0, stream>>>(out, inp, N, C);
  return detail::LaunchResult();
}

cudaError_t SoftmaxBackward(float* dinp, const float* dout, const float* out, int N, int C,
                            cudaStream_t stream) {
  if (N == 0 || C == 0) return cudaSuccess;
  SoftmaxBackwardKernel<<<RowBlocks(N), detail::kBlockThreads, 0, stream>>>(dinp, dout, out, N, C);
  return detail::LaunchResult();
}

}  // namespace launch
}  // namespace shardline::kernels::cuda
