#include "worker/training/sharded_trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/allocator.h"
#include "worker/checkpoint/safetensors_writer.h"
#include "worker/model/data/sampler.h"
#include "worker/training/model_checkpoint.h"
#include "worker/training/trainer.h"

namespace shardline::training {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Writes this rank's boxes of the step's parameters. Replicas are written once: only the first
// data-parallel rank writes, and of a tensor-parallel replica (LayerNorms, row-parallel biases,
// wpe) only tensor-parallel rank 0; the last stage's copy of a tied wte is never written (the
// first stage's is the same). TensorValues is called by every rank: under ZeRO 3 it gathers.
absl::StatusOr<SavedShard> SaveShard(model::ShardedGpt& gpt, const std::string& checkpoint_dir,
                                     int64_t step, int rank, const placement::RankCoords& coords) {
  ASSIGN_OR_RETURN(const std::vector<std::vector<float>> values, gpt.TensorValues());
  SavedShard saved;
  saved.step = step;
  saved.dir = (fs::path(checkpoint_dir) / StepFolderName(step)).string();
  if (coords.dp != 0) return saved;
  checkpoint::SafetensorsWriter writer((fs::path(saved.dir) / ShardFileName(rank)).string());
  writer.SetMetadata("format", "shardline-shard");
  writer.SetMetadata("rank", std::to_string(rank));
  writer.SetMetadata("step", std::to_string(step));
  const auto& tensors = gpt.layout().tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const model::ShardTensor& t = tensors[i];
    if (t.tied_copy || (t.tp_replica && coords.tp != 0)) continue;
    RETURN_IF_ERROR(writer.Add(checkpoint::TensorView{
        t.name, checkpoint::SafetensorsDType::kF32, t.box_shape,
        std::as_bytes(std::span<const float>(values[i]))}));
    saved.tensors.push_back(SavedTensor{t.name, t.global_shape, t.box_offsets, t.box_shape});
  }
  if (saved.tensors.empty()) return saved;
  std::error_code ec;
  fs::create_directories(saved.dir, ec);
  if (ec) return absl::InternalError("cannot create " + saved.dir + ": " + ec.message());
  RETURN_IF_ERROR(writer.Finish());
  saved.file = ShardFileName(rank);
  return saved;
}

}  // namespace

std::string ShardFileName(int rank) {
  char name[40];
  std::snprintf(name, sizeof(name), "rank-%05d.safetensors", rank);
  return name;
}

std::string StepFolderName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

