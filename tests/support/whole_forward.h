// The logits of the training forward's own layers — EmbeddingForward, BlockForward with causal
// attention over each row, HeadForward — over whole sequences on one CPU rank: the reference that
// inference's paged, cached forward (and the checkpoint imports) are tested against. It composes
// the engine's layers; it is not a model of its own.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "worker/model/carver.h"
#include "worker/model/embedding_head.h"
#include "worker/model/gpt_block.h"
#include "worker/model/model_params.h"

namespace shardline::testing {

// (B, T, vocab) logits of `tokens` (B rows of T, positions 0..T-1). `backend` must compute in
// host memory (the CPU's).
inline absl::StatusOr<std::vector<float>> WholeForwardLogits(const model::ModelParams& params,
                                                             kernels::Backend& backend,
                                                             std::span<const int32_t> tokens, int B,
                                                             int T) {
  const model::ModelConfig& c = params.config();
  RETURN_IF_ERROR(c.CheckTokens(tokens, B, T));
  const int N = B * T, C = static_cast<int>(c.d_model), V = static_cast<int>(c.vocab);
  model::BlockDims dims = model::BlockDims::Of(c, B, T, static_cast<int>(c.heads),
                                               static_cast<int>(c.kv()), static_cast<int>(c.ff()));
  const std::vector<float> inv_freq = model::RotaryFrequencies(c);
  if (!inv_freq.empty()) dims.rope_inv_freq = inv_freq.data();
  const model::OuterParams outer = params.Outer();
  std::vector<float> x(static_cast<size_t>(N) * C), y(x.size());
  RETURN_IF_ERROR(model::EmbeddingForward(
      backend, {.wte = outer.wte, .wpe = outer.wpe, .vocab_begin = 0, .vocab_end = V},
      tokens.data(), nullptr, N, T, C, x.data(), nullptr));
  model::Carver count(nullptr);
  model::BlockActivations acts;
  model::CarveBlockActivations(count, dims, acts);
  std::vector<float> block_buffer(static_cast<size_t>(count.used()));
  model::Carver carve(block_buffer.data());
  model::CarveBlockActivations(carve, dims, acts);
  for (int l = 0; l < c.layers; ++l) {
    RETURN_IF_ERROR(model::BlockForward(backend, dims, params.Block(l), x.data(), y.data(), acts));
    std::swap(x, y);
  }
  std::vector<float> norm(x.size()), mean(N), rstd(N), logits(static_cast<size_t>(N) * V);
  RETURN_IF_ERROR(model::HeadForward(
      backend,
      {.norm_w = outer.lnf_w,
       .norm_b = outer.lnf_b,
       .norm = c.norm,
       .head = outer.lm_head,
       .vocab_begin = 0,
       .vocab_end = V,
       .eps = static_cast<float>(c.norm_eps)},
      x.data(), N, C,
      {.norm = norm.data(), .mean = mean.data(), .rstd = rstd.data(), .logits = logits.data()}));
  RETURN_IF_ERROR(backend.Synchronize());
  return logits;
}

}  // namespace shardline::testing
