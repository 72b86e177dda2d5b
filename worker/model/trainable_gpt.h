// TrainableGpt: the single-device GPT's training interface, which GptModel (CPU, f32; the tests'
// reference) implements with its parameters in the buffer layout of ParamLayout. Training itself
// runs the one engine (worker/model/sharded_gpt.h) on any backend.
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

class TrainableGpt {
 public:
  virtual ~TrainableGpt() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const ParamLayout& layout() const = 0;

  // GPT-2's initialisation (FillGpt2Init), the same values on every device; clears the optimizer
  // state.
  virtual void InitGpt2(uint64_t seed) = 0;
  // Gradients accumulate over Backward calls (micro-batches) until this sets them to zero.
  virtual void ZeroGrad() = 0;
  // The forward to the mean loss over the targets that are not negative; errors before any work
  // for sizes that disagree or tokens/targets outside the vocabulary.
  virtual absl::StatusOr<float> Forward(std::span<const int32_t> tokens,
                                        std::span<const int32_t> targets, int B, int T) = 0;
  // The backward of the last Forward, accumulating into the gradients.
  virtual absl::Status Backward() = 0;
  // Clip to options.max_grad_norm, then AdamW with `step` (1-based). Returns the norm before
  // clipping; a non-finite norm leaves the parameters untouched.
  virtual absl::StatusOr<double> AdamWStep(const AdamWOptions& options, int64_t step) = 0;

  // The parameters in host memory, in ParamLayout order: the model's own buffer on the CPU, a
  // copy (taken after the work queued so far) on a device. Valid until the next call on the model.
  virtual absl::StatusOr<std::span<const float>> HostParams() = 0;
  // The whole training state copied into `out`, which holds 3 × num_params floats: the parameters,
  // then AdamW's first and second moments (zero before the first AdamWStep), each in ParamLayout
  // order (WholeModelPieces' order). On a device it waits for the work queued so far.
  virtual absl::Status CopyState(std::span<float> out) = 0;
  // Replaces the parameters and, when `exp_avg` and `exp_avg_sq` are given (both, ParamLayout
  // order), the AdamW moments; when they are empty the optimizer state is cleared. InvalidArgument
  // on a size mismatch, before anything changes.
  virtual absl::Status LoadState(std::span<const float> params, std::span<const float> exp_avg,
                                 std::span<const float> exp_avg_sq) = 0;
  // The most bytes the model's allocator has held at once (parameters, gradients, optimizer
  // state, activations).
  virtual int64_t PeakBytes() const = 0;
};

// Fills `params` (ParamLayout order) with GPT-2's initialisation, deterministic in `seed` whatever
// the thread count: every weight matrix and embedding ~ N(0, 0.02), the residual projections
// (attn_proj.w, fc_proj.w) scaled by 1/√(2·layers), LayerNorm weights 1, biases and LayerNorm
// biases 0.
void FillGpt2Init(const ParamLayout& layout, int layers, uint64_t seed, std::span<float> params);

// LoadState's argument check, shared by every model: `params` has `num_params` values and the
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
