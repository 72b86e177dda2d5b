// The pieces of (vocab-parallel) softmax cross-entropy; see kernels/cpu/cross_entropy.h for how
// they compose.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace shardline::kernels::cuda {
namespace {

using detail::GridFor;
using detail::kBlockThreads;
using detail::kWarpSize;

// (max, Σ exp(x − max)) pairs merged as in an online softmax. A side that has seen nothing has
// max −inf and sum 0; it must not produce exp(−inf − (−inf)) = NaN.
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum Merge(MaxSum a, MaxSum b) {
  if (a.max == -INFINITY) return b;
  if (b.max == -INFINITY) return a;
  const float m = fmaxf(a.max, b.max);
  return MaxSum{m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ MaxSum WarpMerge(MaxSum x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(detail::kFullMask, x.max, offset),
                 __shfl_xor_sync(detail::kFullMask, x.sum, offset)};
    x = Merge(x, other);
  }
  return x;
}

// One block per row: a vocabulary shard is thousands to tens of thousands of logits wide. Each
// thread keeps a running (max, sum) over its strided columns (one read of the row, not two), then
// the block merges them. With kFinish (the single-device case) the block goes on to the loss:
// `local_max` receives lse and `local_sumexp` the loss, as CrossEntropyLossFromStats would.
template <bool kFinish>
__global__ void LocalStatsKernel(float* local_max, float* local_sumexp, float* target_logit,
                                 const float* logits, const int32_t* targets, int Vs, int v0) {
  __shared__ MaxSum warp_results[kBlockThreads / kWarpSize];
  const int n = blockIdx.x;
  const float* row = logits + int64_t{n} * Vs;
  MaxSum acc{-INFINITY, 0.0f};
  for (int j = threadIdx.x; j < Vs; j += blockDim.x) {
    const float x = row[j];
    if (x > acc.max) {
      acc.sum = acc.sum * expf(acc.max - x) + 1.0f;  // exp(−inf) = 0 on the first element
      acc.max = x;
    } else {
      acc.sum += expf(x - acc.max);
    }
  }
  acc = WarpMerge(acc);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (lane == 0) warp_results[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum total = warp_results[0];
    for (int w = 1; w < kBlockThreads / kWarpSize; ++w) total = Merge(total, warp_results[w]);
    const int32_t target = targets[n];
    const int32_t local = target - v0;
    const float target_value = target >= 0 && local >= 0 && local < Vs ? row[local] : 0.0f;
    if constexpr (kFinish) {
      const float z = total.max + logf(total.sum);
      local_max[n] = z;
      local_sumexp[n] = target < 0 ? 0.0f : z - target_value;
    } else {
      local_max[n] = total.max;
      local_sumexp[n] = total.sum;
      target_logit[n] = target_value;
    }
  }
}

__global__ void RescaleSumExpKernel(float* sumexp, const float* local_max, const float* global_max,
                                    int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  // An empty shard (max −inf, sum 0) contributes nothing, not NaN.
  if (n < N && sumexp[n] != 0.0f) sumexp[n] *= expf(local_max[n] - global_max[n]);
}

__global__ void LossFromStatsKernel(float* losses, float* lse, const float* global_max,
                                    const float* global_sumexp, const float* target_logit,
                                    const int32_t* targets, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float z = global_max[n] + logf(global_sumexp[n]);
  lse[n] = z;
  losses[n] = targets[n] < 0 ? 0.0f : z - target_logit[n];
}

__global__ void BackwardShardKernel(float* dlogits, const float* logits, const float* lse,
                                    const int32_t* targets, const float* dlosses, int64_t total,
                                    int Vs, int v0) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / Vs;
    const int32_t target = targets[n];
    if (target < 0) continue;  // an ignored (padding) row has no gradient
    const int j = static_cast<int>(i % Vs);
    const float g = dlosses[n];
    float d = g * expf(logits[i] - lse[n]);
    if (target - v0 == j) d -= g;
    dlogits[i] += d;
  }
}

}  // namespace

namespace launch {

cudaError_t CrossEntropyLocalStats(float* local_max, float* local_sumexp, float* target_logit,
                                   const float* logits, const int32_t* targets, int N, int Vs,
                                   int v0, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  LocalStatsKernel<false><<<static_cast<unsigned>(N), kBlockThreads, 0, stream>>>(
      local_max, local_sumexp, target_logit, logits, targets, Vs, v0);
  return detail::LaunchResult();
}

cudaError_t CrossEntropyForward(float* losses, float* lse, const float* logits,
                                const int32_t* targets, int N, int V, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  LocalStatsKernel<true><<<static_cast<unsigned>(N), kBlockThreads, 0, stream>>>(
      lse, losses, nullptr, logits, targets, V, 0);
  return detail::LaunchResult();
}

cudaError_t CrossEntropyRescaleSumExp(float* sumexp, const float* local_max,
                                      const float* global_max, int N, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  RescaleSumExpKernel<<<GridFor(N), kBlockThreads, 0, stream>>>(sumexp, local_max, global_max, N);
  return detail::LaunchResult();
}

cudaError_t CrossEntropyLossFromStats(float* losses, float* lse, const float* global_max,
                                      const float* global_sumexp, const float* target_logit,
                                      const int32_t* targets, int N, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  LossFromStatsKernel<<<GridFor(N), kBlockThreads, 0, stream>>>(
      losses, lse, global_max, global_sumexp, target_logit, targets, N);
  return detail::LaunchResult();
}

cudaError_t CrossEntropyBackwardShard(float* dlogits, const float* logits, const float* lse,
                                      const int32_t* targets, const float* dlosses, int N, int Vs,
                                      int v0, cudaStream_t stream) {
  const int64_t total = int64_t{N} * Vs;
  if (total == 0) return cudaSuccess;
  BackwardShardKernel<<<GridFor(total), kBlockThreads, 0, stream>>>(dlogits, logits, lse, targets,
                                                                    dlosses, total, Vs, v0);
  return detail::LaunchResult();
}

}  // namespace launch
}  // namespace shardline::kernels::cuda
