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
  cpu::LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, N, d.C);
  cpu::LinearForward(a.qkv, a.ln1, p.qkv_w, p.qkv_w_packed, p.qkv_b, N, d.C, 3 * d.Attn());
  if (attention) {
    RETURN_IF_ERROR(attention(a.qkv, a.atty));
  } else {
    cpu::AttentionForward(a.atty, a.att_lse, a.qkv, d.B, d.T, d.NH, d.HS);
  }
  if (all_reduce) {
    cpu::LinearForward(a.resid_mid, a.atty, p.attn_proj_w, p.attn_proj_w_packed, nullptr, N,
                       d.Attn(), d.C);
    RETURN_IF_ERROR(Reduce(all_reduce, a.resid_mid, NC, "all-reduce of the attention output"));
    cpu::BiasAddForward(a.resid_mid, p.attn_proj_b, N, d.C);
  } else {
    cpu::LinearForward(a.resid_mid, a.atty, p.attn_proj_w, p.attn_proj_w_packed, p.attn_proj_b, N,
                       d.Attn(), d.C);
  }
  cpu::ResidualForward(a.resid_mid, a.resid_mid, x, NC);

  // MLP half.
  cpu::LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.resid_mid, p.ln2_w, p.ln2_b, N, d.C);
  cpu::LinearForward(a.fch, a.ln2, p.fc_w, p.fc_w_packed, p.fc_b, N, d.C, d.F);
  cpu::GeluForward(a.fch_gelu, a.fch, d.N() * d.F);
  if (all_reduce) {
    cpu::LinearForward(y, a.fch_gelu, p.fc_proj_w, p.fc_proj_w_packed, nullptr, N, d.F, d.C);
    RETURN_IF_ERROR(Reduce(all_reduce, y, NC, "all-reduce of the MLP output"));
    cpu::BiasAddForward(y, p.fc_proj_b, N, d.C);
  } else {
    cpu::LinearForward(y, a.fch_gelu, p.fc_proj_w, p.fc_proj_w_packed, p.fc_proj_b, N, d.F, d.C);
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
  cpu::LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, N, d.C);
  cpu::AttentionForward(a.atty, a.att_lse, a.qkv, d.B, d.T, d.NH, d.HS);
  cpu::LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.resid_mid, p.ln2_w, p.ln2_b, N, d.C);
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
  cpu::MatmulBackward(s.dfch_gelu, g.fc_proj_w, g.fc_proj_b, dy, a.fch_gelu, p.fc_proj_w, N, d.F,
                      d.C);
  cpu::GeluBackward(s.dfch, a.fch, s.dfch_gelu, d.N() * d.F);
  cpu::MatmulBackward(s.dln, g.fc_w, g.fc_b, s.dfch, a.ln2, p.fc_w, N, d.C, d.F);
  // The column-parallel input was replicated in the forward, so its gradient is a sum over ranks.
  RETURN_IF_ERROR(Reduce(all_reduce, s.dln, NC, "all-reduce of the MLP input gradient"));
  cpu::LayerNormBackward(s.dresid_mid, g.ln2_w, g.ln2_b, s.dln, a.resid_mid, p.ln2_w, a.ln2_mean,
                         a.ln2_rstd, N, d.C);

  // Attention half: r = x + attn_proj(attention(qkv(ln1(x)))).
  cpu::ResidualBackward(dx, nullptr, s.dresid_mid, NC);
  cpu::MatmulBackward(s.datty, g.attn_proj_w, g.attn_proj_b, s.dresid_mid, a.atty, p.attn_proj_w, N,
                      d.Attn(), d.C);
  cpu::AttentionBackward(s.dqkv, s.datty, a.qkv, a.atty, a.att_lse, d.B, d.T, d.NH, d.HS);
  Zero(s.dln, NC);
  cpu::MatmulBackward(s.dln, g.qkv_w, g.qkv_b, s.dqkv, a.ln1, p.qkv_w, N, d.C, 3 * d.Attn());
  RETURN_IF_ERROR(Reduce(all_reduce, s.dln, NC, "all-reduce of the attention input gradient"));
  cpu::LayerNormBackward(dx, g.ln1_w, g.ln1_b, s.dln, x, p.ln1_w, a.ln1_mean, a.ln1_rstd, N, d.C);
  return absl::OkStatus();
}

}  // namespace shardline::model
