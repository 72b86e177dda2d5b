// The training loop of one rank of a sharded job (kind: train): the data, the ShardedGpt engine,
// the learning-rate schedule, progress, and this rank's checkpoint shards. The actor drives it and
// turns its callbacks into messages to the coordinator; tests drive it directly.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/job_spec.h"
#include "worker/model/sharded_gpt.h"

namespace shardline::training {

struct ShardedProgress {
  int64_t step = 0;  // 1-based, the step just finished
  int64_t steps = 0;
  float loss = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;  // global batch tokens over this rank's time since the last report
  double eta_seconds = 0;
  // Of the steps since the last report, in seconds per step.
  double compute_seconds = 0;
  double comm_seconds = 0;
  double bubble_seconds = 0;
};

// One global tensor's box as a rank saved it (what a manifest lists).
struct SavedTensor {
  std::string name;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
};

// A rank's part of the checkpoint of `step`: `file` inside `dir` (the step folder), or no file
// when another rank holds every box this rank has (data-parallel and tensor-parallel replicas are
// written once).
struct SavedShard {
  int64_t step = 0;
  std::string dir;
  std::string file;  // relative to dir; empty when nothing was written
  std::vector<SavedTensor> tensors;
};

struct ShardedTrainOptions {
  placement::JobSpec spec;  // kind train
  int rank = 0;
  model::ShardedGroups groups;
  // Parameters to start from: a checkpoint path for training::CheckpointSource (any kind, any
  // plan); empty: GPT-2 initialisation from the spec's seed.
  std::string initial_checkpoint;
  std::function<void(const ShardedProgress&)> on_progress;
  // Called after this rank wrote its shard of a step; an error stops training.
  std::function<absl::Status(const SavedShard&)> on_saved;
  const std::atomic<bool>* stop = nullptr;
};

struct ShardedTrainResult {
  std::vector<float> losses;  // one per step
  int64_t peak_bytes = 0;     // the allocator's peak
  model::ShardedMemory memory;
};

// The file name of a rank's shard in a step folder: "rank-00003.safetensors".
std::string ShardFileName(int rank);
// "step-00000100".
std::string StepFolderName(int64_t step);

absl::StatusOr<ShardedTrainResult> TrainSharded(const ShardedTrainOptions& options);

}  // namespace shardline::training
