// Host side of the CUDA kernels: argument checks, cuBLAS calls, and turning launch errors into
// absl::Status. The kernels themselves are in the .cu files (launchers.h).
#include "kernels/cuda/ops.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launchers.h"

namespace shardline::kernels::cuda {
namespace {

// Offsets of several arrays carved out of one scratch block, each aligned for vector loads.
constexpr size_t kScratchAlignment = 256;
size_t AlignUp(size_t n) {
  return (n + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

uint16_t* Bits(BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }
const uint16_t* Bits(const BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); }

absl::Status Launched(cudaError_t error, const char* what) { return CudaStatus(error, what); }

// One GEMM in the column-major terms cuBLAS uses, on `stream`. A and B are f32 or bf16 (`bf16`),
// C is always f32; accumulation is f32. alpha = 1.
absl::Status Gemm(Blas& blas, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                  const void* a, int lda, const void* b, int ldb, float beta, float* c, int ldc,
                  bool bf16, cudaStream_t stream, const char* what) {
  RETURN_IF_ERROR(CublasStatus(blas.api().set_stream(blas.handle(), stream), "cublasSetStream"));
  const float alpha = 1.0f;
  if (!bf16) {
    return CublasStatus(
        blas.api().sgemm(blas.handle(), op_a, op_b, m, n, k, &alpha, static_cast<const float*>(a),
                         lda, static_cast<const float*>(b), ldb, &beta, c, ldc),
        what);
  }
  return CublasStatus(blas.api().gemm_ex(blas.handle(), op_a, op_b, m, n, k, &alpha, a, CUDA_R_16BF,
                                         lda, b, CUDA_R_16BF, ldb, &beta, c, CUDA_R_32F, ldc,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      what);
}

// Row-major out (N,OC) = inp (N,C)·weight (OC,C)ᵀ + bias. cuBLAS sees the row-major arrays as their
// column-major transposes, so it computes outᵀ (OC,N) = weight·inpᵀ: A = weight viewed (C,OC)
// transposed, B = inp viewed (C,N). The bias is broadcast into out first and added by beta = 1.
absl::Status ForwardGemm(Blas& blas, float* out, const void* inp, const void* weight,
                         const float* bias, int N, int C, int OC, bool bf16, cudaStream_t stream) {
  if (N == 0 || OC == 0) return absl::OkStatus();
  float beta = 0.0f;
  if (bias != nullptr) {
    RETURN_IF_ERROR(
        Launched(launch::BiasBroadcast(out, bias, N, OC, stream), "cuda::MatmulForward bias"));
    beta = 1.0f;
  }
  if (C == 0) {  // an empty sum: out is the bias, or zero (cuBLAS rejects lda = 0)
    if (bias != nullptr) return absl::OkStatus();
    return CudaStatus(cudaMemsetAsync(out, 0, sizeof(float) * size_t(N) * size_t(OC), stream),
                      "cuda::MatmulForward zero fill");
  }
  return Gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, inp, C, beta, out, OC, bf16,
              stream, "cuda::MatmulForward GEMM");
}

absl::Status CheckSizes(int a, int b, int c, const char* what) {
  if (a < 0 || b < 0 || c < 0) {
    return absl::InvalidArgumentError(std::string(what) + ": negative size (" + std::to_string(a) +
                                      ", " + std::to_string(b) + ", " + std::to_string(c) + ")");
  }
  return absl::OkStatus();
}

}  // namespace

// ---- matmul ------------------------------------------------------------------------------------

absl::Status MatmulForward(Blas& blas, float* out, const float* inp, const float* weight,
                           const float* bias, int N, int C, int OC, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckSizes(N, C, OC, "cuda::MatmulForward"));
  if (blas.precision() == GemmPrecision::kFloat32 || N == 0 || OC == 0 || C == 0) {
    return ForwardGemm(blas, out, inp, weight, bias, N, C, OC, /*bf16=*/false, stream);
  }
  const size_t inp_bytes = AlignUp(sizeof(uint16_t) * size_t(N) * size_t(C));
  const size_t weight_bytes = AlignUp(sizeof(uint16_t) * size_t(OC) * size_t(C));
  ASSIGN_OR_RETURN(void* scratch, blas.Scratch(inp_bytes + weight_bytes));
  auto* inp16 = static_cast<BFloat16*>(scratch);
  auto* weight16 = reinterpret_cast<BFloat16*>(static_cast<char*>(scratch) + inp_bytes);
  RETURN_IF_ERROR(CastFloatToBFloat16(inp16, inp, int64_t{N} * C, stream));
  RETURN_IF_ERROR(CastFloatToBFloat16(weight16, weight, int64_t{OC} * C, stream));
  return ForwardGemm(blas, out, inp16, weight16, bias, N, C, OC, /*bf16=*/true, stream);
}

absl::Status MatmulForwardBf16(Blas& blas, float* out, const BFloat16* inp, const BFloat16* weight,
                               const float* bias, int N, int C, int OC, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckSizes(N, C, OC, "cuda::MatmulForwardBf16"));
  return ForwardGemm(blas, out, inp, weight, bias, N, C, OC, /*bf16=*/true, stream);
}

