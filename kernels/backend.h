// The operations the model engine runs, on one device: the one interface between the engine
// (worker/model/) and the kernels, as ggml's backends or llm.c's two files — a small set of
// fixed-shape operations on raw arrays, not a tensor library. Two implementations: the CPU's
// (kernels/cpu/cpu_backend.h, today's CPU kernels) and CUDA's (kernels/cuda/cuda_backend.h, the
// CUDA kernels and cuBLAS, on one stream).
//
// Conventions, those of kernels/cpu/matmul.h and kernels/cuda/ops.h, which every operation forwards
// to under the same name: f32 row-major contiguous arrays in the backend's memory (from
// allocator()), explicit sizes, backward operations ACCUMULATE into every gradient and skip a null
// one. Operations may run asynchronously (CUDA queues them on its stream): the host sees their
// results only after ToHost or Synchronize. The Status is the operation's launch: always OK on the
// CPU; on CUDA, InvalidArgument for a size a kernel cannot take and Internal for a failed launch.
// Token and target arrays are in the backend's memory too; validate them on the host first
// (cpu::ValidateTokens): the operations trust them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/device.h"
#include "kernels/paged_attention_batch.h"

namespace shardline::kernels {

namespace cpu {
class PackedWeight;
}  // namespace cpu

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // Where the engine's parameters, gradients, moments and activations come from.
  virtual Allocator& allocator() = 0;
  // For logs and errors: "cpu (oneMKL, 2 threads)", "cuda (H100, bf16 GEMMs)".
  virtual std::string Describe() const = 0;

  // ---- memory ----
  virtual absl::Status Fill(float* x, int64_t n, float value) = 0;
  // dst (n) = src (n), both in the backend's memory; they may not overlap.
  virtual absl::Status Copy(float* dst, const float* src, int64_t n) = 0;
  // dst (n) += src (n).
  virtual absl::Status Accumulate(float* dst, const float* src, int64_t n) = 0;
  // x (n) *= factor.
  virtual absl::Status Scale(float* x, int64_t n, float factor) = 0;
  // Host to the backend's memory and back; ToHost returns once `host` holds the values (it waits
  // for the work queued before it). On the CPU both are a copy.
  virtual absl::Status ToDevice(void* dst, const void* host, size_t bytes) = 0;
  virtual absl::Status ToHost(void* host, const void* src, size_t bytes) = 0;
  // Returns once every queued operation has finished: before another thread (a communicator's)
  // reads what they wrote.
  virtual absl::Status Synchronize() = 0;

