#include "worker/model/gpt_block.h"

#include <algorithm>

#include "common/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/skinny_matmul.h"

namespace shardline::model {
namespace cpu = kernels::cpu;
using enum TensorRole;

namespace {

absl::Status Reduce(const AllReduceFn& all_reduce, float* data, int64_t n, const char* what) {
  if (!all_reduce) return absl::OkStatus();
  return Annotate(all_reduce(data, n), what);
}

void Zero(float* p, int64_t n) { std::fill(p, p + n, 0.0f); }

}  // namespace

absl::Status BlockForward(const BlockDims& d, const BlockParams& p, const float* x, float* y,
                          const BlockActivations& a, const AllReduceFn& all_reduce,
                          const AttentionFn& attention) {
  const int N = static_cast<int>(d.N());
  const int64_t NC = d.N() * d.C;
  // Attention half. The row-parallel projection's bias is added after the reduction, so that it
  // counts once however many ranks contributed partial sums.
  cpu::LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p[kNorm1], p[kNorm1Bias], N, d.C);
  cpu::LinearForward(a.qkv, a.ln1, p[kQkv], p.packed(kQkv), p[kQkvBias], N, d.C, 3 * d.Attn());
  if (attention) {
    RETURN_IF_ERROR(attention(a.qkv, a.atty));
  } else {
    cpu::AttentionForward(a.atty, a.att_lse, a.qkv, d.B, d.T, d.NH, d.HS);
  }
  if (all_reduce) {
    cpu::LinearForward(a.resid_mid, a.atty, p[kAttnOut], p.packed(kAttnOut), nullptr, N, d.Attn(),
                       d.C);
    RETURN_IF_ERROR(Reduce(all_reduce, a.resid_mid, NC, "all-reduce of the attention output"));
    cpu::BiasAddForward(a.resid_mid, p[kAttnOutBias], N, d.C);
  } else {
    cpu::LinearForward(a.resid_mid, a.atty, p[kAttnOut], p.packed(kAttnOut), p[kAttnOutBias], N,
                       d.Attn(), d.C);
  }
  cpu::ResidualForward(a.resid_mid, a.resid_mid, x, NC);

  // MLP half.
  cpu::LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.resid_mid, p[kNorm2], p[kNorm2Bias], N,
                        d.C);
  cpu::LinearForward(a.fch, a.ln2, p[kMlpUp], p.packed(kMlpUp), p[kMlpUpBias], N, d.C, d.F);
  cpu::GeluForward(a.fch_gelu, a.fch, d.N() * d.F);
  if (all_reduce) {
    cpu::LinearForward(y, a.fch_gelu, p[kMlpDown], p.packed(kMlpDown), nullptr, N, d.F, d.C);
    RETURN_IF_ERROR(Reduce(all_reduce, y, NC, "all-reduce of the MLP output"));
    cpu::BiasAddForward(y, p[kMlpDownBias], N, d.C);
  } else {
    cpu::LinearForward(y, a.fch_gelu, p[kMlpDown], p.packed(kMlpDown), p[kMlpDownBias], N, d.F,
                       d.C);
  }
  cpu::ResidualForward(y, y, a.resid_mid, NC);
  return absl::OkStatus();
}

absl::Status RecomputeBlock(placement::RecomputeMode mode, const BlockDims& d, const BlockParams& p,
                            const float* x, float* y, const BlockActivations& a,
                            const AllReduceFn& all_reduce) {
  switch (mode) {
    case placement::RecomputeMode::kNone:
      return absl::OkStatus();
    case placement::RecomputeMode::kFull:
      return BlockForward(d, p, x, y, a, all_reduce);
    case placement::RecomputeMode::kSelective:
      break;
  }
  const int N = static_cast<int>(d.N());
  cpu::LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p[kNorm1], p[kNorm1Bias], N, d.C);
  cpu::AttentionForward(a.atty, a.att_lse, a.qkv, d.B, d.T, d.NH, d.HS);
  cpu::LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.resid_mid, p[kNorm2], p[kNorm2Bias], N,
                        d.C);
  cpu::GeluForward(a.fch_gelu, a.fch, d.N() * d.F);
  return absl::OkStatus();
}

absl::Status BlockBackward(const BlockDims& d, const BlockParams& p, const BlockParams& g,
                           const float* x, const float* dy, float* dx, const BlockActivations& a,
                           const BlockGradScratch& s, const AllReduceFn& all_reduce) {
  const int N = static_cast<int>(d.N());
  const int64_t NC = d.N() * d.C;
  // Every kernel accumulates, so the scratch starts from zero.
  Zero(s.dresid_mid, NC);
  Zero(s.dln, NC);
  Zero(s.dfch_gelu, d.N() * d.F);
  Zero(s.dfch, d.N() * d.F);
  Zero(s.datty, d.N() * d.Attn());
  Zero(s.dqkv, d.N() * 3 * d.Attn());

  // MLP half: y = r + fc_proj(gelu(fc(ln2(r)))).
  cpu::ResidualBackward(s.dresid_mid, nullptr, dy, NC);
  cpu::MatmulBackward(s.dfch_gelu, g[kMlpDown], g[kMlpDownBias], dy, a.fch_gelu, p[kMlpDown], N,
                      d.F, d.C);
  cpu::GeluBackward(s.dfch, a.fch, s.dfch_gelu, d.N() * d.F);
  cpu::MatmulBackward(s.dln, g[kMlpUp], g[kMlpUpBias], s.dfch, a.ln2, p[kMlpUp], N, d.C, d.F);
  // The column-parallel input was replicated in the forward, so its gradient is a sum over ranks.
  RETURN_IF_ERROR(Reduce(all_reduce, s.dln, NC, "all-reduce of the MLP input gradient"));
  cpu::LayerNormBackward(s.dresid_mid, g[kNorm2], g[kNorm2Bias], s.dln, a.resid_mid, p[kNorm2],
                         a.ln2_mean, a.ln2_rstd, N, d.C);

  // Attention half: r = x + attn_proj(attention(qkv(ln1(x)))).
  cpu::ResidualBackward(dx, nullptr, s.dresid_mid, NC);
  cpu::MatmulBackward(s.datty, g[kAttnOut], g[kAttnOutBias], s.dresid_mid, a.atty, p[kAttnOut], N,
                      d.Attn(), d.C);
  cpu::AttentionBackward(s.dqkv, s.datty, a.qkv, a.atty, a.att_lse, d.B, d.T, d.NH, d.HS);
  Zero(s.dln, NC);
  cpu::MatmulBackward(s.dln, g[kQkv], g[kQkvBias], s.dqkv, a.ln1, p[kQkv], N, d.C, 3 * d.Attn());
  RETURN_IF_ERROR(Reduce(all_reduce, s.dln, NC, "all-reduce of the attention input gradient"));
  cpu::LayerNormBackward(dx, g[kNorm1], g[kNorm1Bias], s.dln, x, p[kNorm1], a.ln1_mean, a.ln1_rstd,
                         N, d.C);
  return absl::OkStatus();
}

}  // namespace shardline::model
