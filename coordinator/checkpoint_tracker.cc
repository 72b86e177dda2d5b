#include "coordinator/checkpoint_tracker.h"

#include <algorithm>

#include "checkpoint/checksum.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "placement/checkpoint_state.h"
#include "spdlog/spdlog.h"

namespace shardline::coordinator {

absl::StatusOr<ShardVerdict> AddShard(Job& job, ShardReport report) {
  TrainRecord& train = job.train;
  const std::string where = "job " + job.id + ", rank " + std::to_string(report.shard.rank) +
                            ", step " + std::to_string(report.step);
  if (job.spec.kind != placement::JobKind::kTrain) {
    return absl::FailedPreconditionError(where + ": a " +
                                         std::string(placement::JobKindName(job.spec.kind)) +
                                         " job saves no checkpoints");
  }
  if (train.saving_dir.empty()) {
    return absl::FailedPreconditionError(where + ": the job's spec has no checkpoint.dir");
  }
  if (report.step > static_cast<uint64_t>(job.spec.train.steps)) {
    return absl::InvalidArgumentError(where + ": the job has only " +
                                      std::to_string(job.spec.train.steps) + " steps");
  }
  const auto step = static_cast<int64_t>(report.step);
  if (step <= train.last_committed_step) {
    return absl::FailedPreconditionError(where + ": step " +
                                         std::to_string(train.last_committed_step) +
                                         " is already committed; only later steps can be saved");
  }
  // The coordinator writes into the folder the spec names, never one a message chose.
  const std::string expected_dir = checkpoint::StepDir(train.saving_dir, step);
  if (report.dir != expected_dir) {
    return absl::InvalidArgumentError(where + ": saved into " + report.dir +
                                      ", but the step's folder is " + expected_dir);
  }
  checkpoint::DataIdentity data = train.data;
  data.tokens = report.data.tokens;
  data.xxh3 = report.data.xxh3;
  if (train.data.tokens != 0 && (data.tokens != train.data.tokens || data.xxh3 != train.data.xxh3)) {
    // The ranks do not train on the same data: no step of this job is one model's state.
    ShardVerdict verdict;
    verdict.job_error = where + ": the rank trains on " + std::to_string(data.tokens) +
                        " tokens (checksum " + checkpoint::ChecksumHex(data.xxh3) +
                        "), other ranks on " + std::to_string(train.data.tokens) + " (checksum " +
                        checkpoint::ChecksumHex(train.data.xxh3) + ")";
    return verdict;
  }
  checkpoint::StepAssembly& assembly = train.saving[step];
  if (auto status = assembly.Add(std::move(report.shard)); !status.ok()) {
    if (assembly.size() == 0) train.saving.erase(step);
    return Annotate(status, "job " + job.id + ", step " + std::to_string(step));
  }
  train.data = data;
  ShardVerdict verdict;
  verdict.complete = assembly.size() >= job.actors.size();
  return verdict;
}

absl::Status CommitStep(Job& job, int64_t step, checkpoint::FileSystem& fs) {
  TrainRecord& train = job.train;
  auto saving = train.saving.find(step);
  if (saving == train.saving.end()) {
    return absl::InternalError("no shards of step " + std::to_string(step) + " were saved");
  }
  const checkpoint::StepAssembly assembly = std::move(saving->second);
  train.saving.erase(saving);
  const placement::TrainSpec& spec = job.spec.train;
  const checkpoint::StepHeader header =
      placement::CheckpointStepHeader(spec, job.spec.parallel, step, job.World(), train.data);
  auto manifest = assembly.Build(header);
  absl::Status status = manifest.status();
  if (status.ok()) status = checkpoint::CommitStep(fs, train.saving_dir, *manifest);
  if (!status.ok()) {
    return absl::Status(status.code(), "checkpoint step " + std::to_string(step) +
                                           " could not be committed: " +
                                           std::string(status.message()));
  }
  train.last_committed_step = std::max(train.last_committed_step, step);
  train.committed_here = true;
  spdlog::info("job {} generation {}: committed checkpoint step {} of {} ranks in {}", job.id,
               job.generation, step, assembly.size(), train.saving_dir);
  // Retention keeps the step this generation resumed from while it runs.
  const int64_t protect[] = {train.resumed_step};
  auto removed = checkpoint::ApplyRetention(fs, train.saving_dir, spec.checkpoint.keep, protect);
  if (!removed.ok()) {
    spdlog::warn("job {}: pruning old checkpoint steps: {}", job.id,
                 std::string(removed.status().message()));
  } else {
    for (const std::string& folder : *removed) spdlog::info("job {}: removed {}", job.id, folder);
  }
  return absl::OkStatus();
}

}  // namespace shardline::coordinator
