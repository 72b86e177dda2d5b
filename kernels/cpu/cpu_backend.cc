#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rotary.h"
#include "kernels/cpu/skinny_matmul.h"

namespace shardline::kernels::cpu {

CpuBackend::CpuBackend()
    : own_allocator_(std::make_unique<CpuAllocator>()), allocator_(own_allocator_.get()) {}

CpuBackend::CpuBackend(Allocator& allocator) : allocator_(&allocator) {}

std::string CpuBackend::Describe() const {
  return absl::StrCat("cpu (", BlasDescription(), ", ", CpuThreads(), " threads)");
}

absl::Status CpuBackend::Fill(float* x, int64_t n, float value) {
  std::fill(x, x + n, value);
  return absl::OkStatus();
}

absl::Status CpuBackend::Copy(float* dst, const float* src, int64_t n) {
  std::copy(src, src + n, dst);
  return absl::OkStatus();
}

absl::Status CpuBackend::Accumulate(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  return absl::OkStatus();
}

absl::Status CpuBackend::Scale(float* x, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
  return absl::OkStatus();
}

absl::Status CpuBackend::ToDevice(void* dst, const void* host, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::ToHost(void* host, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::Linear(float* out, const float* inp, const float* weight,
                                const PackedWeight* packed, const float* bias, int N, int C,
                                int OC) {
  LinearForward(out, inp, weight, packed, bias, N, C, OC);
  return absl::OkStatus();
}

absl::Status CpuBackend::LinearBackward(float* dinp, float* dweight, float* dbias,
                                        const float* dout, const float* inp, const float* weight,
                                        int N, int C, int OC) {
  MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  return absl::OkStatus();
}

absl::Status CpuBackend::BiasAdd(float* out, const float* bias, int N, int C) {
  BiasAddForward(out, bias, N, C);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PackedWeight>> CpuBackend::PackWeight(const float* weight, int C,
                                                                     int OC, int max_rows) {
  return PackedWeight::Pack(weight, C, OC, max_rows, *allocator_);
}

absl::Status CpuBackend::LayerNorm(float* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int N, int C,
                                   float eps) {
  LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, eps);
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormBackward(float* dinp, float* dweight, float* dbias,
                                           const float* dout, const float* inp, const float* weight,
                                           const float* mean, const float* rstd, int N, int C) {
  cpu::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  return absl::OkStatus();
}

absl::Status CpuBackend::Gelu(float* out, const float* inp, int64_t n) {
  GeluForward(out, inp, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
  cpu::GeluBackward(dinp, inp, dout, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::Residual(float* out, const float* inp1, const float* inp2, int64_t n) {
  ResidualForward(out, inp1, inp2, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::ResidualBackward(float* dinp1, float* dinp2, const float* dout,
                                          int64_t n) {
  cpu::ResidualBackward(dinp1, dinp2, dout, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNorm(float* out, float* rstd, const float* inp, const float* weight,
                                 int N, int C, float eps) {
  RmsNormForward(out, rstd, inp, weight, N, C, eps);
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNormBackward(float* dinp, float* dweight, const float* dout,
                                         const float* inp, const float* weight, const float* rstd,
                                         int N, int C) {
  cpu::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C);
  return absl::OkStatus();
}

absl::Status CpuBackend::SwiGlu(float* out, const float* gate, const float* up, int64_t n) {
  SwiGluForward(out, gate, up, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::SwiGluBackward(float* dgate, float* dup, const float* gate,
                                        const float* up, const float* dout, int64_t n) {
  cpu::SwiGluBackward(dgate, dup, gate, up, dout, n);
  return absl::OkStatus();
}

namespace {
absl::Status CheckRotaryHead(int HS, const char* what) {
  if (HS >= 2 && HS % 2 == 0 && HS <= kMaxRotaryHeadSize) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": head size ", HS, " is not an even size up to ", kMaxRotaryHeadSize));
}
}  // namespace

absl::Status CpuBackend::Rotary(float* x, int64_t row_stride, int N, int T, int H, int HS,
                                const int32_t* positions, const float* inv_freq) {
  RETURN_IF_ERROR(CheckRotaryHead(HS, "cpu rotary"));
  RotaryForward(x, row_stride, N, T, H, HS, positions, inv_freq);
  return absl::OkStatus();
}

absl::Status CpuBackend::RotaryBackward(float* dx, int64_t row_stride, int N, int T, int H, int HS,
                                        const int32_t* positions, const float* inv_freq) {
  RETURN_IF_ERROR(CheckRotaryHead(HS, "cpu rotary backward"));
  cpu::RotaryBackward(dx, row_stride, N, T, H, HS, positions, inv_freq);
  return absl::OkStatus();
}

namespace {
// The kernels index key/value heads as h / (NH / KVH) and trust it.
absl::Status CheckHeads(int NH, int KVH, const char* what) {
  if (NH >= 0 && KVH >= 1 && NH % KVH == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": key/value heads ", KVH, " must divide the query heads ", NH));
}
}  // namespace

absl::Status CpuBackend::Attention(float* out, float* lse, const float* qkv, int B, int T, int NH,
                                   int KVH, int HS) {
  RETURN_IF_ERROR(CheckHeads(NH, KVH, "cpu attention"));
  AttentionForward(out, lse, qkv, B, T, NH, KVH, HS);
  return absl::OkStatus();
}

absl::Status CpuBackend::AttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                           const float* out, const float* lse, int B, int T, int NH,
                                           int KVH, int HS) {
  RETURN_IF_ERROR(CheckHeads(NH, KVH, "cpu attention backward"));
  cpu::AttentionBackward(dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS);
  return absl::OkStatus();
}

absl::Status CpuBackend::PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                                      const PagedAttentionBatch& batch, int NH, int KVH, int HS) {
  RETURN_IF_ERROR(CheckHeads(NH, KVH, "cpu paged KV write"));
  cpu::PagedKvWrite(k_cache, v_cache, qkv, batch, NH, KVH, HS);
  return absl::OkStatus();
}

absl::Status CpuBackend::PagedAttention(float* out, const float* qkv, const float* k_cache,
                                        const float* v_cache, const PagedAttentionBatch& batch,
                                        int NH, int KVH, int HS) {
  RETURN_IF_ERROR(CheckHeads(NH, KVH, "cpu paged attention"));
  PagedAttentionForward(out, qkv, k_cache, v_cache, batch, NH, KVH, HS);
  return absl::OkStatus();
}

absl::Status CpuBackend::TokenEmbedding(float* out, const int32_t* tokens, const float* wte, int N,
                                        int C, int v0, int v1) {
  TokenEmbeddingForward(out, tokens, wte, N, C, v0, v1);
  return absl::OkStatus();
}

absl::Status CpuBackend::TokenEmbeddingBackward(float* dwte, const float* dout,
                                                const int32_t* tokens, int N, int C, int v0,
                                                int v1) {
  cpu::TokenEmbeddingBackward(dwte, dout, tokens, N, C, v0, v1);
  return absl::OkStatus();
}

absl::Status CpuBackend::PositionEmbedding(float* out, const float* wpe, const int32_t* positions,
                                           int N, int T, int C) {
  if (positions == nullptr) {
    PositionEmbeddingForward(out, wpe, N / T, T, C);
    return absl::OkStatus();
  }
  for (int n = 0; n < N; ++n) {
    const float* pe = wpe + int64_t{positions[n]} * C;
    float* x = out + int64_t{n} * C;
    for (int j = 0; j < C; ++j) x[j] += pe[j];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::PositionEmbeddingBackward(float* dwpe, const float* dout, int B, int T,
                                                   int C) {
  cpu::PositionEmbeddingBackward(dwpe, dout, B, T, C);
  return absl::OkStatus();
}

absl::Status CpuBackend::CrossEntropyLocalStats(float* local_max, float* local_sumexp,
                                                float* target_logit, const float* logits,
                                                const int32_t* targets, int N, int Vs, int v0) {
  cpu::CrossEntropyLocalStats(local_max, local_sumexp, target_logit, logits, targets, N, Vs, v0);
  return absl::OkStatus();
}

absl::Status CpuBackend::CrossEntropyRescaleSumExp(float* sumexp, const float* local_max,
                                                   const float* global_max, int N) {
  cpu::CrossEntropyRescaleSumExp(sumexp, local_max, global_max, N);
  return absl::OkStatus();
}

absl::Status CpuBackend::CrossEntropyLossFromStats(float* losses, float* lse,
                                                   const float* global_max,
                                                   const float* global_sumexp,
                                                   const float* target_logit,
                                                   const int32_t* targets, int N) {
  cpu::CrossEntropyLossFromStats(losses, lse, global_max, global_sumexp, target_logit, targets, N);
  return absl::OkStatus();
}

absl::Status CpuBackend::CrossEntropyBackwardShard(float* dlogits, const float* logits,
                                                   const float* lse, const int32_t* targets,
                                                   const float* dlosses, int N, int Vs, int v0) {
  cpu::CrossEntropyBackwardShard(dlogits, logits, lse, targets, dlosses, N, Vs, v0);
  return absl::OkStatus();
}

absl::Status CpuBackend::AdamW(float* params, const float* grads, float* m, float* v, int64_t n,
                               const AdamWConfig& config, int64_t step) {
  return AdamWUpdate(params, grads, m, v, n, config, step);
}

absl::StatusOr<double> CpuBackend::SumOfSquares(std::span<const std::span<const float>> arrays) {
  return GradSumOfSquares(arrays);
}

}  // namespace shardline::kernels::cpu
