// The CUDA kernels, with the signatures of their CPU twins in kernels/cpu/ (the reference every one
// of them is tested against: tests/unit/kernels_cuda_test.cc).
//
// Conventions, as kernels/cpu/matmul.h: f32 row-major contiguous arrays, explicit sizes in the same
// argument order as the CPU function of the same name, sizes trusted (validate with ExpectShape
// first); backward kernels ACCUMULATE into every gradient and skip a null one. In addition:
//   - every pointer is a DEVICE pointer (from CudaCachingAllocator or cudaMalloc), except spans
//     of spans, whose outer array is on the host;
//   - the last argument is the stream the work is queued on; every call returns once the work is
//     queued (asynchronous), unless it says it synchronises;
//   - the Status is the launch's: InvalidArgument for a size the kernel cannot take, Internal (with
//     the CUDA error) when the launch fails. A fault inside a kernel surfaces at the next
//     synchronising call (cudaStreamSynchronize), as always with CUDA.
// Where a result may differ from the CPU's beyond reordered f32 sums, the function says so.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cuda/blas.h"
#include "kernels/half.h"
#include "kernels/paged_attention_batch.h"

namespace shardline::kernels::cuda {

// ---- matmul.h --------------------------------------------------------------------------------

// out (N,OC) = inp (N,C)·weight (OC,C)ᵀ + bias (OC, or null), in blas.precision() (see blas.h:
// kBFloat16 rounds inp and weight to bf16 first, so expect ~1e-2 relative differences from the
// CPU).
absl::Status MatmulForward(Blas& blas, float* out, const float* inp, const float* weight,
                           const float* bias, int N, int C, int OC, cudaStream_t stream);
// The same from operands already in bf16 (always bf16 × bf16 → f32, whatever blas.precision()).
absl::Status MatmulForwardBf16(Blas& blas, float* out, const BFloat16* inp, const BFloat16* weight,
                               const float* bias, int N, int C, int OC, cudaStream_t stream);
// dout (N,OC): dinp (N,C) += dout·weight; dweight (OC,C) += doutᵀ·inp; dbias (OC) += Σ_n dout.
// In kBFloat16, dout, inp and weight are rounded to bf16 for the two GEMMs (dbias is summed in
// f32).
absl::Status MatmulBackward(Blas& blas, float* dinp, float* dweight, float* dbias,
                            const float* dout, const float* inp, const float* weight, int N, int C,
                            int OC, cudaStream_t stream);

// out (N,C) += bias (C) per row; dbias (C) += Σ_n dout[n,:] (fixed order, deterministic).
absl::Status BiasAddForward(float* out, const float* bias, int N, int C, cudaStream_t stream);
absl::Status BiasAddBackward(float* dbias, const float* dout, int N, int C, cudaStream_t stream);

// f32 <-> bf16 copies (n elements), rounding to nearest even as kernels/half.h does on the host:
// the two agree bit for bit.
absl::Status CastFloatToBFloat16(BFloat16* out, const float* in, int64_t n, cudaStream_t stream);
absl::Status CastBFloat16ToFloat(float* out, const BFloat16* in, int64_t n, cudaStream_t stream);

// ---- layernorm.h -----------------------------------------------------------------------------

// inp, out (N,C); weight, bias (C); mean, rstd (N) written for the backward.
absl::Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C, float eps,
                              cudaStream_t stream);
// dinp (N,C), dweight (C), dbias (C) accumulate; deterministic (no atomics).
absl::Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C, cudaStream_t stream);

// ---- elementwise.h ---------------------------------------------------------------------------

absl::Status GeluForward(float* out, const float* inp, int64_t n, cudaStream_t stream);
absl::Status GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                          cudaStream_t stream);

// RMSNorm, SwiGLU and rotary positions, as kernels/cpu/rmsnorm.h, elementwise.h and rotary.h
// (Llama's pieces). RMSNorm's dweight is a fixed-order column reduction (no atomics); rotary's
// inv_freq (HS/2) is in device memory (cpu::RotaryInverseFrequencies' values, uploaded) and HS
// must be even (InvalidArgument otherwise).
absl::Status RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N,
                            int C, float eps, cudaStream_t stream);
absl::Status RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const float* rstd, int N, int C,
                             cudaStream_t stream);
absl::Status SwiGluForward(float* out, const float* gate, const float* up, int64_t n,
                           cudaStream_t stream);
absl::Status SwiGluBackward(float* dgate, float* dup, const float* gate, const float* up,
                            const float* dout, int64_t n, cudaStream_t stream);
absl::Status RotaryForward(float* x, int64_t row_stride, int N, int T, int H, int HS,
                           const int32_t* positions, const float* inv_freq, cudaStream_t stream);
absl::Status RotaryBackward(float* dx, int64_t row_stride, int N, int T, int H, int HS,
                            const int32_t* positions, const float* inv_freq, cudaStream_t stream);

// out may alias either input.
absl::Status ResidualForward(float* out, const float* inp1, const float* inp2, int64_t n,
                             cudaStream_t stream);
absl::Status ResidualBackward(float* dinp1, float* dinp2, const float* dout, int64_t n,
                              cudaStream_t stream);

// out (n) = value; dst (n) += src (n); data (n) *= factor. The CPU backend's loops.
absl::Status Fill(float* out, float value, int64_t n, cudaStream_t stream);
absl::Status Accumulate(float* dst, const float* src, int64_t n, cudaStream_t stream);
absl::Status Scale(float* data, float factor, int64_t n, cudaStream_t stream);

// ---- softmax.h -------------------------------------------------------------------------------

absl::Status SoftmaxForward(float* out, const float* inp, int N, int C, cudaStream_t stream);
absl::Status SoftmaxBackward(float* dinp, const float* dout, const float* out, int N, int C,
                             cudaStream_t stream);