absl::Status MatmulBackward(Blas& blas, float* dinp, float* dweight, float* dbias,
                            const float* dout, const float* inp, const float* weight, int N, int C,
                            int OC, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckSizes(N, C, OC, "cuda::MatmulBackward"));
  const bool want_dinp = dinp != nullptr && N > 0 && C > 0 && OC > 0;
  const bool want_dweight = dweight != nullptr && OC > 0 && C > 0 && N > 0;
  const bool bf16 = blas.precision() == GemmPrecision::kBFloat16 && (want_dinp || want_dweight);
  const void* dout_op = dout;
  const void* inp_op = inp;
  const void* weight_op = weight;
  if (bf16) {
    // Only the operands the requested gradients read are cast.
    const size_t dout_bytes = AlignUp(sizeof(uint16_t) * size_t(N) * size_t(OC));
    const size_t inp_bytes = want_dweight ? AlignUp(sizeof(uint16_t) * size_t(N) * size_t(C)) : 0;
    const size_t weight_bytes = want_dinp ? AlignUp(sizeof(uint16_t) * size_t(OC) * size_t(C)) : 0;
    ASSIGN_OR_RETURN(void* scratch, blas.Scratch(dout_bytes + inp_bytes + weight_bytes));
    char* base = static_cast<char*>(scratch);
    auto* dout16 = reinterpret_cast<BFloat16*>(base);
    RETURN_IF_ERROR(CastFloatToBFloat16(dout16, dout, int64_t{N} * OC, stream));
    dout_op = dout16;
    if (want_dweight) {
      auto* inp16 = reinterpret_cast<BFloat16*>(base + dout_bytes);
      RETURN_IF_ERROR(CastFloatToBFloat16(inp16, inp, int64_t{N} * C, stream));
      inp_op = inp16;
    }
    if (want_dinp) {
      auto* weight16 = reinterpret_cast<BFloat16*>(base + dout_bytes + inp_bytes);
      RETURN_IF_ERROR(CastFloatToBFloat16(weight16, weight, int64_t{OC} * C, stream));
      weight_op = weight16;
    }
  }
  if (want_dinp) {
    // dinpᵀ (C,N) += weightᵀ (C,OC)·doutᵀ (OC,N): both are their row-major arrays as cuBLAS sees
    // them.
    RETURN_IF_ERROR(Gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight_op, C, dout_op, OC, 1.0f,
                         dinp, C, bf16, stream, "cuda::MatmulBackward dinp GEMM"));
  }
  if (want_dweight) {
    // dweightᵀ (C,OC) += inpᵀ (C,N)·dout (N,OC); cuBLAS sees dout as doutᵀ, hence op_b = T.
    RETURN_IF_ERROR(Gemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp_op, C, dout_op, OC, 1.0f,
                         dweight, C, bf16, stream, "cuda::MatmulBackward dweight GEMM"));
  }
  if (dbias != nullptr) return BiasAddBackward(dbias, dout, N, OC, stream);
  return absl::OkStatus();
}