  // ---- linear layers ----
  // out (N,OC) = inp (N,C)·weight (OC,C)ᵀ + bias (OC, or null). `packed` is PackWeight's copy of
  // `weight` (or null); a backend may pick another method for few rows, so the last bits can
  // depend on N.
  virtual absl::Status Linear(float* out, const float* inp, const float* weight,
                              const cpu::PackedWeight* packed, const float* bias, int N, int C,
                              int OC) = 0;
  // dinp (N,C) += dout·weight; dweight (OC,C) += doutᵀ·inp; dbias (OC) += Σ_n dout.
  virtual absl::Status LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                      const float* inp, const float* weight, int N, int C,
                                      int OC) = 0;
  // out (N,C) += bias (C) per row.
  virtual absl::Status BiasAdd(float* out, const float* bias, int N, int C) = 0;
  // A copy of `weight` (OC,C) laid out for products of up to max_rows rows, or null where the
  // backend has none (CUDA; the CPU without MKL). It must not outlive the backend.
  virtual absl::StatusOr<std::unique_ptr<cpu::PackedWeight>> PackWeight(const float* weight, int C,
                                                                        int OC, int max_rows) = 0;

  // ---- normalisation and element-wise ----
  virtual absl::Status LayerNorm(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C,
                                 float eps) = 0;
  virtual absl::Status LayerNormBackward(float* dinp, float* dweight, float* dbias,
                                         const float* dout, const float* inp, const float* weight,
                                         const float* mean, const float* rstd, int N, int C) = 0;
  virtual absl::Status Gelu(float* out, const float* inp, int64_t n) = 0;
  virtual absl::Status GeluBackward(float* dinp, const float* inp, const float* dout,
                                    int64_t n) = 0;
  // out = inp1 + inp2 (out may alias either); its backward adds dout to both (null skipped).
  virtual absl::Status Residual(float* out, const float* inp1, const float* inp2, int64_t n) = 0;
  virtual absl::Status ResidualBackward(float* dinp1, float* dinp2, const float* dout,
                                        int64_t n) = 0;

  // ---- Llama's pieces (kernels/cpu/rmsnorm.h, elementwise.h, rotary.h) ----
  // RMSNorm: out (N,C) = inp·rstd·weight, rstd (N) kept for the backward (dinp, dweight
  // accumulate; either may be null).
  virtual absl::Status RmsNorm(float* out, float* rstd, const float* inp, const float* weight,
                               int N, int C, float eps) = 0;
  virtual absl::Status RmsNormBackward(float* dinp, float* dweight, const float* dout,
                                       const float* inp, const float* weight, const float* rstd,
                                       int N, int C) = 0;
  // out (n) = silu(gate)·up; its backward accumulates into dgate and dup (either may be null).
  virtual absl::Status SwiGlu(float* out, const float* gate, const float* up, int64_t n) = 0;
  virtual absl::Status SwiGluBackward(float* dgate, float* dup, const float* gate, const float* up,
                                      const float* dout, int64_t n) = 0;
  // Rotary positions, in place on H heads of HS channels per row (rows row_stride apart; positions
  // per row, or null: n % T); inv_freq (HS/2, cpu::RotaryInverseFrequencies) in the backend's
  // memory. The backward turns a gradient back. InvalidArgument for an odd HS (or one past
  // cpu::kMaxRotaryHeadSize on the CPU).
  virtual absl::Status Rotary(float* x, int64_t row_stride, int N, int T, int H, int HS,
                              const int32_t* positions, const float* inv_freq) = 0;
  virtual absl::Status RotaryBackward(float* dx, int64_t row_stride, int N, int T, int H, int HS,
                                      const int32_t* positions, const float* inv_freq) = 0;

  // ---- causal self-attention ----
  // qkv (B,T,NH+2·KVH,HS): the NH query heads, then KVH key and KVH value heads (GPT-2's fused
  // (B,T,3,NH,HS) when KVH = NH; kernels/cpu/attention.h) → out (B,T,NH,HS) and the log-sum-exp
  // (B,NH,T) for the backward. InvalidArgument when KVH does not divide NH.
  virtual absl::Status Attention(float* out, float* lse, const float* qkv, int B, int T, int NH,
                                 int KVH, int HS) = 0;
  virtual absl::Status AttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                         const float* out, const float* lse, int B, int T, int NH,
                                         int KVH, int HS) = 0;

  // ---- attention over a paged KV cache (inference; kernels/cpu/paged_attention.h) ----
  // Writes each token's keys and values from qkv (N,NH+2·KVH,HS) into its cache slot (KVH heads a
  // slot), then (the second)
  // each token's query attends its own sequence's cached positions 0..pos: out (N,NH,HS). The
  // batch's arrays are in the backend's memory.
  virtual absl::Status PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                                    const PagedAttentionBatch& batch, int NH, int KVH, int HS) = 0;
  virtual absl::Status PagedAttention(float* out, const float* qkv, const float* k_cache,
                                      const float* v_cache, const PagedAttentionBatch& batch,
                                      int NH, int KVH, int HS) = 0;

  // ---- embeddings ----
  // out (N,C) = the rows [v0, v1) of the vocabulary that `tokens` name (zero for the others: the
  // sum over a vocab-parallel group is the whole embedding).
  virtual absl::Status TokenEmbedding(float* out, const int32_t* tokens, const float* wte, int N,
                                      int C, int v0, int v1) = 0;
  virtual absl::Status TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens,
                                              int N, int C, int v0, int v1) = 0;
  // out (N,C) += wpe[positions[n]]; positions null means each of the N / T rows of a batch at
  // 0..T-1.
  virtual absl::Status PositionEmbedding(float* out, const float* wpe, const int32_t* positions,
                                         int N, int T, int C) = 0;
  virtual absl::Status PositionEmbeddingBackward(float* dwpe, const float* dout, int B, int T,
                                                 int C) = 0;

  // ---- vocab-parallel cross-entropy (kernels/cpu/cross_entropy.h composes them) ----
  virtual absl::Status CrossEntropyLocalStats(float* local_max, float* local_sumexp,
                                              float* target_logit, const float* logits,
                                              const int32_t* targets, int N, int Vs, int v0) = 0;
  virtual absl::Status CrossEntropyRescaleSumExp(float* sumexp, const float* local_max,
                                                 const float* global_max, int N) = 0;
  virtual absl::Status CrossEntropyLossFromStats(float* losses, float* lse, const float* global_max,
                                                 const float* global_sumexp,
                                                 const float* target_logit, const int32_t* targets,
                                                 int N) = 0;
  virtual absl::Status CrossEntropyBackwardShard(float* dlogits, const float* logits,
                                                 const float* lse, const int32_t* targets,
                                                 const float* dlosses, int N, int Vs, int v0) = 0;

  // ---- optimizer ----
  // One AdamW step (cpu::AdamWUpdate's InvalidArgument for a bad step or hyper-parameter).
  virtual absl::Status AdamW(float* params, const float* grads, float* m, float* v, int64_t n,
                             const cpu::AdamWConfig& config, int64_t step) = 0;
  // Σ x² over every array, accumulated in double, returned to the host (waits for the queue).
  virtual absl::StatusOr<double> SumOfSquares(std::span<const std::span<const float>> arrays) = 0;
};

struct BackendOptions {
  Device device = Device::kCpu;
  int device_index = 0;                // which CUDA device (a process drives one)
  bool bf16_gemms = false;             // CUDA: matrix products in bf16 with f32 accumulation
  Allocator* cpu_allocator = nullptr;  // CPU: the allocator to use (null: one of its own)
};

// The backend of `options`. FailedPrecondition when the device is not usable (CUDA's reason) or
// this build has no CUDA; InvalidArgument for bf16 on the CPU, whose kernels compute in f32.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

}  // namespace shardline::kernels
