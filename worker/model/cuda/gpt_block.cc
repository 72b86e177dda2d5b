#include "worker/model/cuda/gpt_block.h"

#include <cstdint>

#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace shardline::model::cuda {
namespace k = kernels::cuda;
using enum TensorRole;

namespace {

absl::Status Zero(float* p, int64_t n, cudaStream_t stream) {
  return k::CudaStatus(cudaMemsetAsync(p, 0, sizeof(float) * static_cast<size_t>(n), stream),
                       "zeroing a block's gradient scratch");
}

}  // namespace

absl::Status BlockForward(k::Blas& blas, const BlockDims& d, const BlockParams& p, const float* x,
                          float* y, const BlockActivations& a, cudaStream_t stream) {
  const int N = static_cast<int>(d.N());
  const int64_t NC = d.N() * d.C;
  // Attention half.
  RETURN_IF_ERROR(k::LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p[kNorm1], p[kNorm1Bias], N,
                                      d.C, kernels::cpu::kLayerNormEps, stream));
  RETURN_IF_ERROR(
      k::MatmulForward(blas, a.qkv, a.ln1, p[kQkv], p[kQkvBias], N, d.C, 3 * d.Attn(), stream));
  RETURN_IF_ERROR(k::AttentionForward(a.atty, a.att_lse, a.qkv, d.B, d.T, d.NH, d.HS, stream));
  RETURN_IF_ERROR(k::MatmulForward(blas, a.resid_mid, a.atty, p[kAttnOut], p[kAttnOutBias], N,
                                   d.Attn(), d.C, stream));
  RETURN_IF_ERROR(k::ResidualForward(a.resid_mid, a.resid_mid, x, NC, stream));

  // MLP half.
  RETURN_IF_ERROR(k::LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.resid_mid, p[kNorm2],
                                      p[kNorm2Bias], N, d.C, kernels::cpu::kLayerNormEps, stream));
  RETURN_IF_ERROR(
      k::MatmulForward(blas, a.fch, a.ln2, p[kMlpUp], p[kMlpUpBias], N, d.C, d.F, stream));
  RETURN_IF_ERROR(k::GeluForward(a.fch_gelu, a.fch, d.N() * d.F, stream));
  RETURN_IF_ERROR(
      k::MatmulForward(blas, y, a.fch_gelu, p[kMlpDown], p[kMlpDownBias], N, d.F, d.C, stream));
  return k::ResidualForward(y, y, a.resid_mid, NC, stream);
}

absl::Status BlockBackward(k::Blas& blas, const BlockDims& d, const BlockParams& p,
                           const BlockParams& g, const float* x, const float* dy, float* dx,
                           const BlockActivations& a, const BlockGradScratch& s,
                           cudaStream_t stream) {
  const int N = static_cast<int>(d.N());
  const int64_t NC = d.N() * d.C;
  // Every kernel accumulates, so the scratch starts from zero.
  RETURN_IF_ERROR(Zero(s.dresid_mid, NC, stream));
  RETURN_IF_ERROR(Zero(s.dln, NC, stream));
  RETURN_IF_ERROR(Zero(s.dfch_gelu, d.N() * d.F, stream));
  RETURN_IF_ERROR(Zero(s.dfch, d.N() * d.F, stream));
  RETURN_IF_ERROR(Zero(s.datty, d.N() * d.Attn(), stream));
  RETURN_IF_ERROR(Zero(s.dqkv, d.N() * 3 * d.Attn(), stream));

  // MLP half: y = r + fc_proj(gelu(fc(ln2(r)))).
  RETURN_IF_ERROR(k::ResidualBackward(s.dresid_mid, nullptr, dy, NC, stream));
  RETURN_IF_ERROR(k::MatmulBackward(blas, s.dfch_gelu, g[kMlpDown], g[kMlpDownBias], dy, a.fch_gelu,
                                    p[kMlpDown], N, d.F, d.C, stream));
  RETURN_IF_ERROR(k::GeluBackward(s.dfch, a.fch, s.dfch_gelu, d.N() * d.F, stream));
  RETURN_IF_ERROR(k::MatmulBackward(blas, s.dln, g[kMlpUp], g[kMlpUpBias], s.dfch, a.ln2, p[kMlpUp],
                                    N, d.C, d.F, stream));
  RETURN_IF_ERROR(k::LayerNormBackward(s.dresid_mid, g[kNorm2], g[kNorm2Bias], s.dln, a.resid_mid,
                                       p[kNorm2], a.ln2_mean, a.ln2_rstd, N, d.C, stream));

  // Attention half: r = x + attn_proj(attention(qkv(ln1(x)))).
  RETURN_IF_ERROR(k::ResidualBackward(dx, nullptr, s.dresid_mid, NC, stream));
  RETURN_IF_ERROR(k::MatmulBackward(blas, s.datty, g[kAttnOut], g[kAttnOutBias], s.dresid_mid,
                                    a.atty, p[kAttnOut], N, d.Attn(), d.C, stream));
  RETURN_IF_ERROR(k::AttentionBackward(s.dqkv, s.datty, a.qkv, a.atty, a.att_lse, d.B, d.T, d.NH,
                                       d.HS, stream));
  RETURN_IF_ERROR(Zero(s.dln, NC, stream));
  RETURN_IF_ERROR(k::MatmulBackward(blas, s.dln, g[kQkv], g[kQkvBias], s.dqkv, a.ln1, p[kQkv], N,
                                    d.C, 3 * d.Attn(), stream));
  return k::LayerNormBackward(dx, g[kNorm1], g[kNorm1Bias], s.dln, x, p[kNorm1], a.ln1_mean,
                              a.ln1_rstd, N, d.C, stream);
}

}  // namespace shardline::model::cuda
