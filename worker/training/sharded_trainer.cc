#include "worker/training/sharded_trainer.h"

#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "worker/checkpoint/shard_writer.h"
#include "worker/comm/staged_communicator.h"
#include "worker/model/data/sampler.h"
#include "worker/training/model_checkpoint.h"
#include "worker/training/starting_point.h"
#include "worker/training/trainer.h"

namespace shardline::training {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

absl::StatusOr<model::ShardedOptions> ShardedOptionsOf(const placement::JobSpec& job, int rank) {
  if (job.kind != placement::JobKind::kTrain) {
    return absl::InvalidArgumentError("TrainSharded needs a job of kind train");
  }
  ASSIGN_OR_RETURN(const placement::RankGrid grid,
                   placement::RankGrid::Create(job.parallel.tp, job.parallel.pp, job.parallel.dp));
  if (rank < 0 || rank >= grid.world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the world of ", grid.world()));
  }
  model::ShardedOptions sharded = ShardedOptionsOf(job.train, job.parallel, grid.Coords(rank));
  sharded.data_parallel = job.data_parallel;
  return sharded;
}

model::ShardedOptions ShardedOptionsOf(const placement::TrainSpec& spec,
                                       const placement::ParallelSpec& parallel,
                                       const placement::RankCoords& coords) {
  model::ShardedOptions sharded;
  sharded.config = spec.model;
  sharded.parallel = parallel;
  sharded.coords = coords;
  sharded.global_batch = spec.batch;
  sharded.seq_len = static_cast<int>(spec.seq_len);
  sharded.adamw = AdamWOptionsOf(spec.optimizer);
  return sharded;
}

absl::Status LoadStartingPoint(const StartingPoint& start, uint64_t seed, model::ShardedGpt& gpt) {
  if (start.kind == StartingPoint::Kind::kFresh) {
    return gpt.InitGpt2(seed);
  }
  const CheckpointSource& source = *start.source;
  return gpt.LoadState(
      [&](const std::string& name, const std::vector<int64_t>& offsets,
          const std::vector<int64_t>& shape) {
        return ReadCheckpointBox(source, name, offsets, shape);
      },
      /*with_moments=*/start.kind == StartingPoint::Kind::kResume,
      [&](const std::string& name) -> std::optional<std::vector<int64_t>> {
        absl::StatusOr<std::vector<int64_t>> shape = source.BoxShape(name);
        if (!shape.ok()) return std::nullopt;
        return *std::move(shape);
      });
}

model::MicroBatchSource StepSamples(const data::Sampler& sampler, int64_t step) {
  return [&sampler, step](int64_t first, int64_t count, std::vector<int32_t>& inputs,
                          std::vector<int32_t>& targets) -> absl::Status {
    ASSIGN_OR_RETURN(data::Batch batch,
                     sampler.MicroBatch(static_cast<uint64_t>(step - 1), first, count));
    inputs.assign(batch.inputs.begin(), batch.inputs.end());
    targets.assign(batch.targets.begin(), batch.targets.end());
    return absl::OkStatus();
  };
}

model::ShardedGroups GroupsForBackend(const model::ShardedGroups& groups, kernels::Backend& backend,
                                      std::vector<std::unique_ptr<comm::Communicator>>& staged) {
  model::ShardedGroups out = groups;
  if (backend.device() == kernels::Device::kCpu) return out;
  for (comm::Communicator** group : {&out.world, &out.tp, &out.pp, &out.dp}) {
    if (*group == nullptr || (*group)->device_buffers()) continue;
    staged.push_back(std::make_unique<comm::StagedCommunicator>(**group, backend));
    *group = staged.back().get();
  }
  return out;
}

absl::StatusOr<ShardedTrainResult> TrainSharded(const ShardedTrainOptions& options) {
  const placement::JobSpec& job = options.spec;
  const placement::TrainSpec& spec = job.train;
  ASSIGN_OR_RETURN(const model::ShardedOptions sharded, ShardedOptionsOf(job, options.rank));
  ASSIGN_OR_RETURN(data::TextDataset dataset, LoadTrainingData(spec.data, sharded.coords.dp));
  ASSIGN_OR_RETURN(data::Sampler sampler,
                   data::Sampler::Create(dataset, spec.seq_len, spec.batch, spec.seed));
  const checkpoint::DataIdentity data = IdentifyData(spec, dataset);
  std::string resume_manifest = options.resume_manifest;
  std::optional<checkpoint::MemoryResume> memory_resume;
  if (!options.memory.resume.empty()) {
    ASSIGN_OR_RETURN(memory_resume,
                     checkpoint::ParseMemoryResume(options.memory.resume, job.parallel.world(),
                                                   "the assignment's memory step"));
  }
  // Opened (and checked) before anything is allocated, so that a bad checkpoint fails at once; a
  // memory step once this rank has fetched its files, below.
  std::optional<StartingPoint> starting_point;
  if (!memory_resume) {
    ASSIGN_OR_RETURN(starting_point, OpenStartingPoint(spec, resume_manifest, data));
  }
  ASSIGN_OR_RETURN(const std::unique_ptr<kernels::Backend> backend,
                   kernels::CreateBackend(options.backend));
  std::vector<std::unique_ptr<comm::Communicator>> staged;
  const model::ShardedGroups groups = GroupsForBackend(options.groups, *backend, staged);
  ASSIGN_OR_RETURN(auto gpt, model::ShardedGpt::Create(sharded, groups, *backend));
  if (memory_resume) {
    // The files this rank's boxes need come from the nodes holding them; then the step loads as
    // a disk step does.
    ASSIGN_OR_RETURN(resume_manifest,
                     FetchMemoryStep(options.memory, options.rank, *memory_resume, *gpt));
    ASSIGN_OR_RETURN(starting_point, OpenStartingPoint(spec, resume_manifest, data));
  }
  const StartingPoint& starting = *starting_point;
  RETURN_IF_ERROR(LoadStartingPoint(starting, spec.seed, *gpt));

  // Saves: the writer's thread writes this rank's shard and reports it; the coordinator commits
  // the step once every rank has.
  std::unique_ptr<worker::AsyncShardWriter> writer;
  if (!spec.checkpoint.dir.empty()) {
    checkpoint::FileSystem& fs = options.fs ? *options.fs : checkpoint::DefaultFileSystem();
    auto on_written = [&options, data](int64_t step, const checkpoint::SavedShard& shard) {
      return options.on_saved ? options.on_saved(SavedStep{step, shard, data})
                              : absl::OkStatus();
    };
    writer = std::make_unique<worker::AsyncShardWriter>(worker::MakeShardPlan(gpt->StatePieces()),
                                                        options.rank, fs, on_written);
  }

  // Memory steps: the same writer into this node's memory store; its thread then exchanges the
  // replicas, prunes what no resume can pick, and reports.
  // In place: the staging buffer is the file in the node's memory (shard_writer.h says why).
  std::unique_ptr<worker::AsyncShardWriter> memory_writer;
  const MemoryTierOptions& memory = options.memory;
  std::map<int64_t, std::vector<std::string>> received;  // replicas held, by step: the writer's
  if (memory.interval > 0 && !memory.store.empty()) {
    auto on_written = [&options, &memory, &memory_writer, &received, data](
                          int64_t step, const checkpoint::SavedShard& shard) {
      MemorySaved saved;
      saved.step = step;
      saved.data = data;
      ASSIGN_OR_RETURN(saved.dir, MemoryStepDir(memory, step));
      saved.shard = shard;
      ASSIGN_OR_RETURN(saved.replica_of, ExchangeReplicas(memory, options.rank, saved.dir, shard,
                                                          memory_writer->file_bytes()));
      for (uint32_t of : saved.replica_of) {
        received[step].push_back(saved.dir + "/" + checkpoint::ShardFileName(of));
      }
      // The ranks of a generation are at most a save apart: when this rank starts step s, a
      // slower one may still be writing s - K, so s - 2K may be the newest committed.
      PruneMemorySteps(memory, step - 2 * memory.interval, received);
      return memory.on_saved ? memory.on_saved(saved) : absl::OkStatus();
    };
    // Everything the rank holds, so that the ranks of the nodes left hold every box they can.
    memory_writer = worker::AsyncShardWriter::InPlace(
        worker::MakeShardPlan(gpt->StatePieces(model::ShardedGpt::Share::kHeld)), options.rank,
        on_written);
  }

  ShardedTrainResult result;
  result.first_step = starting.step + 1;
  const auto start = Clock::now();
  auto last_report = start;
  int64_t steps_since_report = 0;
  ShardedProgress window;  // sums over the steps since the last report
  const int64_t tokens_per_step = spec.batch * spec.seq_len;
  for (int64_t step = starting.step + 1; step <= spec.steps; ++step) {
    const float lr = static_cast<float>(LearningRateAt(spec.optimizer, step));
    // A memory step is reported (and so, once every rank has, committed) before the next step
    // begins: no rank can finish a step past the newest memory step while another still saves it,
    // so a fault loses at most the step in flight beyond it.
    if (memory_writer) RETURN_IF_ERROR(memory_writer->WaitIdle());
    ASSIGN_OR_RETURN(const model::StepStats stats,
                     gpt->TrainStep(StepSamples(sampler, step), step, lr));
    if (!std::isfinite(stats.loss)) {
      return absl::InternalError(absl::StrCat("the loss became ", stats.loss, " at step ", step,
                                              " (try a lower optimizer.lr)"));
    }
    result.losses.push_back(stats.loss);
    ++steps_since_report;
    window.compute_seconds += stats.compute_seconds;
    window.comm_seconds += stats.comm_seconds;
    window.bubble_seconds += stats.bubble_seconds;

    if (writer) RETURN_IF_ERROR(writer->PollError());

    const bool last = step == spec.steps || (options.stop && options.stop->load());
    if (SavesAfter(spec, step, last)) {
      // The only stall of a save: waiting for the previous one, and the copy.
      const auto stall = Clock::now();
      RETURN_IF_ERROR(writer->WaitIdle());
      RETURN_IF_ERROR(gpt->CopyState(writer->staging()));
      RETURN_IF_ERROR(writer->Start(step, checkpoint::StepDir(spec.checkpoint.dir, step)));
      result.save_stall_seconds.push_back(
          std::chrono::duration<double>(Clock::now() - stall).count());
    }
    if (memory_writer) RETURN_IF_ERROR(memory_writer->PollError());
    if (memory_writer && !last && step % memory.interval == 0) {
      ASSIGN_OR_RETURN(std::string dir, MemoryStepDir(memory, step));
      RETURN_IF_ERROR(memory_writer->Prepare(dir));  // waits for the previous one
      RETURN_IF_ERROR(gpt->CopyState(memory_writer->staging(), model::ShardedGpt::Share::kHeld));
      RETURN_IF_ERROR(memory_writer->Start(step, std::move(dir)));
    }
    const bool logged = last || step % spec.log_interval == 0;
    const bool due = options.progress_interval.count() > 0 &&
                     Clock::now() - last_report >= options.progress_interval;
    if (options.on_progress && (logged || due)) {
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
      progress.eta_seconds = elapsed / static_cast<double>(step - starting.step) *
                             static_cast<double>(spec.steps - step);
      const double n = static_cast<double>(steps_since_report);
      progress.compute_seconds = window.compute_seconds / n;
      progress.comm_seconds = window.comm_seconds / n;
      progress.bubble_seconds = window.bubble_seconds / n;
      progress.logged = logged;
      options.on_progress(progress);
      last_report = now;
      steps_since_report = 0;
      window = ShardedProgress();
    }
    if (last) break;
  }
  if (writer) RETURN_IF_ERROR(writer->WaitIdle());
  if (memory_writer) RETURN_IF_ERROR(memory_writer->WaitIdle());
  result.peak_bytes =
      static_cast<int64_t>(backend->allocator().stats().peak_bytes) + gpt->shared_bytes();
  result.memory = gpt->memory();
  return result;
}

}  // namespace shardline::training
