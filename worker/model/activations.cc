#include "worker/model/activations.h"

#include "common/status_macros.h"
#include "worker/model/carver.h"

namespace shardline::model {
namespace {

void Carve(const GptConfig& config, int B, int T, bool with_grads, Carver& c,
           GptActivations& acts) {
  const int64_t N = int64_t{B} * T;
  const int64_t C = config.d_model;
  const int64_t F = config.ff();
  const int64_t V = config.vocab;
  acts.residual.assign(config.layers + 1, nullptr);
  for (float*& r : acts.residual) r = c.Take(N * C);
  acts.blocks.assign(config.layers, BlockActivations{});
  for (BlockActivations& b : acts.blocks) {
    b.ln1 = c.Take(N * C);
    b.ln1_mean = c.Take(N);
    b.ln1_rstd = c.Take(N);
    b.qkv = c.Take(N * 3 * C);
    b.atty = c.Take(N * C);
    b.att_lse = c.Take(N * config.heads);
    b.resid_mid = c.Take(N * C);
    b.ln2 = c.Take(N * C);
    b.ln2_mean = c.Take(N);
    b.ln2_rstd = c.Take(N);
    b.fch = c.Take(N * F);
    b.fch_gelu = c.Take(N * F);
  }
  acts.lnf = c.Take(N * C);
  acts.lnf_mean = c.Take(N);
  acts.lnf_rstd = c.Take(N);
  acts.logits = c.Take(N * V);
  acts.losses = c.Take(N);
  acts.lse = c.Take(N);
  acts.dresidual.clear();
  acts.scratch = BlockGradScratch{};
  acts.dlnf = acts.dlogits = acts.dlosses = nullptr;
  if (!with_grads) return;
  acts.dresidual.assign(config.layers + 1, nullptr);
  for (float*& r : acts.dresidual) r = c.Take(N * C);
  acts.scratch.dresid_mid = c.Take(N * C);
  acts.scratch.dln = c.Take(N * C);
  acts.scratch.dfch_gelu = c.Take(N * F);
  acts.scratch.dfch = c.Take(N * F);
  acts.scratch.datty = c.Take(N * C);
  acts.scratch.dqkv = c.Take(N * 3 * C);
  acts.dlnf = c.Take(N * C);
  acts.dlogits = c.Take(N * V);
  acts.dlosses = c.Take(N);
}

}  // namespace

absl::StatusOr<GptActivations> GptActivations::Allocate(const GptConfig& config, int B, int T,
                                                        bool with_grads,
                                                        kernels::Allocator& allocator) {
  GptActivations acts;
  Carver counter(nullptr);
  Carve(config, B, T, with_grads, counter, acts);
  ASSIGN_OR_RETURN(acts.buffer_, kernels::Tensor::Zeros({counter.used()}, DType::kFloat32,
                                                        allocator));
  Carver carver(acts.buffer_.data<float>());
  Carve(config, B, T, with_grads, carver, acts);
  acts.B_ = B;
  acts.T_ = T;
  acts.with_grads_ = with_grads;
  return acts;
}

}  // namespace shardline::model
