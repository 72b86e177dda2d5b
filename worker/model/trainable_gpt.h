// What training a GPT needs besides the model: AdamW's options (the clip norm and which tensors
// decay), GPT-2's initialisation of a ParamLayout buffer, and the single-device model's state
// checks and mean loss. Training itself runs the one engine (worker/model/sharded_gpt.h) on any
// backend; GptModel (gpt.h), the tests' single-device reference, uses the rest.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/optimizer.h"
#include "model/model_config.h"
#include "worker/model/param_layout.h"

namespace shardline::model {

struct AdamWOptions {
  // Decoupled weight decay applies to matrices (the 2-D tensors: embeddings and linear weights)
  // and not to biases or LayerNorm parameters, as GPT-2 training recipes (nanoGPT) do.
  kernels::cpu::AdamWConfig adamw;
  // Gradients are clipped to this global L2 norm first; <= 0 turns clipping off.
  double max_grad_norm = 1.0;

  // The AdamW hyper-parameters of one tensor: weight decay only on matrices.
  kernels::cpu::AdamWConfig For(const ParamTensorInfo& tensor) const {
    kernels::cpu::AdamWConfig config = adamw;
    if (tensor.shape.size() < 2) config.weight_decay = 0.0f;
    return config;
  }
};

// Fills `params` (ParamLayout order) with GPT-2's initialisation, deterministic in `seed` whatever
// the thread count: every weight matrix and embedding ~ N(0, 0.02), the residual projections
// (attn_proj.w, fc_proj.w) scaled by 1/√(2·layers), LayerNorm weights 1, biases and LayerNorm
// biases 0.
void FillGpt2Init(const ParamLayout& layout, int layers, uint64_t seed, std::span<float> params);

// GptModel::LoadState's argument check: `params` has `num_params` values and the
// moments either both as many or both none. InvalidArgument prefixed by `where`.
absl::Status CheckStateSizes(int64_t num_params, std::span<const float> params,
                             std::span<const float> exp_avg, std::span<const float> exp_avg_sq,
                             const char* where);

// The mean of losses[n] over the positions whose target is not negative (0 when none is), summed
// in double so the loss does not depend on how many rows round the same way; writes dlosses[n],
// the gradient of that mean (1/count, or 0 for an ignored position).
float MeanLoss(std::span<const float> losses, std::span<const int32_t> targets,
               std::span<float> dlosses);

}  // namespace shardline::model
