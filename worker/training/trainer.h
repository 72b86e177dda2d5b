// The single-device training loop behind `shardline train`: model, data, AdamW, progress and
// checkpoints, all decided by a TrainSpec. Sharded training builds on the same pieces.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "placement/train_spec.h"
#include "worker/model/data/text_dataset.h"
#include "worker/model/gpt_config.h"
#include "worker/model/trainable_gpt.h"

namespace shardline::training {

struct TrainProgress {
  int64_t step = 0;  // 1-based, the step just finished
  int64_t steps = 0;
  float loss = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;  // over the steps since the last report
  double elapsed_seconds = 0;
  double eta_seconds = 0;
  std::string checkpoint;  // the file written after this step, if any
};

struct TrainResult {
  std::vector<float> losses;  // one per step
  std::string checkpoint;     // the last file written; empty when checkpoints are off
  int64_t peak_bytes = 0;     // the allocator's peak
};

// The dataset a spec's data section names: its text file, or the built-in synthetic corpus.
absl::StatusOr<data::TextDataset> LoadTrainingData(const placement::DataSpec& spec);
// The model config of a spec's model section.
model::GptConfig ModelConfigOf(const placement::ModelSpec& spec);
// The model a spec trains, with zeroed parameters: a GptModel on `cpu_allocator` (which must
// outlive it) for device cpu, a CudaGptModel for cuda:N in the spec's precision. Errors name the
// device: FailedPrecondition when it is not usable (CUDA's reason) or this build has no CUDA.
absl::StatusOr<std::unique_ptr<model::TrainableGpt>> CreateModel(
    const placement::TrainSpec& spec, kernels::Allocator& cpu_allocator);
// The learning rate of `step` (1-based): linear warm-up over warmup_steps, then constant.
double LearningRateAt(const placement::OptimizerSpec& spec, int64_t step);

// Trains as `spec` says. `on_progress` is called every log_interval steps, at every checkpoint
// and after the last step. Stops early (after a checkpoint when the spec has a checkpoint dir)
// when `stop` becomes true. Errors name what failed: a missing data file, a bad checkpoint dir.
absl::StatusOr<TrainResult> Train(const placement::TrainSpec& spec,
                                  const std::function<void(const TrainProgress&)>& on_progress,
                                  const std::atomic<bool>* stop = nullptr);

}  // namespace shardline::training