absl::Status BiasAddForward(float* out, const float* bias, int N, int C, cudaStream_t stream) {
  return Launched(launch::BiasAddForward(out, bias, N, C, stream), "cuda::BiasAddForward");
}

absl::Status BiasAddBackward(float* dbias, const float* dout, int N, int C, cudaStream_t stream) {
  return Launched(launch::ColumnSumAccumulate(dbias, dout, N, C, stream), "cuda::BiasAddBackward");
}

absl::Status CastFloatToBFloat16(BFloat16* out, const float* in, int64_t n, cudaStream_t stream) {
  return Launched(launch::FloatToBFloat16(Bits(out), in, n, stream), "cuda::CastFloatToBFloat16");
}

absl::Status CastBFloat16ToFloat(float* out, const BFloat16* in, int64_t n, cudaStream_t stream) {
  return Launched(launch::BFloat16ToFloat(out, Bits(in), n, stream), "cuda::CastBFloat16ToFloat");
}

// ---- layernorm ---------------------------------------------------------------------------------

absl::Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C, float eps,
                              cudaStream_t stream) {
  return Launched(launch::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, eps, stream),
                  "cuda::LayerNormForward");
}

absl::Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C, cudaStream_t stream) {
  return Launched(
      launch::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, stream),
      "cuda::LayerNormBackward");
}

absl::Status RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N,
                            int C, float eps, cudaStream_t stream) {
  return Launched(launch::RmsNormForward(out, rstd, inp, weight, N, C, eps, stream),
                  "cuda::RmsNormForward");
}

absl::Status RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const float* rstd, int N, int C,
                             cudaStream_t stream) {
  return Launched(launch::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C, stream),
                  "cuda::RmsNormBackward");
}

absl::Status SwiGluForward(float* out, const float* gate, const float* up, int64_t n,
                           cudaStream_t stream) {
  return Launched(launch::SwiGluForward(out, gate, up, n, stream), "cuda::SwiGluForward");
}

absl::Status SwiGluBackward(float* dgate, float* dup, const float* gate, const float* up,
                            const float* dout, int64_t n, cudaStream_t stream) {
  return Launched(launch::SwiGluBackward(dgate, dup, gate, up, dout, n, stream),
                  "cuda::SwiGluBackward");
}

namespace {
absl::Status CheckRotary(int HS, const char* what) {
  if (HS >= 2 && HS % 2 == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": head size ", HS, " is not even"));
}
}  // namespace

absl::Status RotaryForward(float* x, int64_t row_stride, int N, int T, int H, int HS,
                           const int32_t* positions, const float* inv_freq, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRotary(HS, "cuda::RotaryForward"));
  return Launched(launch::Rotary(x, row_stride, N, T, H, HS, positions, inv_freq, false, stream),
                  "cuda::RotaryForward");
}

absl::Status RotaryBackward(float* dx, int64_t row_stride, int N, int T, int H, int HS,
                            const int32_t* positions, const float* inv_freq, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRotary(HS, "cuda::RotaryBackward"));
  return Launched(launch::Rotary(dx, row_stride, N, T, H, HS, positions, inv_freq, true, stream),
                  "cuda::RotaryBackward");
}

// ---- elementwise -------------------------------------------------------------------------------

absl::Status GeluForward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  return Launched(launch::GeluForward(out, inp, n, stream), "cuda::GeluForward");
}

absl::Status GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                          cudaStream_t stream) {
  return Launched(launch::GeluBackward(dinp, inp, dout, n, stream), "cuda::GeluBackward");
}

absl::Status ResidualForward(float* out, const float* inp1, const float* inp2, int64_t n,
                             cudaStream_t stream) {
  return Launched(launch::Add(out, inp1, inp2, n, stream), "cuda::ResidualForward");
}

