#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/blas.h"  // cpu::PackedWeight, which PackWeight returns none of
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace shardline::kernels::cuda {

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device,
                                                                 GemmPrecision precision) {
  ASSIGN_OR_RETURN(auto allocator, CudaCachingAllocator::Create(device));
  // A process drives one device (kernels/device.h): it stays current for every later call.
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
  std::unique_ptr<CudaBackend> backend(new CudaBackend(std::move(allocator)));
  // A stream of its own, blocking: ordered after the legacy default stream, where the allocator
  // zeroes new tensors (Tensor::Zeros), so a kernel never reads memory before it is zeroed. NCCL's
  // streams are non-blocking and do not wait for it.
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreate(&backend->stream_), "CudaBackend: creating its stream"));
  ASSIGN_OR_RETURN(backend->blas_, Blas::Create(*backend->allocator_, precision));
  ASSIGN_OR_RETURN(void* scratch, backend->allocator_->Allocate(sizeof(double)));
  backend->sum_scratch_ = static_cast<double*>(scratch);
  return backend;
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);  // nothing may still use the memory freed below
  }
  if (sum_scratch_ != nullptr) allocator_->Deallocate(sum_scratch_, sizeof(double));
  blas_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::string CudaBackend::Describe() const {
  cudaDeviceProp properties{};
  const bool named = cudaGetDeviceProperties(&properties, device_index()) == cudaSuccess;
  return absl::StrCat("cuda (device ", device_index(), named ? ": " : "",
                      named ? properties.name : "", ", ",
                      blas_->precision() == GemmPrecision::kBFloat16 ? "bf16" : "f32", " GEMMs)");
}

absl::Status CudaBackend::Fill(float* x, int64_t n, float value) {
  return cuda::Fill(x, value, n, stream_);
}

absl::Status CudaBackend::Copy(float* dst, const float* src, int64_t n) {
  if (n == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(dst, src, sizeof(float) * static_cast<size_t>(n),
                                    cudaMemcpyDeviceToDevice, stream_),
                    "CudaBackend::Copy");
}

absl::Status CudaBackend::Accumulate(float* dst, const float* src, int64_t n) {
  return cuda::Accumulate(dst, src, n, stream_);
}

absl::Status CudaBackend::Scale(float* x, int64_t n, float factor) {
  return cuda::Scale(x, factor, n, stream_);
}

absl::Status CudaBackend::ToDevice(void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_),
                             "CudaBackend::ToDevice"));
  // The host buffer may be reused as soon as this returns (it is pageable memory).
  return CudaStatus(cudaStreamSynchronize(stream_), "CudaBackend::ToDevice");
}

absl::Status CudaBackend::ToHost(void* host, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_),
                             "CudaBackend::ToHost"));
  return CudaStatus(cudaStreamSynchronize(stream_), "CudaBackend::ToHost");
}

absl::Status CudaBackend::Synchronize() {
  return CudaStatus(cudaStreamSynchronize(stream_), "CudaBackend::Synchronize");
}

absl::Status CudaBackend::Linear(float* out, const float* inp, const float* weight,
                                 const cpu::PackedWeight*, const float* bias, int N, int C,
                                 int OC) {
  return MatmulForward(*blas_, out, inp, weight, bias, N, C, OC, stream_);
}

absl::Status CudaBackend::LinearBackward(float* dinp, float* dweight, float* dbias,
                                         const float* dout, const float* inp, const float* weight,
                                         int N, int C, int OC) {
  return MatmulBackward(*blas_, dinp, dweight, dbias, dout, inp, weight, N, C, OC, stream_);
}

absl::Status CudaBackend::BiasAdd(float* out, const float* bias, int N, int C) {
  return BiasAddForward(out, bias, N, C, stream_);
}

absl::StatusOr<std::unique_ptr<cpu::PackedWeight>> CudaBackend::PackWeight(const float*, int, int,
                                                                           int) {
  return nullptr;
}

absl::Status CudaBackend::LayerNorm(float* out, float* mean, float* rstd, const float* inp,
                                    const float* weight, const float* bias, int N, int C,
                                    float eps) {
  return LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, eps, stream_);
}

absl::Status CudaBackend::LayerNormBackward(float* dinp, float* dweight, float* dbias,
                                            const float* dout, const float* inp,
                                            const float* weight, const float* mean,
                                            const float* rstd, int N, int C) {
  return cuda::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                                 stream_);
}

absl::Status CudaBackend::Gelu(float* out, const float* inp, int64_t n) {
  return GeluForward(out, inp, n, stream_);
}

absl::Status CudaBackend::GeluBackward(float* dinp, const float* inp, const float* dout,
                                       int64_t n) {
  return cuda::GeluBackward(dinp, inp, dout, n, stream_);
}

absl::Status CudaBackend::Residual(float* out, const float* inp1, const float* inp2, int64_t n) {
  return ResidualForward(out, inp1, inp2, n, stream_);
}

absl::Status CudaBackend::ResidualBackward(float* dinp1, float* dinp2, const float* dout,
                                           int64_t n) {
  return cuda::ResidualBackward(dinp1, dinp2, dout, n, stream_);
}

absl::Status CudaBackend::RmsNorm(float* out, float* rstd, const float* inp, const float* weight,
                                  int N, int C, float eps) {
  return RmsNormForward(out, rstd, inp, weight, N, C, eps, stream_);
}

