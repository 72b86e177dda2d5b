// The training loop behind `shardline train`: model, data, AdamW, progress and checkpoints, all
// decided by a TrainSpec. On the CPU it runs the sharded engine (ShardedGpt) at one rank, as a
// cluster job of one rank does; on a GPU the single-device CUDA model.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/file_system.h"
#include "checkpoint/resume.h"
#include "kernels/allocator.h"
#include "model/model_config.h"
#include "placement/train_spec.h"
#include "worker/model/data/text_dataset.h"
#include "worker/model/training_recipe.h"

namespace shardline::training {

struct TrainProgress {
  int64_t step = 0;  // 1-based, the step just finished
  int64_t steps = 0;
  float loss = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;  // over the steps since the last report
  double elapsed_seconds = 0;    // of this run (a resumed run counts from its own start)
  double eta_seconds = 0;
  bool saving = false;  // the state after this step is being saved (in the background)
};

// Where the run started from, decided before its first step.
struct TrainStart {
  int64_t first_step = 1;     // the first step this run trains
  std::string resumed_from;   // the manifest of the step it resumed after; empty: it did not
  std::string initialized_from;  // init_from, when the parameters came from there
  std::vector<checkpoint::SkippedStep> skipped;  // newer steps that failed verification
  std::vector<std::string> prepared;  // what was done to the checkpoint dir (set aside, removed)
};

struct TrainResult {
  TrainStart start;
  std::vector<float> losses;  // one per step this run trained (steps start.first_step ...)
  std::string checkpoint;     // the manifest of the last step committed; empty: none
  int64_t peak_bytes = 0;     // the allocator's peak
  // Per save, how long the loop stopped for it (waiting for the previous save, and the copy).
  std::vector<double> save_stall_seconds;
};

struct TrainCallbacks {
  std::function<void(const TrainStart&)> on_start;  // once, before the first step
  // Every log_interval steps, at every save and after the last step.
  std::function<void(const TrainProgress&)> on_progress;
  // On the checkpoint writer's thread, once a step is committed (its manifest written).
  std::function<void(int64_t step, const std::string& manifest)> on_committed;
};

// The dataset a spec's data section names: its text file, or the built-in synthetic corpus.
// `site`: the data-parallel rank, whose file of data.per_site it reads (and no other).
absl::StatusOr<data::TextDataset> LoadTrainingData(const placement::DataSpec& spec, int site = 0);
// AdamW as a spec's optimizer section says (the learning rate is set per step: LearningRateAt).
model::AdamWOptions AdamWOptionsOf(const placement::OptimizerSpec& spec);
// The learning rate of `step` (1-based): linear warm-up over warmup_steps, then constant.
double LearningRateAt(const placement::OptimizerSpec& spec, int64_t step);

// Trains as `spec` says, resuming as its checkpoint section says (checkpoint::DecideResume: by
// default from the newest committed step of checkpoint.dir that verifies) or starting from
// init_from's parameters. Saves every checkpoint.interval steps and after the last one, in the
// background (worker/checkpoint/shard_writer.h): a save stops training only to copy the state;
// the file is written, committed as a one-rank step and older steps pruned to checkpoint.keep
// while training goes on. Stops early, after a save when the spec has a checkpoint dir, when
// `stop` becomes true. Every file operation goes through `fs`. Errors name what failed: a missing
// data file, a checkpoint that cannot be resumed (and why), a failed save.
absl::StatusOr<TrainResult> Train(const placement::TrainSpec& spec,
                                  const TrainCallbacks& callbacks,
                                  const std::atomic<bool>* stop = nullptr,
                                  checkpoint::FileSystem& fs = checkpoint::DefaultFileSystem());

}  // namespace shardline::training