absl::Status ResidualBackward(float* dinp1, float* dinp2, const float* dout, int64_t n,
                              cudaStream_t stream) {
  if (dinp1 != nullptr) {
    RETURN_IF_ERROR(
        Launched(launch::AccumulateInto(dinp1, dout, n, stream), "cuda::ResidualBackward"));
  }
  if (dinp2 != nullptr) {
    return Launched(launch::AccumulateInto(dinp2, dout, n, stream), "cuda::ResidualBackward");
  }
  return absl::OkStatus();
}

absl::Status Fill(float* out, float value, int64_t n, cudaStream_t stream) {
  return Launched(launch::Fill(out, value, n, stream), "cuda::Fill");
}

absl::Status Accumulate(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  return Launched(launch::AccumulateInto(dst, src, n, stream), "cuda::Accumulate");
}

absl::Status Scale(float* data, float factor, int64_t n, cudaStream_t stream) {
  return Launched(launch::Scale(data, factor, n, stream), "cuda::Scale");
}

// ---- softmax -----------------------------------------------------------------------------------

absl::Status SoftmaxForward(float* out, const float* inp, int N, int C, cudaStream_t stream) {
  return Launched(launch::SoftmaxForward(out, inp, N, C, stream), "cuda::SoftmaxForward");
}

absl::Status SoftmaxBackward(float* dinp, const float* dout, const float* out, int N, int C,
                             cudaStream_t stream) {
  return Launched(launch::SoftmaxBackward(dinp, dout, out, N, C, stream), "cuda::SoftmaxBackward");
}

// ---- embedding ---------------------------------------------------------------------------------

absl::Status TokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int N,
                                   int C, int v0, int v1, cudaStream_t stream) {
  return Launched(launch::TokenEmbeddingForward(out, tokens, wte, N, C, v0, v1, stream),
                  "cuda::TokenEmbeddingForward");
}

absl::Status TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int N,
                                    int C, int v0, int v1, cudaStream_t stream) {
  return Launched(launch::TokenEmbeddingBackward(dwte, dout, tokens, N, C, v0, v1, stream),
                  "cuda::TokenEmbeddingBackward");
}

absl::Status PositionEmbeddingForward(float* out, const float* wpe, int B, int T, int C,
                                      cudaStream_t stream) {
  return Launched(launch::PositionEmbeddingForward(out, wpe, B, T, C, stream),
                  "cuda::PositionEmbeddingForward");
}

absl::Status PositionEmbeddingAt(float* out, const float* wpe, const int32_t* positions, int N,
                                 int C, cudaStream_t stream) {
  return Launched(launch::PositionEmbeddingAt(out, wpe, positions, N, C, stream),
                  "cuda::PositionEmbeddingAt");
}

absl::Status PositionEmbeddingBackward(float* dwpe, const float* dout, int B, int T, int C,
                                       cudaStream_t stream) {
  return Launched(launch::PositionEmbeddingBackward(dwpe, dout, B, T, C, stream),
                  "cuda::PositionEmbeddingBackward");
}

absl::Status EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                            int B, int T, int C, int V, cudaStream_t stream) {
  RETURN_IF_ERROR(TokenEmbeddingForward(out, tokens, wte, B * T, C, 0, V, stream));
  return PositionEmbeddingForward(out, wpe, B, T, C, stream);
}

absl::Status EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                             int B, int T, int C, int V, cudaStream_t stream) {
  if (dwte != nullptr) {
    RETURN_IF_ERROR(TokenEmbeddingBackward(dwte, dout, tokens, B * T, C, 0, V, stream));
  }
  if (dwpe != nullptr) return PositionEmbeddingBackward(dwpe, dout, B, T, C, stream);
  return absl::OkStatus();
}

// ---- cross-entropy -----------------------------------------------------------------------------

absl::Status CrossEntropyLocalStats(float* local_max, float* local_sumexp, float* target_logit,
                                    const float* logits, const int32_t* targets, int N, int Vs,
                                    int v0, cudaStream_t stream) {
  return Launched(launch::CrossEntropyLocalStats(local_max, local_sumexp, target_logit, logits,
                                                 targets, N, Vs, v0, stream),
                  "cuda::CrossEntropyLocalStats");
}

