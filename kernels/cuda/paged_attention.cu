// Attention over a paged KV cache for inference (vLLM's PagedAttention): the CUDA twin of
// kernels/cpu/paged_attention.cc, same layouts and semantics (ops.h). Written for decode steps and
// prefill chunks of a continuously batched serving step: one thread block per (token, head), the
// token's keys read through its sequence's block table.
#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace shardline::kernels::cuda {
namespace {

using detail::GridFor;
using detail::kBlockThreads;
using detail::kWarpSize;

// Threads of one (token, head) block, and positions scored per pass: the scores of a pass live in
// shared memory, and the softmax is rescaled once per pass (online softmax), so any context length
// runs in fixed shared memory. Each thread owns up to kMaxDimsPerThread of the head's output
// channels (HS <= 4·128 = 512).
constexpr int kAttentionThreads = 128;
constexpr int kPositionsPerPass = 256;
constexpr int kMaxDimsPerThread = 4;

__device__ __forceinline__ int64_t SlotOf(const PagedAttentionBatch& batch, int seq, int pos) {
  const int32_t block =
      batch.block_tables[int64_t{seq} * batch.max_blocks_per_seq + pos / batch.block_size];
  return int64_t{block} * batch.block_size + pos % batch.block_size;
}

// One thread per (token, channel of the KVH·HS key/value row): consecutive threads write
// consecutive floats of a slot.
__global__ void PagedKvWriteKernel(float* k_cache, float* v_cache, const float* qkv,
                                   PagedAttentionBatch batch, int NH, int KVH, int HS) {
  const int A = KVH * HS;
  const int64_t row = int64_t{NH + 2 * KVH} * HS;  // of qkv: queries, keys, values
  const int64_t total = int64_t{batch.num_tokens} * A;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int n = static_cast<int>(i / A);
    const int e = static_cast<int>(i % A);
    const int64_t slot = SlotOf(batch, batch.token_seq[n], batch.positions[n]);
    const float* keys = qkv + n * row + int64_t{NH} * HS;
    k_cache[slot * A + e] = keys[e];
    v_cache[slot * A + e] = keys[A + e];
  }
}

// The block's maximum (op = max) or sum of `x`, given to every thread. `shared` holds one float
// per warp; the block synchronises.
template <bool kMax>
__device__ float BlockReduce(float x, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  x = kMax ? detail::WarpMax(x) : detail::WarpSum(x);
  __syncthreads();  // `shared` may still be read by the previous reduction
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : (kMax ? -FLT_MAX : 0.0f);
  return kMax ? detail::WarpMax(x) : detail::WarpSum(x);
}

// out[n, h] = softmax(q·kᵀ/√HS)·v over positions 0..pos of token n's sequence, the keys and values
// of head h / (NH/KVH). Per pass of up to
// kPositionsPerPass positions: the threads score positions (a whole dot product each), the block
// takes the pass's maximum, turns scores into weights against the running maximum, and each
// thread adds its channels' weighted values in position order (deterministic: no atomics).
__global__ void PagedAttentionKernel(float* out, const float* qkv, const float* k_cache,
                                     const float* v_cache, PagedAttentionBatch batch, int NH,
                                     int KVH, int HS, float scale) {
  __shared__ float q[kMaxDimsPerThread * kAttentionThreads];
  __shared__ float weights[kPositionsPerPass];
  __shared__ float reduce[kAttentionThreads / kWarpSize];
  const int n = blockIdx.x / NH, h = blockIdx.x % NH;
  const int A = KVH * HS;                                // a cache slot
  const int64_t kv_head = int64_t{h / (NH / KVH)} * HS;  // its key/value head within a slot
  const int seq = batch.token_seq[n], pos = batch.positions[n];
  const float* query = qkv + int64_t{n} * (NH + 2 * KVH) * HS + int64_t{h} * HS;
  for (int d = threadIdx.x; d < HS; d += blockDim.x) q[d] = query[d];
  __syncthreads();

  float running_max = -FLT_MAX, running_sum = 0.0f;
  float acc[kMaxDimsPerThread] = {};
  for (int first = 0; first <= pos; first += kPositionsPerPass) {
    const int count = min(kPositionsPerPass, pos + 1 - first);
    float pass_max = -FLT_MAX;
    for (int t = threadIdx.x; t < count; t += blockDim.x) {
      const float* key = k_cache + SlotOf(batch, seq, first + t) * A + kv_head;
      float dot = 0.0f;
      for (int d = 0; d < HS; ++d) dot += q[d] * key[d];
      weights[t] = dot * scale;
      pass_max = fmaxf(pass_max, weights[t]);
    }
    pass_max = BlockReduce<true>(pass_max, reduce);
    const float new_max = fmaxf(running_max, pass_max);
    float pass_sum = 0.0f;
    for (int t = threadIdx.x; t < count; t += blockDim.x) {
      weights[t] = __expf(weights[t] - new_max);
      pass_sum += weights[t];
    }
    pass_sum = BlockReduce<false>(pass_sum, reduce);  // also orders the weights' writes
    const float correction = __expf(running_max - new_max);
    running_sum = running_sum * correction + pass_sum;
    running_max = new_max;
    for (int k = 0; k < kMaxDimsPerThread; ++k) {
      const int d = threadIdx.x + k * blockDim.x;
      if (d >= HS) break;
      float sum = acc[k] * correction;
      for (int t = 0; t < count; ++t) {
        sum += weights[t] * v_cache[SlotOf(batch, seq, first + t) * A + kv_head + d];
      }
      acc[k] = sum;
    }
    __syncthreads();  // the weights are read before the next pass writes them
  }
  float* o = out + int64_t{n} * NH * HS + int64_t{h} * HS;
  for (int k = 0; k < kMaxDimsPerThread; ++k) {
    const int d = threadIdx.x + k * blockDim.x;
    if (d < HS) o[d] = acc[k] / running_sum;
  }
}

}  // namespace

namespace launch {

cudaError_t PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                         const PagedAttentionBatch& batch, int NH, int KVH, int HS,
                         cudaStream_t stream) {
  const int64_t total = int64_t{batch.num_tokens} * KVH * HS;
  if (total == 0) return cudaSuccess;
  if (KVH <= 0 || NH % KVH != 0) return cudaErrorInvalidValue;
  PagedKvWriteKernel<<<GridFor(total), kBlockThreads, 0, stream>>>(k_cache, v_cache, qkv, batch, NH,
                                                                   KVH, HS);
  return detail::LaunchResult();
}

cudaError_t PagedAttentionForward(float* out, const float* qkv, const float* k_cache,
                                  const float* v_cache, const PagedAttentionBatch& batch, int NH,
                                  int KVH, int HS, cudaStream_t stream) {
  if (batch.num_tokens == 0) return cudaSuccess;
  if (HS < 1 || HS > kMaxDimsPerThread * kAttentionThreads) return cudaErrorInvalidValue;
  if (KVH <= 0 || NH % KVH != 0) return cudaErrorInvalidValue;
  const int64_t blocks = int64_t{batch.num_tokens} * NH;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  PagedAttentionKernel<<<static_cast<unsigned>(blocks), kAttentionThreads, 0, stream>>>(
      out, qkv, k_cache, v_cache, batch, NH, KVH, HS, 1.0f / sqrtf(static_cast<float>(HS)));
  return detail::LaunchResult();
}

}  // namespace launch
}  // namespace shardline::kernels::cuda
