#include "worker/model/gpt_block.h"

#include <algorithm>

#include "common/status_macros.h"

namespace shardline::model {
using enum TensorRole;

namespace {

absl::Status Reduce(const AllReduceFn& all_reduce, float* data, int64_t n, const char* what) {
  if (!all_reduce) return absl::OkStatus();
  return Annotate(all_reduce(data, n), what);
}

}  // namespace

absl::Status BlockForward(kernels::Backend& be, const BlockDims& d, const BlockParams& p,
                          const float* x, float* y, const BlockActivations& a,
                          const AllReduceFn& all_reduce, const AttentionFn& attention) {
  const int N = static_cast<int>(d.N());
  const int64_t NC = d.N() * d.C;
  // Attention half. The row-parallel projection's bias is added after the reduction, so that it
  // counts once however many ranks contributed partial sums.
  RETURN_IF_ERROR(
      be.LayerNorm(a.ln1, a.ln1_mean, a.ln1_rstd, x, p[kNorm1], p[kNorm1Bias], N, d.C, d.eps));
  RETURN_IF_ERROR(
      be.Linear(a.qkv, a.ln1, p[kQkv], p.packed(kQkv), p[kQkvBias], N, d.C, 3 * d.Attn()));
  if (attention) {
    RETURN_IF_ERROR(attention(a.qkv, a.atty));
  } else {
    RETURN_IF_ERROR(be.Attention(a.atty, a.att_lse, a.qkv, d.B, d.T, d.NH, d.HS));
  }
  if (all_reduce) {
    RETURN_IF_ERROR(
        be.Linear(a.resid_mid, a.atty, p[kAttnOut], p.packed(kAttnOut), nullptr, N, d.Attn(), d.C));
    RETURN_IF_ERROR(Reduce(all_reduce, a.resid_mid, NC, "all-reduce of the attention output"));
    RETURN_IF_ERROR(be.BiasAdd(a.resid_mid, p[kAttnOutBias], N, d.C));
  } else {
    RETURN_IF_ERROR(be.Linear(a.resid_mid, a.atty, p[kAttnOut], p.packed(kAttnOut), p[kAttnOutBias],
                              N, d.Attn(), d.C));
  }
  RETURN_IF_ERROR(be.Residual(a.resid_mid, a.resid_mid, x, NC));

  // MLP half.
  RETURN_IF_ERROR(be.LayerNorm(a.ln2, a.ln2_mean, a.ln2_rstd, a.resid_mid, p[kNorm2], p[kNorm2Bias],
                               N, d.C, d.eps));
  RETURN_IF_ERROR(be.Linear(a.fch, a.ln2, p[kMlpUp], p.packed(kMlpUp), p[kMlpUpBias], N, d.C, d.F));
  RETURN_IF_ERROR(be.Gelu(a.fch_gelu, a.fch, d.N() * d.F));
  if (all_reduce) {
    RETURN_IF_ERROR(
        be.Linear(y, a.fch_gelu, p[kMlpDown], p.packed(kMlpDown), nullptr, N, d.F, d.C));
    RETURN_IF_ERROR(Reduce(all_reduce, y, NC, "all-reduce of the MLP output"));
    RETURN_IF_ERROR(be.BiasAdd(y, p[kMlpDownBias], N, d.C));
  } else {
    RETURN_IF_ERROR(
        be.Linear(y, a.fch_gelu, p[kMlpDown], p.packed(kMlpDown), p[kMlpDownBias], N, d.F, d.C));
  }
  RETURN_IF_ERROR(be.Residual(y, y, a.resid_mid, NC));
  return absl::OkStatus();
}

absl::Status RecomputeBlock(kernels::Backend& be, placement::RecomputeMode mode, const BlockDims& d,
                            const BlockParams& p, const float* x, float* y,
                            const BlockActivations& a, const AllReduceFn& all_reduce) {
  switch (mode) {
    case placement::RecomputeMode::kNone:
      return absl::OkStatus();
    case placement::RecomputeMode::kFull:
      return BlockForward(be, d, p, x, y, a, all_reduce);
    case placement::RecomputeMode::kSelective:
      break;
  }
  const int N = static_cast<int>(d.N());
  RETURN_IF_ERROR(
      be.LayerNorm(a.ln1, a.ln1_mean, a.ln1_rstd, x, p[kNorm1], p[kNorm1Bias], N, d.C, d.eps));
  RETURN_IF_ERROR(be.Attention(a.atty, a.att_lse, a.qkv, d.B, d.T, d.NH, d.HS));
  RETURN_IF_ERROR(be.LayerNorm(a.ln2, a.ln2_mean, a.ln2_rstd, a.resid_mid, p[kNorm2], p[kNorm2Bias],
                               N, d.C, d.eps));
  RETURN_IF_ERROR(be.Gelu(a.fch_gelu, a.fch, d.N() * d.F));
  return absl::OkStatus();
}

absl::Status BlockBackward(kernels::Backend& be, const BlockDims& d, const BlockParams& p,
                           const BlockParams& g, const float* x, const float* dy, float* dx,
                           const BlockActivations& a, const BlockGradScratch& s,
                           const AllReduceFn& all_reduce) {
  const int N = static_cast<int>(d.N());
  const int64_t NC = d.N() * d.C;
  // Every kernel accumulates, so the scratch starts from zero.
  RETURN_IF_ERROR(be.Fill(s.dresid_mid, NC, 0.0f));
  RETURN_IF_ERROR(be.Fill(s.dln, NC, 0.0f));
  RETURN_IF_ERROR(be.Fill(s.dfch_gelu, d.N() * d.F, 0.0f));
  RETURN_IF_ERROR(be.Fill(s.dfch, d.N() * d.F, 0.0f));
  RETURN_IF_ERROR(be.Fill(s.datty, d.N() * d.Attn(), 0.0f));
  RETURN_IF_ERROR(be.Fill(s.dqkv, d.N() * 3 * d.Attn(), 0.0f));

  // MLP half: y = r + fc_proj(gelu(fc(ln2(r)))).
  RETURN_IF_ERROR(be.ResidualBackward(s.dresid_mid, nullptr, dy, NC));
  RETURN_IF_ERROR(be.LinearBackward(s.dfch_gelu, g[kMlpDown], g[kMlpDownBias], dy, a.fch_gelu,
                                    p[kMlpDown], N, d.F, d.C));
  RETURN_IF_ERROR(be.GeluBackward(s.dfch, a.fch, s.dfch_gelu, d.N() * d.F));
  RETURN_IF_ERROR(
      be.LinearBackward(s.dln, g[kMlpUp], g[kMlpUpBias], s.dfch, a.ln2, p[kMlpUp], N, d.C, d.F));
  // The column-parallel input was replicated in the forward, so its gradient is a sum over ranks.
  RETURN_IF_ERROR(Reduce(all_reduce, s.dln, NC, "all-reduce of the MLP input gradient"));
  RETURN_IF_ERROR(be.LayerNormBackward(s.dresid_mid, g[kNorm2], g[kNorm2Bias], s.dln, a.resid_mid,
                                       p[kNorm2], a.ln2_mean, a.ln2_rstd, N, d.C));

  // Attention half: r = x + attn_proj(attention(qkv(ln1(x)))).
  RETURN_IF_ERROR(be.ResidualBackward(dx, nullptr, s.dresid_mid, NC));
  RETURN_IF_ERROR(be.LinearBackward(s.datty, g[kAttnOut], g[kAttnOutBias], s.dresid_mid, a.atty,
                                    p[kAttnOut], N, d.Attn(), d.C));
  RETURN_IF_ERROR(
      be.AttentionBackward(s.dqkv, s.datty, a.qkv, a.atty, a.att_lse, d.B, d.T, d.NH, d.HS));
  RETURN_IF_ERROR(be.Fill(s.dln, NC, 0.0f));
  RETURN_IF_ERROR(
      be.LinearBackward(s.dln, g[kQkv], g[kQkvBias], s.dqkv, a.ln1, p[kQkv], N, d.C, 3 * d.Attn()));
  RETURN_IF_ERROR(Reduce(all_reduce, s.dln, NC, "all-reduce of the attention input gradient"));
  RETURN_IF_ERROR(be.LayerNormBackward(dx, g[kNorm1], g[kNorm1Bias], s.dln, x, p[kNorm1],
                                       a.ln1_mean, a.ln1_rstd, N, d.C));
  return absl::OkStatus();
}

}  // namespace shardline::model
