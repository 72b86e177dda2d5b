// The CPU backend: today's CPU kernels (kernels/cpu/) behind kernels::Backend. Every operation runs
// at once on the calling thread (the kernels thread internally with OpenMP), so Synchronize has
// nothing to wait for and the memory is the host's.
#pragma once

#include <memory>
#include <string>

#include "kernels/allocator.h"
#include "kernels/backend.h"

namespace shardline::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  // Memory from an allocator of its own.
  CpuBackend();
  // Memory from `allocator` (a CPU allocator that outlives this), so that its stats account for
  // the engine's memory.
  explicit CpuBackend(Allocator& allocator);
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  Device device() const override { return Device::kCpu; }
  Allocator& allocator() override { return *allocator_; }
  std::string Describe() const override;

  absl::Status Fill(float* x, int64_t n, float value) override;
  absl::Status Copy(float* dst, const float* src, int64_t n) override;
  absl::Status Accumulate(float* dst, const float* src, int64_t n) override;
  absl::Status Scale(float* x, int64_t n, float factor) override;
  absl::Status ToDevice(void* dst, const void* host, size_t bytes) override;
  absl::Status ToHost(void* host, const void* src, size_t bytes) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status Linear(float* out, const float* inp, const float* weight, const PackedWeight* packed,
                      const float* bias, int N, int C, int OC) override;
  absl::Status LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, int N, int C, int OC) override;
  absl::Status BiasAdd(float* out, const float* bias, int N, int C) override;
  absl::StatusOr<std::unique_ptr<PackedWeight>> PackWeight(const float* weight, int C, int OC,
                                                           int max_rows) override;

  absl::Status LayerNorm(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C, float eps) override;
  absl::Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const float* mean,
                                 const float* rstd, int N, int C) override;
  absl::Status Gelu(float* out, const float* inp, int64_t n) override;
  absl::Status GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  absl::Status Residual(float* out, const float* inp1, const float* inp2, int64_t n) override;
  absl::Status ResidualBackward(float* dinp1, float* dinp2, const float* dout, int64_t n) override;

  absl::Status RmsNorm(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) override;
  absl::Status RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                               const float* weight, const float* rstd, int N, int C) override;
  absl::Status SwiGlu(float* out, const float* gate, const float* up, int64_t n) override;
  absl::Status SwiGluBackward(float* dgate, float* dup, const float* gate, const float* up,
                              const float* dout, int64_t n) override;
  absl::Status Rotary(float* x, int64_t row_stride, int N, int T, int H, int HS,
                      const int32_t* positions, const float* inv_freq) override;
  absl::Status RotaryBackward(float* dx, int64_t row_stride, int N, int T, int H, int HS,
                              const int32_t* positions, const float* inv_freq) override;
  absl::Status Attention(float* out, float* lse, const float* qkv, int B, int T, int NH, int KVH,
                         int HS) override;
  absl::Status AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                 const float* lse, int B, int T, int NH, int KVH, int HS) override;
  absl::Status PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                            const PagedAttentionBatch& batch, int NH, int KVH, int HS) override;
  absl::Status PagedAttention(float* out, const float* qkv, const float* k_cache,
                              const float* v_cache, const PagedAttentionBatch& batch, int NH,
                              int KVH, int HS) override;

  absl::Status TokenEmbedding(float* out, const int32_t* tokens, const float* wte, int N, int C,
                              int v0, int v1) override;
  absl::Status TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int N,
                                      int C, int v0, int v1) override;
  absl::Status PositionEmbedding(float* out, const float* wpe, const int32_t* positions, int N,
                                 int T, int C) override;
  absl::Status PositionEmbeddingBackward(float* dwpe, const float* dout, int B, int T,
                                         int C) override;

  absl::Status CrossEntropyLocalStats(float* local_max, float* local_sumexp, float* target_logit,
                                      const float* logits, const int32_t* targets, int N, int Vs,
                                      int v0) override;
  absl::Status CrossEntropyRescaleSumExp(float* sumexp, const float* local_max,
                                         const float* global_max, int N) override;
  absl::Status CrossEntropyLossFromStats(float* losses, float* lse, const float* global_max,
                                         const float* global_sumexp, const float* target_logit,
                                         const int32_t* targets, int N) override;
  absl::Status CrossEntropyBackwardShard(float* dlogits, const float* logits, const float* lse,
                                         const int32_t* targets, const float* dlosses, int N,
                                         int Vs, int v0) override;

  absl::Status AdamW(float* params, const float* grads, float* m, float* v, int64_t n,
                     const AdamWConfig& config, int64_t step) override;
  absl::StatusOr<double> SumOfSquares(std::span<const std::span<const float>> arrays) override;

 private:
  std::unique_ptr<CpuAllocator> own_allocator_;  // when none was given
  Allocator* allocator_;
};

}  // namespace shardline::kernels::cpu
