#include "worker/model/activations.h"

#include "common/status_macros.h"
#include "worker/model/carver.h"

namespace shardline::model {
namespace {

void Carve(const ModelConfig& config, int B, int T, bool with_grads, Carver& c,
           GptActivations& acts) {
  const int64_t N = int64_t{B} * T;
  const int64_t C = config.d_model;
  const int64_t V = config.vocab;
  acts.residual.assign(config.layers + 1, nullptr);
  for (float*& r : acts.residual) r = c.Take(N * C);
  acts.blocks.assign(config.layers, BlockActivations{});
  const BlockDims dims{B,
                       T,
                       static_cast<int>(config.d_model),
                       static_cast<int>(config.heads),
                       static_cast<int>(config.head_size()),
                       static_cast<int>(config.ff())};
  for (BlockActivations& b : acts.blocks) CarveBlockActivations(c, dims, b);
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
  CarveBlockGradScratch(c, dims, acts.scratch);
  acts.dlnf = c.Take(N * C);
  acts.dlogits = c.Take(N * V);
  acts.dlosses = c.Take(N);
}

}  // namespace

absl::StatusOr<GptActivations> GptActivations::Allocate(const ModelConfig& config, int B, int T,
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