// ---- embedding.h -----------------------------------------------------------------------------
// Tokens are device int32 arrays; validate them on the host (cpu::ValidateTokens) before they are
// copied over: these kernels trust them.

absl::Status TokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int N,
                                   int C, int v0, int v1, cudaStream_t stream);
// Scatter-add with atomicAdd: with repeated tokens the order of the additions, and so the last bits
// of dwte, can vary from run to run.
absl::Status TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int N,
                                    int C, int v0, int v1, cudaStream_t stream);
absl::Status PositionEmbeddingForward(float* out, const float* wpe, int B, int T, int C,
                                      cudaStream_t stream);
// out (N,C) += wpe[positions[n]] (device positions, trusted): each row at its own position.
absl::Status PositionEmbeddingAt(float* out, const float* wpe, const int32_t* positions, int N,
                                 int C, cudaStream_t stream);
absl::Status PositionEmbeddingBackward(float* dwpe, const float* dout, int B, int T, int C,
                                       cudaStream_t stream);
absl::Status EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                            int B, int T, int C, int V, cudaStream_t stream);
absl::Status EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                             int B, int T, int C, int V, cudaStream_t stream);

// ---- cross_entropy.h -------------------------------------------------------------------------
// The vocab-parallel pieces; their composition (and the all-reduces between them) is described in
// kernels/cpu/cross_entropy.h. The local sum of exponentials is computed online in one pass over
// the row (running max, rescaled sum), so it differs from the CPU's two-pass sum by rounding only.

absl::Status CrossEntropyLocalStats(float* local_max, float* local_sumexp, float* target_logit,
                                    const float* logits, const int32_t* targets, int N, int Vs,
                                    int v0, cudaStream_t stream);
absl::Status CrossEntropyRescaleSumExp(float* sumexp, const float* local_max,
                                       const float* global_max, int N, cudaStream_t stream);
absl::Status CrossEntropyLossFromStats(float* losses, float* lse, const float* global_max,
                                       const float* global_sumexp, const float* target_logit,
                                       const int32_t* targets, int N, cudaStream_t stream);
absl::Status CrossEntropyBackwardShard(float* dlogits, const float* logits, const float* lse,
                                       const int32_t* targets, const float* dlosses, int N, int Vs,
                                       int v0, cudaStream_t stream);
absl::Status CrossEntropyForward(float* losses, float* lse, const float* logits,
                                 const int32_t* targets, int N, int V, cudaStream_t stream);
absl::Status CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                                  const int32_t* targets, const float* dlosses, int N, int V,
                                  cudaStream_t stream);

// ---- optimizer.h -----------------------------------------------------------------------------

// One AdamW step, as cpu::AdamWUpdate (same InvalidArgument for a bad step or hyper-parameter).
absl::Status AdamWUpdate(float* params, const float* grads, float* m, float* v, int64_t n,
                         const cpu::AdamWConfig& config, int64_t step, cudaStream_t stream);

// *sum_sq (one device double, overwritten) = Σ g² over every array, accumulated in double. The
// result stays on the device, ready for the all-reduce of the sharded (ZeRO / TP) case.
absl::Status GradSumOfSquares(std::span<const std::span<const float>> grads, double* sum_sq,
                              cudaStream_t stream);
// Scales every gradient by min(1, max_norm/(norm + 1e-6)); a non-finite norm leaves them untouched.
absl::Status ClipGradients(std::span<const std::span<float>> grads, double norm, double max_norm,
                           cudaStream_t stream);
// The same with the norm taken as sqrt(*sum_sq) on the device: no host round trip.
absl::Status ClipGradientsBySumOfSquares(std::span<const std::span<float>> grads,
                                         const double* sum_sq, double max_norm,
                                         cudaStream_t stream);
// Single device: the global L2 norm before clipping, after clipping in place to max_norm.
// `scratch` is one device double. SYNCHRONISES `stream` (the norm is returned to the host).
// InvalidArgument when max_norm <= 0.
absl::StatusOr<double> GlobalNormClip(std::span<const std::span<float>> grads, double max_norm,
                                      double* scratch, cudaStream_t stream);

// ---- attention.h -----------------------------------------------------------------------------
// Fused causal attention (online softmax over key tiles; the backward recomputes probabilities
// from lse). qkv (B,T,3,NH,HS), out (B,T,NH,HS), lse (B,NH,T), as cpu::AttentionForward.
// InvalidArgument unless 1 <= HS <= 128 and B·NH <= 65535.

absl::Status AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int NH,
                              int KVH, int HS, cudaStream_t stream);
// dqkv (B,T,3,NH,HS) accumulates; deterministic (no atomics).
absl::Status AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                               const float* lse, int B, int T, int NH, int KVH, int HS,
                               cudaStream_t stream);

// ---- paged_attention.h -----------------------------------------------------------------------
// Inference over a paged KV cache, as cpu::PagedKvWrite and cpu::PagedAttentionForward, the
// batch's arrays (token_seq, positions, block_tables) in device memory and trusted (validate on
// the host). One thread block per (token, head), online softmax over passes of 256 positions:
// deterministic, and independent of the other tokens of the step. InvalidArgument unless
// 1 <= HS <= 512.
absl::Status PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                          const PagedAttentionBatch& batch, int NH, int KVH, int HS,
                          cudaStream_t stream);
absl::Status PagedAttentionForward(float* out, const float* qkv, const float* k_cache,
                                   const float* v_cache, const PagedAttentionBatch& batch, int NH,
                                   int KVH, int HS, cudaStream_t stream);

}  // namespace shardline::kernels::cuda
