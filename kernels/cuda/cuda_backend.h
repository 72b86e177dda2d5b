// The CUDA backend: the CUDA kernels (kernels/cuda/ops.h) and cuBLAS behind kernels::Backend, on
// one device and one stream of its own. Every operation is queued on that stream and returns at
// once; ToHost and Synchronize wait for it. Memory comes from a CudaCachingAllocator, whose blocks
// are safe to reuse because every kernel touching them runs on this one stream (see its header).
//
// Precision: GEMMs in f32, or in bf16 with f32 accumulation over the f32 values the engine keeps
// (the master weights, as mixed-precision training does: kBFloat16 rounds each GEMM's operands to
// bf16, blas.h). Every other operation is f32.
//
// Every operation has a test against its CPU twin in tests/unit/kernels_backend_test.cc (skipped,
// with the reason, where no GPU is usable).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/cuda_allocator.h"

namespace shardline::kernels::cuda {

class CudaBackend final : public Backend {
 public:
  // A backend on CUDA device `device`. FailedPrecondition when no CUDA device or driver is usable
  // (or cuBLAS cannot be loaded), InvalidArgument for a device that is not visible.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device, GemmPrecision precision);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::kCuda; }
  Allocator& allocator() override { return *allocator_; }
  std::string Describe() const override;
  cudaStream_t stream() const { return stream_; }
  int device_index() const { return allocator_->device_index(); }

  absl::Status Fill(float* x, int64_t n, float value) override;
  absl::Status Copy(float* dst, const float* src, int64_t n) override;
  absl::Status Accumulate(float* dst, const float* src, int64_t n) override;
  absl::Status Scale(float* x, int64_t n, float factor) override;
  absl::Status ToDevice(void* dst, const void* host, size_t bytes) override;
  absl::Status ToHost(void* host, const void* src, size_t bytes) override;
  absl::Status Synchronize() override;

  absl::Status Linear(float* out, const float* inp, const float* weight,
                      const cpu::PackedWeight* packed, const float* bias, int N, int C,
                      int OC) override;
  absl::Status LinearBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, int N, int C, int OC) override;
  absl::Status BiasAdd(float* out, const float* bias, int N, int C) override;
  // None: cuBLAS reads the weight as it is.
  absl::StatusOr<std::unique_ptr<cpu::PackedWeight>> PackWeight(const float* weight, int C, int OC,
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
                     const cpu::AdamWConfig& config, int64_t step) override;
  absl::StatusOr<double> SumOfSquares(std::span<const std::span<const float>> arrays) override;

 private:
  explicit CudaBackend(std::unique_ptr<CudaCachingAllocator> allocator)
      : allocator_(std::move(allocator)) {}

  std::unique_ptr<CudaCachingAllocator> allocator_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Blas> blas_;
  double* sum_scratch_ = nullptr;  // one device double for SumOfSquares
};

}  // namespace shardline::kernels::cuda