absl::Status CudaBackend::RmsNormBackward(float* dinp, float* dweight, const float* dout,
                                          const float* inp, const float* weight, const float* rstd,
                                          int N, int C) {
  return cuda::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C, stream_);
}

absl::Status CudaBackend::SwiGlu(float* out, const float* gate, const float* up, int64_t n) {
  return SwiGluForward(out, gate, up, n, stream_);
}

absl::Status CudaBackend::SwiGluBackward(float* dgate, float* dup, const float* gate,
                                         const float* up, const float* dout, int64_t n) {
  return cuda::SwiGluBackward(dgate, dup, gate, up, dout, n, stream_);
}

absl::Status CudaBackend::Rotary(float* x, int64_t row_stride, int N, int T, int H, int HS,
                                 const int32_t* positions, const float* inv_freq) {
  return RotaryForward(x, row_stride, N, T, H, HS, positions, inv_freq, stream_);
}

absl::Status CudaBackend::RotaryBackward(float* dx, int64_t row_stride, int N, int T, int H, int HS,
                                         const int32_t* positions, const float* inv_freq) {
  return cuda::RotaryBackward(dx, row_stride, N, T, H, HS, positions, inv_freq, stream_);
}

absl::Status CudaBackend::Attention(float* out, float* lse, const float* qkv, int B, int T, int NH,
                                    int KVH, int HS) {
  return AttentionForward(out, lse, qkv, B, T, NH, KVH, HS, stream_);
}

absl::Status CudaBackend::AttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                            const float* out, const float* lse, int B, int T,
                                            int NH, int KVH, int HS) {
  return cuda::AttentionBackward(dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS, stream_);
}

absl::Status CudaBackend::PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                                       const PagedAttentionBatch& batch, int NH, int KVH, int HS) {
  return cuda::PagedKvWrite(k_cache, v_cache, qkv, batch, NH, KVH, HS, stream_);
}

absl::Status CudaBackend::PagedAttention(float* out, const float* qkv, const float* k_cache,
                                         const float* v_cache, const PagedAttentionBatch& batch,
                                         int NH, int KVH, int HS) {
  return PagedAttentionForward(out, qkv, k_cache, v_cache, batch, NH, KVH, HS, stream_);
}

absl::Status CudaBackend::TokenEmbedding(float* out, const int32_t* tokens, const float* wte, int N,
                                         int C, int v0, int v1) {
  return TokenEmbeddingForward(out, tokens, wte, N, C, v0, v1, stream_);
}

absl::Status CudaBackend::TokenEmbeddingBackward(float* dwte, const float* dout,
                                                 const int32_t* tokens, int N, int C, int v0,
                                                 int v1) {
  return cuda::TokenEmbeddingBackward(dwte, dout, tokens, N, C, v0, v1, stream_);
}

absl::Status CudaBackend::PositionEmbedding(float* out, const float* wpe, const int32_t* positions,
                                            int N, int T, int C) {
  if (positions == nullptr) return PositionEmbeddingForward(out, wpe, N / T, T, C, stream_);
  return PositionEmbeddingAt(out, wpe, positions, N, C, stream_);
}

absl::Status CudaBackend::PositionEmbeddingBackward(float* dwpe, const float* dout, int B, int T,
                                                    int C) {
  return cuda::PositionEmbeddingBackward(dwpe, dout, B, T, C, stream_);
}

absl::Status CudaBackend::CrossEntropyLocalStats(float* local_max, float* local_sumexp,
                                                 float* target_logit, const float* logits,
                                                 const int32_t* targets, int N, int Vs, int v0) {
  return cuda::CrossEntropyLocalStats(local_max, local_sumexp, target_logit, logits, targets, N, Vs,
                                      v0, stream_);
}

absl::Status CudaBackend::CrossEntropyRescaleSumExp(float* sumexp, const float* local_max,
                                                    const float* global_max, int N) {
  return cuda::CrossEntropyRescaleSumExp(sumexp, local_max, global_max, N, stream_);
}

absl::Status CudaBackend::CrossEntropyLossFromStats(float* losses, float* lse,
                                                    const float* global_max,
                                                    const float* global_sumexp,
                                                    const float* target_logit,
                                                    const int32_t* targets, int N) {
  return cuda::CrossEntropyLossFromStats(losses, lse, global_max, global_sumexp, target_logit,
                                         targets, N, stream_);
}

absl::Status CudaBackend::CrossEntropyBackwardShard(float* dlogits, const float* logits,
                                                    const float* lse, const int32_t* targets,
                                                    const float* dlosses, int N, int Vs, int v0) {
  return cuda::CrossEntropyBackwardShard(dlogits, logits, lse, targets, dlosses, N, Vs, v0,
                                         stream_);
}

absl::Status CudaBackend::AdamW(float* params, const float* grads, float* m, float* v, int64_t n,
                                const cpu::AdamWConfig& config, int64_t step) {
  return AdamWUpdate(params, grads, m, v, n, config, step, stream_);
}

absl::StatusOr<double> CudaBackend::SumOfSquares(std::span<const std::span<const float>> arrays) {
  RETURN_IF_ERROR(GradSumOfSquares(arrays, sum_scratch_, stream_));
  double sum = 0.0;
  RETURN_IF_ERROR(ToHost(&sum, sum_scratch_, sizeof(double)));
  return sum;
}

}  // namespace shardline::kernels::cuda