absl::Status CrossEntropyRescaleSumExp(float* sumexp, const float* local_max,
                                       const float* global_max, int N, cudaStream_t stream) {
  return Launched(launch::CrossEntropyRescaleSumExp(sumexp, local_max, global_max, N, stream),
                  "cuda::CrossEntropyRescaleSumExp");
}

absl::Status CrossEntropyLossFromStats(float* losses, float* lse, const float* global_max,
                                       const float* global_sumexp, const float* target_logit,
                                       const int32_t* targets, int N, cudaStream_t stream) {
  return Launched(launch::CrossEntropyLossFromStats(losses, lse, global_max, global_sumexp,
                                                    target_logit, targets, N, stream),
                  "cuda::CrossEntropyLossFromStats");
}

absl::Status CrossEntropyBackwardShard(float* dlogits, const float* logits, const float* lse,
                                       const int32_t* targets, const float* dlosses, int N, int Vs,
                                       int v0, cudaStream_t stream) {
  return Launched(
      launch::CrossEntropyBackwardShard(dlogits, logits, lse, targets, dlosses, N, Vs, v0, stream),
      "cuda::CrossEntropyBackwardShard");
}

absl::Status CrossEntropyForward(float* losses, float* lse, const float* logits,
                                 const int32_t* targets, int N, int V, cudaStream_t stream) {
  return Launched(launch::CrossEntropyForward(losses, lse, logits, targets, N, V, stream),
                  "cuda::CrossEntropyForward");
}

absl::Status CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                                  const int32_t* targets, const float* dlosses, int N, int V,
                                  cudaStream_t stream) {
  return CrossEntropyBackwardShard(dlogits, logits, lse, targets, dlosses, N, V, 0, stream);
}

// ---- optimizer ---------------------------------------------------------------------------------

absl::Status AdamWUpdate(float* params, const float* grads, float* m, float* v, int64_t n,
                         const cpu::AdamWConfig& config, int64_t step, cudaStream_t stream) {
  // Validation and bias corrections are the CPU twin's, so both backends agree to the bit there.
  auto prepared = cpu::AdamWPrepare(config, step);
  if (!prepared.ok()) return prepared.status();
  launch::AdamWParams p;
  p.learning_rate = config.learning_rate;
  p.beta1 = config.beta1;
  p.beta2 = config.beta2;
  p.eps = config.eps;
  p.weight_decay = config.weight_decay;
  p.correction1 = prepared->first;
  p.correction2 = prepared->second;
  return Launched(launch::AdamWUpdate(params, grads, m, v, n, p, stream), "cuda::AdamWUpdate");
}

absl::Status GradSumOfSquares(std::span<const std::span<const float>> grads, double* sum_sq,
                              cudaStream_t stream) {
  RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(sum_sq, 0, sizeof(double), stream),
                             "cuda::GradSumOfSquares zeroing the sum"));
  for (std::span<const float> g : grads) {
    RETURN_IF_ERROR(Launched(
        launch::SumOfSquaresAccumulate(sum_sq, g.data(), static_cast<int64_t>(g.size()), stream),
        "cuda::GradSumOfSquares"));
  }
  return absl::OkStatus();
}

absl::Status ClipGradients(std::span<const std::span<float>> grads, double norm, double max_norm,
                           cudaStream_t stream) {
  if (!std::isfinite(norm)) return absl::OkStatus();
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient >= 1.0) return absl::OkStatus();
  const float scale = static_cast<float>(coefficient);
  for (std::span<float> g : grads) {
    RETURN_IF_ERROR(Launched(launch::Scale(g.data(), scale, static_cast<int64_t>(g.size()), stream),
                             "cuda::ClipGradients"));
  }
  return absl::OkStatus();
}

