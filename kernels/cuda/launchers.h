// Internal to kernels/cuda: the kernel launchers the .cu files define and ops.cc wraps.
//
// Plain C++17 types only (this header is read by nvcc and by g++): device pointers, sizes, a
// stream, and a cudaError_t that is the launch's configuration error (cudaSuccess when it was
// queued). bf16 arrays are uint16_t bit patterns here; ops.h gives them their BFloat16 type.
// Semantics, layouts and the accumulate-into-gradients convention are those of the CPU twin named
// in ops.h; zero-sized problems launch nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/paged_attention_batch.h"

namespace shardline::kernels::cuda::launch {

// elementwise.cu
cudaError_t BiasBroadcast(float* out, const float* bias, int N, int C, cudaStream_t stream);
cudaError_t BiasAddForward(float* out, const float* bias, int N, int C, cudaStream_t stream);
// dst (C) += Σ_n src[n,:], src (N,C); deterministic (fixed summation order).
cudaError_t ColumnSumAccumulate(float* dst, const float* src, int N, int C, cudaStream_t stream);
cudaError_t GeluForward(float* out, const float* inp, int64_t n, cudaStream_t stream);
cudaError_t GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                         cudaStream_t stream);
cudaError_t Add(float* out, const float* inp1, const float* inp2, int64_t n, cudaStream_t stream);
cudaError_t AccumulateInto(float* dst, const float* src, int64_t n, cudaStream_t stream);
cudaError_t Scale(float* data, float scale, int64_t n, cudaStream_t stream);
cudaError_t Fill(float* out, float value, int64_t n, cudaStream_t stream);
cudaError_t FloatToBFloat16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream);
cudaError_t BFloat16ToFloat(float* out, const uint16_t* in, int64_t n, cudaStream_t stream);

// softmax.cu
cudaError_t SoftmaxForward(float* out, const float* inp, int N, int C, cudaStream_t stream);
cudaError_t SoftmaxBackward(float* dinp, const float* dout, const float* out, int N, int C,
                            cudaStream_t stream);

// layernorm.cu
cudaError_t LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                             const float* weight, const float* bias, int N, int C, float eps,
                             cudaStream_t stream);
cudaError_t LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, const float* mean,
                              const float* rstd, int N, int C, cudaStream_t stream);

// layernorm.cu: RMSNorm (kernels/cpu/rmsnorm.h)
cudaError_t RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N,
                           int C, float eps, cudaStream_t stream);
cudaError_t RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                            const float* weight, const float* rstd, int N, int C,
                            cudaStream_t stream);
// elementwise.cu: SwiGLU (kernels/cpu/elementwise.h)
cudaError_t SwiGluForward(float* out, const float* gate, const float* up, int64_t n,
                          cudaStream_t stream);
cudaError_t SwiGluBackward(float* dgate, float* dup, const float* gate, const float* up,
                           const float* dout, int64_t n, cudaStream_t stream);
// rotary.cu (kernels/cpu/rotary.h): the forward turn, or (backward) the inverse one.
cudaError_t Rotary(float* x, int64_t row_stride, int N, int T, int H, int HS,
                   const int32_t* positions, const float* inv_freq, bool backward,
                   cudaStream_t stream);

// embedding.cu
cudaError_t TokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int N, int C,
                                  int v0, int v1, cudaStream_t stream);
cudaError_t TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int N,
                                   int C, int v0, int v1, cudaStream_t stream);
cudaError_t PositionEmbeddingForward(float* out, const float* wpe, int B, int T, int C,
                                     cudaStream_t stream);
cudaError_t PositionEmbeddingAt(float* out, const float* wpe, const int32_t* positions, int N,
                                int C, cudaStream_t stream);
cudaError_t PositionEmbeddingBackward(float* dwpe, const float* dout, int B, int T, int C,
                                      cudaStream_t stream);

// cross_entropy.cu
cudaError_t CrossEntropyLocalStats(float* local_max, float* local_sumexp, float* target_logit,
                                   const float* logits, const int32_t* targets, int N, int Vs,
                                   int v0, cudaStream_t stream);
// Single device, fused: LocalStats and LossFromStats of one shard covering the vocabulary.
cudaError_t CrossEntropyForward(float* losses, float* lse, const float* logits,
                                const int32_t* targets, int N, int V, cudaStream_t stream);
cudaError_t CrossEntropyRescaleSumExp(float* sumexp, const float* local_max,
                                      const float* global_max, int N, cudaStream_t stream);
cudaError_t CrossEntropyLossFromStats(float* losses, float* lse, const float* global_max,
                                      const float* global_sumexp, const float* target_logit,
                                      const int32_t* targets, int N, cudaStream_t stream);
cudaError_t CrossEntropyBackwardShard(float* dlogits, const float* logits, const float* lse,
                                      const int32_t* targets, const float* dlosses, int N, int Vs,
                                      int v0, cudaStream_t stream);

// optimizer.cu
struct AdamWParams {
  float learning_rate;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float correction1;  // 1 − β1^step
  float correction2;  // 1 − β2^step
};
cudaError_t AdamWUpdate(float* params, const float* grads, float* m, float* v, int64_t n,
                        const AdamWParams& p, cudaStream_t stream);
// *sum += Σ data[i]² (double accumulation; block partials are added with atomicAdd).
cudaError_t SumOfSquaresAccumulate(double* sum, const float* data, int64_t n, cudaStream_t stream);
// data *= min(1, max_norm / (sqrt(*sum_sq) + 1e-6)), with the norm read on the device, so that a
// clip needs no host round trip; a non-finite norm leaves data untouched (ClipGradients' rule).
cudaError_t ClipBySumOfSquares(float* data, int64_t n, const double* sum_sq, double max_norm,
                               cudaStream_t stream);

// attention.cu. HS must be <= kAttentionMaxHeadSize (ops.cc checks).
inline constexpr int kAttentionMaxHeadSize = 128;
cudaError_t AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int NH,
                             int KVH, int HS, cudaStream_t stream);
cudaError_t AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int NH, int KVH, int HS,
                              cudaStream_t stream);

// paged_attention.cu. The batch's arrays in device memory; PagedAttentionForward returns
// cudaErrorInvalidValue for HS outside 1..512 (ops.cc checks first and names it).
cudaError_t PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                         const PagedAttentionBatch& batch, int NH, int KVH, int HS,
                         cudaStream_t stream);
cudaError_t PagedAttentionForward(float* out, const float* qkv, const float* k_cache,
                                  const float* v_cache, const PagedAttentionBatch& batch, int NH,
                                  int KVH, int HS, cudaStream_t stream);

}  // namespace shardline::kernels::cuda::launch
