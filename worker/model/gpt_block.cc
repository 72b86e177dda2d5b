#include "worker/model/gpt_block.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/rotary.h"

namespace shardline::model {
using enum TensorRole;

namespace {

absl::Status Reduce(const AllReduceFn& all_reduce, float* data, int64_t n, const char* what) {
  if (!all_reduce) return absl::OkStatus();
  return Annotate(all_reduce(data, n), what);
}

// The q/k/v projection as one matrix of QkvWidth rows: GPT-2's fused qkv.w, or grouped-query
// attention's q.w, k.w and v.w, which the tensor table lays out back to back (so are their
// gradients), so that one product fills the attention kernel's row of heads.
struct QkvWeights {
  float* weight = nullptr;
  const kernels::cpu::PackedWeight* packed = nullptr;
  float* bias = nullptr;
};

absl::StatusOr<QkvWeights> QkvOf(const BlockDims& d, const BlockParams& p) {
  if (p[kQkv] != nullptr) return QkvWeights{p[kQkv], p.packed(kQkv), p[kQkvBias]};
  const int64_t q_rows = int64_t{d.NH} * d.HS, kv_rows = int64_t{d.kv()} * d.HS;
  if (p[kQuery] == nullptr || p[kKey] != p[kQuery] + q_rows * d.C ||
      p[kValue] != p[kKey] + kv_rows * d.C) {
    return absl::InternalError("the block's q.w, k.w and v.w are not laid out back to back");
  }
  return QkvWeights{p[kQuery], p.packed(kQuery), nullptr};
}

// The MLP's input projection(s) and activation: fch_act = gelu(fc·x), or silu(gate·x)·(up·x).
absl::Status MlpIn(kernels::Backend& be, const BlockDims& d, const BlockParams& p, const float* x,
                   float* fch, float* fch_act) {
  const int N = static_cast<int>(d.N());
  const int64_t NF = d.N() * d.F;
  if (d.mlp == MlpKind::kGelu) {
    RETURN_IF_ERROR(be.Linear(fch, x, p[kMlpUp], p.packed(kMlpUp), p[kMlpUpBias], N, d.C, d.F));
    return be.Gelu(fch_act, fch, NF);
  }
  RETURN_IF_ERROR(be.Linear(fch, x, p[kMlpGate], p.packed(kMlpGate), nullptr, N, d.C, d.F));
  RETURN_IF_ERROR(be.Linear(fch + NF, x, p[kMlpUp], p.packed(kMlpUp), nullptr, N, d.C, d.F));
  return be.SwiGlu(fch_act, fch, fch + NF, NF);
}

absl::Status MlpActivation(kernels::Backend& be, const BlockDims& d, const float* fch,
                           float* fch_act) {
  const int64_t NF = d.N() * d.F;
  if (d.mlp == MlpKind::kGelu) return be.Gelu(fch_act, fch, NF);
  return be.SwiGlu(fch_act, fch, fch + NF, NF);
}

absl::Status Rotary(kernels::Backend& be, const BlockDims& d, float* qkv) {
  if (d.rope_inv_freq == nullptr) return absl::OkStatus();
  // The queries and keys are the first NH + KVH heads of each row: one pass turns both.
  return be.Rotary(qkv, d.QkvWidth(), static_cast<int>(d.N()), d.T, d.NH + d.kv(), d.HS,
                   d.rope_positions, d.rope_inv_freq);
}

}  // namespace

std::vector<float> RotaryFrequencies(const ModelConfig& config) {
  if (config.positions != PositionKind::kRotary) return {};
  const RopeScaling& r = config.rope_scaling;
  kernels::cpu::RotaryScaling scaling;
  if (r.enabled()) {
    scaling = {r.factor, r.low_freq_factor, r.high_freq_factor,
               static_cast<double>(r.original_max_positions)};
  }
  return kernels::cpu::RotaryInverseFrequencies(static_cast<int>(config.head_size()),
                                                config.rope_theta, scaling);
}

absl::Status NormForward(kernels::Backend& be, NormKind kind, float* out, float* mean, float* rstd,
                         const float* inp, const float* weight, const float* bias, int N, int C,
                         float eps) {
  if (kind == NormKind::kRmsNorm) return be.RmsNorm(out, rstd, inp, weight, N, C, eps);
  return be.LayerNorm(out, mean, rstd, inp, weight, bias, N, C, eps);
}

absl::Status NormBackward(kernels::Backend& be, NormKind kind, float* dinp, float* dweight,
                          float* dbias, const float* dout, const float* inp, const float* weight,
                          const float* mean, const float* rstd, int N, int C) {
  if (kind == NormKind::kRmsNorm) {
    return be.RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  return be.LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

absl::Status BlockForward(kernels::Backend& be, const BlockDims& d, const BlockParams& p,
                          const float* x, float* y, const BlockActivations& a,
                          const AllReduceFn& all_reduce, const AttentionFn& attention) {
  const int N = static_cast<int>(d.N());
  const int64_t NC = d.N() * d.C;
  ASSIGN_OR_RETURN(const QkvWeights qkv, QkvOf(d, p));
  // Attention half. The row-parallel projection's bias is added after the reduction, so that it
  // counts once however many ranks contributed partial sums.
  RETURN_IF_ERROR(NormForward(be, d.norm, a.ln1, a.ln1_mean, a.ln1_rstd, x, p[kNorm1],
                              p[kNorm1Bias], N, d.C, d.eps));
  RETURN_IF_ERROR(be.Linear(a.qkv, a.ln1, qkv.weight, qkv.packed, qkv.bias, N, d.C, d.QkvWidth()));
  RETURN_IF_ERROR(Rotary(be, d, a.qkv));
  if (attention) {
    RETURN_IF_ERROR(attention(a.qkv, a.atty));
  } else {
    RETURN_IF_ERROR(be.Attention(a.atty, a.att_lse, a.qkv, d.B, d.T, d.NH, d.kv(), d.HS));
  }
  if (all_reduce) {
    RETURN_IF_ERROR(
        be.Linear(a.resid_mid, a.atty, p[kAttnOut], p.packed(kAttnOut), nullptr, N, d.Attn(), d.C));
    RETURN_IF_ERROR(Reduce(all_reduce, a.resid_mid, NC, "all-reduce of the attention output"));
    if (p[kAttnOutBias] != nullptr)
      RETURN_IF_ERROR(be.BiasAdd(a.resid_mid, p[kAttnOutBias], N, d.C));
  } else {
    RETURN_IF_ERROR(be.Linear(a.resid_mid, a.atty, p[kAttnOut], p.packed(kAttnOut), p[kAttnOutBias],
                              N, d.Attn(), d.C));
  }
  RETURN_IF_ERROR(be.Residual(a.resid_mid, a.resid_mid, x, NC));

  // MLP half.
  RETURN_IF_ERROR(NormForward(be, d.norm, a.ln2, a.ln2_mean, a.ln2_rstd, a.resid_mid, p[kNorm2],
                              p[kNorm2Bias], N, d.C, d.eps));
  RETURN_IF_ERROR(MlpIn(be, d, p, a.ln2, a.fch, a.fch_gelu));
  if (all_reduce) {
    RETURN_IF_ERROR(
        be.Linear(y, a.fch_gelu, p[kMlpDown], p.packed(kMlpDown), nullptr, N, d.F, d.C));
    RETURN_IF_ERROR(Reduce(all_reduce, y, NC, "all-reduce of the MLP output"));
    if (p[kMlpDownBias] != nullptr) RETURN_IF_ERROR(be.BiasAdd(y, p[kMlpDownBias], N, d.C));
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
  // The kept q/k/v are already turned by the rotary positions: attention reruns on them as is.
  const int N = static_cast<int>(d.N());
  RETURN_IF_ERROR(NormForward(be, d.norm, a.ln1, a.ln1_mean, a.ln1_rstd, x, p[kNorm1],
                              p[kNorm1Bias], N, d.C, d.eps));
  RETURN_IF_ERROR(be.Attention(a.atty, a.att_lse, a.qkv, d.B, d.T, d.NH, d.kv(), d.HS));
  RETURN_IF_ERROR(NormForward(be, d.norm, a.ln2, a.ln2_mean, a.ln2_rstd, a.resid_mid, p[kNorm2],
                              p[kNorm2Bias], N, d.C, d.eps));
  return MlpActivation(be, d, a.fch, a.fch_gelu);
}

absl::Status BlockBackward(kernels::Backend& be, const BlockDims& d, const BlockParams& p,
                           const BlockParams& g, const float* x, const float* dy, float* dx,
                           const BlockActivations& a, const BlockGradScratch& s,
                           const AllReduceFn& all_reduce, const AllReduceFn& kv_grad_sum) {
  const int N = static_cast<int>(d.N());
  const int64_t NC = d.N() * d.C;
  const int64_t NF = d.N() * d.F;
  ASSIGN_OR_RETURN(const QkvWeights qkv, QkvOf(d, p));
  ASSIGN_OR_RETURN(const QkvWeights dqkv_weights, QkvOf(d, g));
  // Every kernel accumulates, so the scratch starts from zero.
  RETURN_IF_ERROR(be.Fill(s.dresid_mid, NC, 0.0f));
  RETURN_IF_ERROR(be.Fill(s.dln, NC, 0.0f));
  RETURN_IF_ERROR(be.Fill(s.dfch_gelu, NF, 0.0f));
  RETURN_IF_ERROR(be.Fill(s.dfch, d.N() * d.MlpWidth(), 0.0f));
  RETURN_IF_ERROR(be.Fill(s.datty, d.N() * d.Attn(), 0.0f));
  RETURN_IF_ERROR(be.Fill(s.dqkv, d.N() * d.QkvWidth(), 0.0f));

  // MLP half: y = r + down(act(in(norm2(r)))).
  RETURN_IF_ERROR(be.ResidualBackward(s.dresid_mid, nullptr, dy, NC));
  RETURN_IF_ERROR(be.LinearBackward(s.dfch_gelu, g[kMlpDown], g[kMlpDownBias], dy, a.fch_gelu,
                                    p[kMlpDown], N, d.F, d.C));
  if (d.mlp == MlpKind::kGelu) {
    RETURN_IF_ERROR(be.GeluBackward(s.dfch, a.fch, s.dfch_gelu, NF));
    RETURN_IF_ERROR(
        be.LinearBackward(s.dln, g[kMlpUp], g[kMlpUpBias], s.dfch, a.ln2, p[kMlpUp], N, d.C, d.F));
  } else {
    RETURN_IF_ERROR(be.SwiGluBackward(s.dfch, s.dfch + NF, a.fch, a.fch + NF, s.dfch_gelu, NF));
    RETURN_IF_ERROR(
        be.LinearBackward(s.dln, g[kMlpGate], nullptr, s.dfch, a.ln2, p[kMlpGate], N, d.C, d.F));
    RETURN_IF_ERROR(
        be.LinearBackward(s.dln, g[kMlpUp], nullptr, s.dfch + NF, a.ln2, p[kMlpUp], N, d.C, d.F));
  }
  // The column-parallel input was replicated in the forward, so its gradient is a sum over ranks.
  RETURN_IF_ERROR(Reduce(all_reduce, s.dln, NC, "all-reduce of the MLP input gradient"));
  RETURN_IF_ERROR(NormBackward(be, d.norm, s.dresid_mid, g[kNorm2], g[kNorm2Bias], s.dln,
                               a.resid_mid, p[kNorm2], a.ln2_mean, a.ln2_rstd, N, d.C));

  // Attention half: r = x + attn_proj(attention(rotary(qkv(norm1(x))))).
  RETURN_IF_ERROR(be.ResidualBackward(dx, nullptr, s.dresid_mid, NC));
  RETURN_IF_ERROR(be.LinearBackward(s.datty, g[kAttnOut], g[kAttnOutBias], s.dresid_mid, a.atty,
                                    p[kAttnOut], N, d.Attn(), d.C));
  RETURN_IF_ERROR(be.AttentionBackward(s.dqkv, s.datty, a.qkv, a.atty, a.att_lse, d.B, d.T, d.NH,
                                       d.kv(), d.HS));
  if (d.rope_inv_freq != nullptr) {
    RETURN_IF_ERROR(be.RotaryBackward(s.dqkv, d.QkvWidth(), N, d.T, d.NH + d.kv(), d.HS,
                                      d.rope_positions, d.rope_inv_freq));
  }
  RETURN_IF_ERROR(be.Fill(s.dln, NC, 0.0f));
  if (!kv_grad_sum) {
    RETURN_IF_ERROR(be.LinearBackward(s.dln, dqkv_weights.weight, dqkv_weights.bias, s.dqkv, a.ln1,
                                      qkv.weight, N, d.C, d.QkvWidth()));
  } else {
    // This micro-batch's weight gradient first alone, its key/value rows summed over the ranks
    // sharing those heads, then added (the input gradient needs no such sum: each rank's part
    // flows through its own query heads, and the all-reduce below adds them).
    const int64_t all_weights = int64_t{d.QkvWidth()} * d.C;
    const int64_t q_weights = int64_t{d.NH} * d.HS * d.C;
    RETURN_IF_ERROR(be.Fill(s.dqkv_weight, all_weights, 0.0f));
    RETURN_IF_ERROR(be.LinearBackward(s.dln, s.dqkv_weight, nullptr, s.dqkv, a.ln1, qkv.weight, N,
                                      d.C, d.QkvWidth()));
    RETURN_IF_ERROR(Reduce(kv_grad_sum, s.dqkv_weight + q_weights, all_weights - q_weights,
                           "all-reduce of the replicated key/value heads' gradient"));
    RETURN_IF_ERROR(be.Accumulate(dqkv_weights.weight, s.dqkv_weight, all_weights));
  }
  RETURN_IF_ERROR(Reduce(all_reduce, s.dln, NC, "all-reduce of the attention input gradient"));
  RETURN_IF_ERROR(NormBackward(be, d.norm, dx, g[kNorm1], g[kNorm1Bias], s.dln, x, p[kNorm1],
                               a.ln1_mean, a.ln1_rstd, N, d.C));
  return absl::OkStatus();
}

}  // namespace shardline::model
