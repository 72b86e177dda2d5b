// The training loop of one rank of a sharded job (kind: train): the data, the ShardedGpt engine,
// the learning-rate schedule, progress, and this rank's checkpoint shards. The actor drives it and
// turns its callbacks into messages to the coordinator; tests drive it directly.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/commit.h"
#include "checkpoint/file_system.h"
#include "kernels/backend.h"
#include "placement/job_spec.h"
#include "worker/model/data/sampler.h"
#include "worker/model/sharded_gpt.h"
#include "worker/training/memory_tier.h"
#include "worker/training/starting_point.h"

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
  bool logged = false;  // a step of log_interval (or the last): the one a progress line shows
};

// What a rank reports after writing its shard of a step: the shard, and the identity of the data
// it trained on (which the step's manifest records).
struct SavedStep {
  int64_t step = 0;
  checkpoint::SavedShard shard;
  checkpoint::DataIdentity data;
};

struct ShardedTrainOptions {
  placement::JobSpec spec;  // kind train
  int rank = 0;
  model::ShardedGroups groups;
  // The device the rank computes on (its groups must be nccl ones on CUDA). A cluster job placed
  // on CUDA devices computes its GEMMs in bf16 over fp32 weights.
  kernels::BackendOptions backend;
  // The manifest of the step to resume from, as the coordinator decided it for the whole job
  // (checkpoint::DecideResume); empty: start fresh, from spec.train.init_from's parameters when
  // given, else GPT-2 initialisation from the seed.
  std::string resume_manifest;
  std::function<void(const ShardedProgress&)> on_progress;
  // on_progress also runs after any step that ends this long after the last call (0: only at
  // log_interval), so that a supervisor sees progress at a bounded interval whatever log_interval
  // is: its hang watchdog follows that interval.
  std::chrono::milliseconds progress_interval{0};
  // Called on the checkpoint writer's thread once this rank's shard of a step is on disk; an error
  // fails that save, and training at its next step.
  std::function<absl::Status(const SavedStep&)> on_saved;
  const std::atomic<bool>* stop = nullptr;
  checkpoint::FileSystem* fs = nullptr;  // null: checkpoint::DefaultFileSystem()
  // The memory tier (memory steps every memory.interval steps, and the memory step to resume
  // from, which stands in for resume_manifest).
  MemoryTierOptions memory;
};

struct ShardedTrainResult {
  int64_t first_step = 1;     // the first step this run trained (after the one it resumed from)
  std::vector<float> losses;  // one per step it trained
  int64_t peak_bytes = 0;     // the allocator's peak
  model::ShardedMemory memory;
  // Per save, how long the loop stopped for it: waiting for the previous save, and the copy into
  // the staging buffer (the file is written while training goes on).
  std::vector<double> save_stall_seconds;
};

// The engine's options for rank `rank` of a train job: its model, layout, coordinates, batch and
// AdamW. InvalidArgument for a job of another kind or a rank outside the layout.
absl::StatusOr<model::ShardedOptions> ShardedOptionsOf(const placement::JobSpec& job, int rank);
// The same from a train spec, a layout and the rank's coordinates in it (`shardline train`: the
// default layout, one rank).
model::ShardedOptions ShardedOptionsOf(const placement::TrainSpec& spec,
                                       const placement::ParallelSpec& parallel,
                                       const placement::RankCoords& coords);
// The engine's state from where the run starts: GPT-2 initialisation from `seed`, or the boxes
// this rank keeps of the checkpoint (with both AdamW moments when resuming). Errors name the
// tensor.
// `groups` as the engine on `backend` takes them: on a device's backend, host communicators (ranks
// that share a GPU, which NCCL refuses) wrapped in staged ones, which `staged` keeps.
model::ShardedGroups GroupsForBackend(const model::ShardedGroups& groups, kernels::Backend& backend,
                                      std::vector<std::unique_ptr<comm::Communicator>>& staged);

absl::Status LoadStartingPoint(const StartingPoint& start, uint64_t seed, model::ShardedGpt& gpt);
// Samples of step `step` (1-based) for the engine: a function of (seed, step) alone, whatever the
// plan (data/sampler.h). `sampler` must outlive the result.
model::MicroBatchSource StepSamples(const data::Sampler& sampler, int64_t step);

// Trains this rank's part of the job: loads its state (OpenStartingPoint: only the boxes it keeps),
// runs the steps after it, and saves its shard every checkpoint.interval steps and after the last
// step in the background (worker/checkpoint/shard_writer.h), waiting for the last save before it
// returns. Every rank of the job must call it together.
absl::StatusOr<ShardedTrainResult> TrainSharded(const ShardedTrainOptions& options);

}  // namespace shardline::training
