// GptModel: a GPT-2-style decoder on one CPU device — parameters, gradients, the forward to the
// loss, the backward to every parameter, and the AdamW step.
//
// Parameters live in one contiguous f32 buffer laid out by ParamLayout (named tensors, the names
// our checkpoints use); gradients are a second buffer with the same layout. Both, the activations
// and the optimizer moments come from the Allocator passed in, so its stats account for them.
//
// The forward and backward are exposed both whole (Forward/Backward) and by stage, so that a
// pipeline stage can run only the embedding, a range of blocks, or the head:
//   PrepareBatch(B,T) or EmbedForward(tokens,B,T) → residual(0)
//   BlocksForward(first,last): residual(first) → residual(last)
//   HeadForward(): residual(layers) → logits;  LossForward(targets) → mean loss
//   HeadBackward(): dlogits → residual_grad(layers)   (needs LossForward)
//   BlocksBackward(first,last): residual_grad(last) → residual_grad(first), parameter grads
//   EmbedBackward(): residual_grad(0) → wte, wpe grads
// A stage that receives activations writes residual(first) (or residual_grad(last)) itself.
//
// Thread-safety: none; one thread drives a model. The kernels thread internally (OpenMP,
// OpenBLAS), and results are bit-identical run to run for a given thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/tensor.h"
#include "model/model_config.h"
#include "worker/model/activations.h"
#include "worker/model/param_layout.h"
#include "worker/model/trainable_gpt.h"

namespace shardline::model {

class GptModel final {
 public:
  // A model of `config` with zeroed parameters (call InitGpt2 or load a checkpoint). InvalidArgument
  // when the config is invalid or `allocator` is not a CPU allocator; ResourceExhausted when the
  // parameters do not fit. `allocator` must outlive the model.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const ModelConfig& config,
                                                          kernels::Allocator& allocator);

  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  kernels::Allocator& allocator() const { return *allocator_; }
  // The CPU backend over allocator(), that the blocks run on.
  kernels::Backend& backend() const { return backend_; }

  // name → offset, shape for every parameter tensor, in buffer order (for checkpoints).
  const std::vector<ParamTensorInfo>& NamedTensors() const { return layout_.tensors(); }
  int64_t num_params() const { return layout_.total(); }
  std::span<float> params() { return {params_.data<float>(), size_t(num_params())}; }
  std::span<const float> params() const { return {params_.data<float>(), size_t(num_params())}; }
  std::span<float> grads() { return {grads_.data<float>(), size_t(num_params())}; }
  std::span<const float> grads() const { return {grads_.data<float>(), size_t(num_params())}; }
  // One named tensor of the parameters or gradients, flattened; NotFound names the tensor.
  absl::StatusOr<std::span<float>> Param(const std::string& name);
  absl::StatusOr<std::span<float>> Grad(const std::string& name);
  // A Tensor view (shape as in NamedTensors) sharing the parameter buffer.
  absl::StatusOr<kernels::Tensor> ParamTensor(const std::string& name) const;

  // Pointers to layer l's parameters and to the outer tensors. Read-only through a const model.
  BlockParams BlockParamsView(int layer) const;
  OuterParams OuterParamsView() const;

  // GPT-2's initialisation (FillGpt2Init). Clears the optimizer state.
  void InitGpt2(uint64_t seed);
  // Gradients accumulate over Backward calls (micro-batches) until this sets them to zero.
  void ZeroGrad();

  // The whole forward: tokens and targets are (B,T) row-major; a negative target ignores its
  // position (no loss, no gradient). Returns the mean loss over the positions not ignored (0 when
  // all are). Errors, before any work: T > max_seq_len, sizes that disagree, tokens or targets
  // outside the vocabulary.
  absl::StatusOr<float> Forward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                int B, int T);
  // The forward to the logits only (no loss; Backward is then a FailedPrecondition).
  absl::Status ForwardLogits(std::span<const int32_t> tokens, int B, int T);
  // The whole backward of the last Forward: accumulates into grads().
  absl::Status Backward();

  // By stage (see the top of this file). Block ranges are [first, last) with
  // 0 <= first <= last <= layers.
  absl::Status PrepareBatch(int B, int T);
  absl::Status EmbedForward(std::span<const int32_t> tokens, int B, int T);
  absl::Status BlocksForward(int first, int last);
  absl::Status HeadForward();
  absl::StatusOr<float> LossForward(std::span<const int32_t> targets);
  absl::Status HeadBackward();
  absl::Status BlocksBackward(int first, int last);
  absl::Status EmbedBackward();
  // (B,T,C) of the current batch: the input of block l (l == layers: the last block's output),
  // and its gradient. Null before PrepareBatch.
  float* Residual(int layer);
  float* ResidualGrad(int layer);

  // (B,T,V) logits of the last forward; empty before any.
  std::span<const float> Logits() const;
  int batch() const { return acts_.B(); }
  int seq_len() const { return acts_.T(); }

  // One optimizer step on the accumulated gradients: clip to options.max_grad_norm, then AdamW
  // with `step` (1-based) for bias correction. Returns the gradient norm before clipping. When the
  // norm is not finite the parameters are left untouched (the caller should skip the step).
  absl::StatusOr<double> AdamWStep(const AdamWOptions& options, int64_t step);

  absl::Status CopyState(std::span<float> out);
  absl::Status LoadState(std::span<const float> params, std::span<const float> exp_avg,
                         std::span<const float> exp_avg_sq);
  int64_t PeakBytes() const { return static_cast<int64_t>(allocator_->stats().peak_bytes); }

  // Inference: the forward to the logits into `acts` (allocated for (B,T) with this config; grads
  // not needed), without touching the model's own training state.
  absl::Status ForwardInto(GptActivations& acts, std::span<const int32_t> tokens, int B,
                           int T) const;

 private:
  GptModel(const ModelConfig& config, kernels::Allocator& allocator);

  absl::Status CheckRange(int first, int last, const char* what) const;
  BlockDims Dims(int B, int T) const;
  void Embed(GptActivations& acts, const int32_t* tokens) const;
  void Blocks(GptActivations& acts, int first, int last) const;
  void Head(GptActivations& acts) const;

  ModelConfig config_;
  ParamLayout layout_;
  kernels::Allocator* allocator_;
  mutable kernels::cpu::CpuBackend backend_;
  kernels::Tensor params_;  // (num_params) f32
  kernels::Tensor grads_;   // (num_params) f32, same layout
  kernels::Tensor adam_m_;  // (num_params) f32, allocated at the first AdamWStep
  kernels::Tensor adam_v_;

  GptActivations acts_;             // sized for the current batch
  std::vector<int32_t> tokens_;     // (B,T) of the current batch, for the embedding's backward
  std::vector<int32_t> targets_;    // (B,T) of the last LossForward
  bool have_logits_ = false;
  bool have_loss_ = false;
};

}  // namespace shardline::model