absl::Status ClipGradientsBySumOfSquares(std::span<const std::span<float>> grads,
                                         const double* sum_sq, double max_norm,
                                         cudaStream_t stream) {
  for (std::span<float> g : grads) {
    RETURN_IF_ERROR(Launched(launch::ClipBySumOfSquares(g.data(), static_cast<int64_t>(g.size()),
                                                        sum_sq, max_norm, stream),
                             "cuda::ClipGradientsBySumOfSquares"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> GlobalNormClip(std::span<const std::span<float>> grads, double max_norm,
                                      double* scratch, cudaStream_t stream) {
  if (!(max_norm > 0.0)) {
    return absl::InvalidArgumentError("max_norm must be > 0, got " + std::to_string(max_norm));
  }
  std::vector<std::span<const float>> views(grads.begin(), grads.end());
  RETURN_IF_ERROR(GradSumOfSquares(views, scratch, stream));
  double sum_sq = 0.0;
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(&sum_sq, scratch, sizeof(double), cudaMemcpyDeviceToHost, stream),
                 "cuda::GlobalNormClip reading the sum of squares"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "cuda::GlobalNormClip synchronising"));
  const double norm = std::sqrt(sum_sq);
  RETURN_IF_ERROR(ClipGradients(grads, norm, max_norm, stream));
  return norm;
}

// ---- attention ---------------------------------------------------------------------------------

namespace {
absl::Status CheckAttention(int B, int T, int NH, int KVH, int HS, const char* what) {
  if (B < 0 || T < 0 || NH < 0 || HS < 1 || HS > launch::kAttentionMaxHeadSize) {
    return absl::InvalidArgumentError(std::string(what) + ": needs B, T, NH >= 0 and 1 <= HS <= " +
                                      std::to_string(launch::kAttentionMaxHeadSize) +
                                      ", got B=" + std::to_string(B) + " T=" + std::to_string(T) +
                                      " NH=" + std::to_string(NH) + " HS=" + std::to_string(HS));
  }
  if (KVH < 1 || NH % KVH != 0) {
    return absl::InvalidArgumentError(std::string(what) + ": key/value heads " +
                                      std::to_string(KVH) + " must divide the query heads " +
                                      std::to_string(NH));
  }
  if (int64_t{B} * NH > 65535) {  // the grid's y dimension holds (b, head)
    return absl::InvalidArgumentError(
        std::string(what) + ": B·NH = " + std::to_string(int64_t{B} * NH) + " exceeds 65535");
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int NH,
                              int KVH, int HS, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckAttention(B, T, NH, KVH, HS, "cuda::AttentionForward"));
  return Launched(launch::AttentionForward(out, lse, qkv, B, T, NH, KVH, HS, stream),
                  "cuda::AttentionForward");
}

absl::Status AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                               const float* lse, int B, int T, int NH, int KVH, int HS,
                               cudaStream_t stream) {
  RETURN_IF_ERROR(CheckAttention(B, T, NH, KVH, HS, "cuda::AttentionBackward"));
  return Launched(launch::AttentionBackward(dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS, stream),
                  "cuda::AttentionBackward");
}

absl::Status PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                          const PagedAttentionBatch& batch, int NH, int KVH, int HS,
                          cudaStream_t stream) {
  return Launched(launch::PagedKvWrite(k_cache, v_cache, qkv, batch, NH, KVH, HS, stream),
                  "cuda::PagedKvWrite");
}

absl::Status PagedAttentionForward(float* out, const float* qkv, const float* k_cache,
                                   const float* v_cache, const PagedAttentionBatch& batch, int NH,
                                   int KVH, int HS, cudaStream_t stream) {
  if (HS < 1 || HS > 512 || NH < 1 || KVH < 1 || NH % KVH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda::PagedAttentionForward: head size ", HS, " with ", NH, " heads and ",
                     KVH, " key/value heads (it takes 1..512, key/value heads dividing heads)"));
  }
  return Launched(
      launch::PagedAttentionForward(out, qkv, k_cache, v_cache, batch, NH, KVH, HS, stream),
      "cuda::PagedAttentionForward");
}

}  // namespace shardline::kernels::cuda