absl::StatusOr<ShardedTrainResult> TrainSharded(const ShardedTrainOptions& options) {
  const placement::JobSpec& job = options.spec;
  const placement::TrainSpec& spec = job.train;
  if (job.kind != placement::JobKind::kTrain) {
    return absl::InvalidArgumentError("TrainSharded needs a job of kind train");
  }
  ASSIGN_OR_RETURN(const placement::RankGrid grid,
                   placement::RankGrid::Create(job.parallel.tp, job.parallel.pp, job.parallel.dp));
  if (options.rank < 0 || options.rank >= grid.world()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " is outside the world of ",
                                                   grid.world()));
  }
  ASSIGN_OR_RETURN(data::TextDataset dataset, LoadTrainingData(spec.data));
  ASSIGN_OR_RETURN(data::Sampler sampler,
                   data::Sampler::Create(dataset, spec.seq_len, spec.batch, spec.seed));

  model::ShardedOptions sharded;
  sharded.config = ModelConfigOf(spec.model);
  sharded.parallel = job.parallel;
  sharded.coords = grid.Coords(options.rank);
  sharded.global_batch = spec.batch;
  sharded.seq_len = static_cast<int>(spec.seq_len);
  sharded.adamw.adamw.beta1 = static_cast<float>(spec.optimizer.beta1);
  sharded.adamw.adamw.beta2 = static_cast<float>(spec.optimizer.beta2);
  sharded.adamw.adamw.eps = static_cast<float>(spec.optimizer.eps);
  sharded.adamw.adamw.weight_decay = static_cast<float>(spec.optimizer.weight_decay);
  sharded.adamw.max_grad_norm = spec.optimizer.grad_clip;
  kernels::CpuAllocator allocator;
  ASSIGN_OR_RETURN(auto gpt, model::ShardedGpt::Create(sharded, options.groups, allocator));
  if (options.initial_checkpoint.empty()) {
    gpt->InitGpt2(spec.seed);
  } else {
    ASSIGN_OR_RETURN(CheckpointSource source, CheckpointSource::Open(options.initial_checkpoint));
    RETURN_IF_ERROR(gpt->LoadBoxes([&](const std::string& name, const std::vector<int64_t>& offsets,
                                       const std::vector<int64_t>& shape) {
      return ReadCheckpointBox(source, name, offsets, shape);
    }));
  }

  ShardedTrainResult result;
  const auto start = Clock::now();
  auto last_report = start;
  int64_t steps_since_report = 0;
  ShardedProgress window;  // sums over the steps since the last report
  const int64_t tokens_per_step = spec.batch * spec.seq_len;
  for (int64_t step = 1; step <= spec.steps; ++step) {
    // The samples of step s are a function of (seed, s) alone, whatever the plan.
    auto source = [&](int64_t first, int64_t count, std::vector<int32_t>& inputs,
                      std::vector<int32_t>& targets) -> absl::Status {
      ASSIGN_OR_RETURN(data::Batch batch,
                       sampler.MicroBatch(static_cast<uint64_t>(step - 1), first, count));
      inputs.assign(batch.inputs.begin(), batch.inputs.end());
      targets.assign(batch.targets.begin(), batch.targets.end());
      return absl::OkStatus();
    };
    const float lr = static_cast<float>(LearningRateAt(spec.optimizer, step));
    ASSIGN_OR_RETURN(const model::StepStats stats, gpt->TrainStep(source, step, lr));
    if (!std::isfinite(stats.loss)) {
      return absl::InternalError(absl::StrCat("the loss became ", stats.loss, " at step ", step,
                                              " (try a lower optimizer.lr)"));
    }
    result.losses.push_back(stats.loss);
    ++steps_since_report;
    window.compute_seconds += stats.compute_seconds;
    window.comm_seconds += stats.comm_seconds;
    window.bubble_seconds += stats.bubble_seconds;

    const bool last = step == spec.steps || (options.stop && options.stop->load());
    if (!spec.checkpoint_dir.empty() &&
        (last || (spec.checkpoint_interval > 0 && step % spec.checkpoint_interval == 0))) {
      ASSIGN_OR_RETURN(const SavedShard saved,
                       SaveShard(*gpt, spec.checkpoint_dir, step, options.rank, sharded.coords));
      if (options.on_saved) RETURN_IF_ERROR(options.on_saved(saved));
    }
    if (options.on_progress && (last || step % spec.log_interval == 0)) {
      const auto now = Clock::now();
      const double elapsed = std::chrono::duration<double>(now - start).count();
      const double seconds = std::chrono::duration<double>(now - last_report).count();
      ShardedProgress progress;
      progress.step = step;
      progress.steps = spec.steps;
      progress.loss = stats.loss;
      progress.grad_norm = stats.grad_norm;
      progress.tokens_per_second =
          seconds > 0 ? static_cast<double>(tokens_per_step * steps_since_report) / seconds : 0;
      progress.eta_seconds = elapsed / static_cast<double>(step) *
                             static_cast<double>(spec.steps - step);
      const double n = static_cast<double>(steps_since_report);
      progress.compute_seconds = window.compute_seconds / n;
      progress.comm_seconds = window.comm_seconds / n;
      progress.bubble_seconds = window.bubble_seconds / n;
      options.on_progress(progress);
      last_report = now;
      steps_since_report = 0;
      window = ShardedProgress();
    }
    if (last) break;
  }
  result.peak_bytes = static_cast<int64_t>(allocator.stats().peak_bytes);
  result.memory = gpt->memory();
  return result;
}

}  // namespace shardline::training
