// OneRankGpt: the engine on one rank — ShardedGpt at tp = pp = dp = 1, with no communicator — fed
// whole batches of tokens, its state read back as whole tensors. What single-device callers train
// with: the sharded tests' reference run, the comparisons against PyTorch, the benchmarks and
// gradient checks. (`shardline train` builds the same ShardedGpt from its spec: trainer.cc.)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/model_config.h"
#include "placement/parallel_layout.h"
#include "worker/model/model_params.h"
#include "worker/model/sharded_gpt.h"
#include "worker/model/training_recipe.h"

namespace shardline::model {

struct OneRankOptions {
  ModelConfig config;
  int batch = 1;  // sequences per step
  int seq_len = 1;
  int micro_batch = 0;  // sequences per micro-batch (gradients accumulate); 0: the whole batch
  placement::RecomputeMode recompute = placement::RecomputeMode::kNone;
  AdamWOptions adamw;  // learning_rate is given per step
};

class OneRankGpt {
 public:
  // InvalidArgument for a config the engine cannot run, a seq_len past max_seq_len, or a
  // micro_batch that does not divide the batch. `backend` must outlive the model.
  static absl::StatusOr<std::unique_ptr<OneRankGpt>> Create(const OneRankOptions& options,
                                                            kernels::Backend& backend);

  const OneRankOptions& options() const { return options_; }
  ShardedGpt& engine() { return *gpt_; }

  // GPT-2's initialisation (ModelParams::Gpt2Init's values); clears the optimizer state.
  absl::Status InitGpt2(uint64_t seed);
  // Loads `params` (of this model's config), clearing the optimizer state.
  absl::Status Load(const ModelParams& params);

  // One training step (1-based `step`, for AdamW's bias correction) on (batch, seq_len) tokens
  // and targets, row-major; a negative target is ignored (the loss is the mean over every
  // position, an ignored one counting 0: ShardedGpt's). A learning rate of 0 leaves the
  // parameters as they were (the step's loss is then the forward's at them). Errors name the
  // sizes, or the token outside the vocabulary.
  absl::StatusOr<StepStats> Step(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                 int64_t step, float learning_rate);

  // The parameters, and with them AdamW's moments (zeros before the first step), as whole
  // tensors in ParamLayout order.
  struct State {
    ModelParams params, exp_avg, exp_avg_sq;
  };
  absl::StatusOr<State> TrainingState() const;
  absl::StatusOr<ModelParams> Params() const;

 private:
  OneRankGpt(const OneRankOptions& options, std::unique_ptr<ShardedGpt> gpt)
      : options_(options), gpt_(std::move(gpt)) {}
  OneRankOptions options_;
  std::unique_ptr<ShardedGpt> gpt_;
};

}  // namespace shardline::model
