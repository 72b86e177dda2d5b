// What training a GPT takes besides the engine: AdamW's options (the clip norm and which tensors
// decay) and GPT-2's initialisation of a ParamLayout buffer. Both are the engine's on every plan
// (ShardedGpt takes the options, draws the initialisation by global element).
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

}  // namespace shardline::model
