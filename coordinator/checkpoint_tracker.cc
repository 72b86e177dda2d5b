#include "coordinator/checkpoint_tracker.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_join.h"
#include "checkpoint/checksum.h"
#include "checkpoint/layout.h"
#include "checkpoint/memory_step.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"
#include "placement/byte_size.h"
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

absl::StatusOr<ShardVerdict> AddMemoryShard(Job& job, ShardReport report, const std::string& node,
                                            const std::vector<int64_t>& replica_of) {
  TrainRecord& train = job.train;
  const std::string where = "job " + job.id + ", rank " + std::to_string(report.shard.rank) +
                            ", memory step " + std::to_string(report.step);
  if (job.spec.kind != placement::JobKind::kTrain ||
      job.spec.train.checkpoint.memory_interval == 0) {
    return absl::FailedPreconditionError(where +
                                         ": the job keeps no memory steps "
                                         "(checkpoint.memory_interval)");
  }
  if (report.step == 0 || report.step > static_cast<uint64_t>(job.spec.train.steps)) {
    return absl::InvalidArgumentError(where + ": the job has steps 1 to " +
                                      std::to_string(job.spec.train.steps));
  }
  const auto step = static_cast<int64_t>(report.step);
  if (train.memory_step && step <= train.memory_step->manifest.step) {
    return absl::FailedPreconditionError(where + ": memory step " +
                                         std::to_string(train.memory_step->manifest.step) +
                                         " is already committed; only later steps can be saved");
  }
  // The folder in the node's store where this generation's ranks write the step, and no other.
  const std::string expected =
      job.id + "/g" + std::to_string(job.generation) + "/" + checkpoint::StepDirName(step);
  if (report.dir != expected) {
    return absl::InvalidArgumentError(where + ": saved into " + report.dir +
                                      " of its node's memory store, but the step's folder is " +
                                      expected);
  }
  for (int64_t rank : replica_of) {
    if (rank < 0 || rank >= static_cast<int64_t>(job.actors.size()) || rank == report.shard.rank) {
      return absl::InvalidArgumentError(where + ": holds a replica of rank " +
                                        std::to_string(rank) + ", which it cannot");
    }
  }
  if (train.data.tokens != 0 &&
      (report.data.tokens != train.data.tokens || report.data.xxh3 != train.data.xxh3)) {
    ShardVerdict verdict;
    verdict.job_error = where + ": the rank trains on " + std::to_string(report.data.tokens) +
                        " tokens (checksum " + checkpoint::ChecksumHex(report.data.xxh3) +
                        "), other ranks on " + std::to_string(train.data.tokens) + " (checksum " +
                        checkpoint::ChecksumHex(train.data.xxh3) + ")";
    return verdict;
  }
  TrainRecord::MemoryAssembly& assembly = train.memory_saving[step];
  const std::string file = report.shard.file;
  if (auto status = assembly.shards.Add(std::move(report.shard)); !status.ok()) {
    if (assembly.shards.size() == 0) train.memory_saving.erase(step);
    return Annotate(status, "job " + job.id + ", memory step " + std::to_string(step));
  }
  if (train.data.tokens == 0) {
    train.data.tokens = report.data.tokens;
    train.data.xxh3 = report.data.xxh3;
  }
  if (!file.empty()) {
    std::vector<std::string>& holders = assembly.holders[file];
    holders.insert(holders.begin(), node);
  }
  for (int64_t of : replica_of) assembly.replica_nodes[of].push_back(node);
  ShardVerdict verdict;
  verdict.complete = assembly.shards.size() >= job.actors.size();
  return verdict;
}

absl::Status CommitMemoryStep(Job& job, int64_t step) {
  TrainRecord& train = job.train;
  auto saving = train.memory_saving.find(step);
  if (saving == train.memory_saving.end()) {
    return absl::InternalError("no shards of memory step " + std::to_string(step) +
                               " were reported");
  }
  TrainRecord::MemoryAssembly assembly = std::move(saving->second);
  // Older steps still gathering can never be committed after this one.
  train.memory_saving.erase(train.memory_saving.begin(), std::next(saving));
  const checkpoint::StepHeader header = placement::CheckpointStepHeader(
      job.spec.train, job.spec.parallel, step, job.World(), train.data);
  auto manifest = assembly.shards.Build(header);
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        "memory step " + std::to_string(step) +
                            " is not a checkpoint: " + std::string(manifest.status().message()));
  }
  TrainRecord::MemoryStep committed;
  committed.manifest = *std::move(manifest);
  committed.generation = job.generation;
  for (const auto& [file, info] : committed.manifest.files) {
    std::vector<std::string> holders = assembly.holders[file];
    for (const std::string& node : assembly.replica_nodes[info.rank]) holders.push_back(node);
    committed.holders[file] = std::move(holders);
  }
  train.memory_step = std::move(committed);
  return absl::OkStatus();
}

namespace {

// `manifest` without the files not in `kept` and their pieces.
checkpoint::Manifest KeepFiles(const checkpoint::Manifest& manifest,
                               const std::set<std::string>& kept) {
  checkpoint::Manifest out = manifest;
  std::erase_if(out.files, [&](const auto& entry) { return !kept.contains(entry.first); });
  for (auto& [name, tensor] : out.tensors) {
    std::erase_if(tensor.shards,
                  [&](const checkpoint::ShardSlice& slice) { return !kept.contains(slice.file); });
  }
  return out;
}

}  // namespace

MemoryChoice ChooseMemoryResume(Job& job, const std::vector<std::string>& rank_nodes) {
  TrainRecord& train = job.train;
  MemoryChoice choice;
  train.memory_resume.clear();
  train.memory_saving.clear();
  if (!train.memory_step) return choice;
  const TrainRecord::MemoryStep& memory = *train.memory_step;
  const int64_t step = memory.manifest.step;
  if (step <= train.resumed_step) return choice;  // the disk's step is as new: it stays
  // Each file's sender: the lowest rank of this generation on the first node holding it (its
  // writer's node, then its buddy's), with whether that is a copy.
  struct Sender {
    int64_t rank = 0;
    bool replica = false;
  };
  std::map<std::string, Sender> senders;
  std::string out_of_reach;  // the first file no node of this generation holds
  for (const auto& [file, holders] : memory.holders) {
    std::optional<Sender> sender;
    for (size_t h = 0; h < holders.size() && !sender; ++h) {
      const auto on = std::find(rank_nodes.begin(), rank_nodes.end(), holders[h]);
      if (on != rank_nodes.end()) sender = Sender{on - rank_nodes.begin(), h > 0};
    }
    if (sender) {
      senders[file] = *sender;
    } else if (out_of_reach.empty()) {
      out_of_reach = file + " was held only on " + absl::StrJoin(holders, ", ");
    }
  }
  // The surviving nodes' own copies first (each rank's memory step holds all it trains with, so
  // that data-parallel replicas stand in for each other), then with the buddies' copies: the
  // first set of files that covers every box of the state.
  for (const bool with_replicas : {false, true}) {
    std::set<std::string> kept;
    for (const auto& [file, sender] : senders) {
      if (with_replicas || !sender.replica) kept.insert(file);
    }
    checkpoint::MemoryResume resume;
    resume.manifest = KeepFiles(memory.manifest, kept);
    if (!checkpoint::ValidateManifest(resume.manifest, "memory step").ok()) continue;
    resume.generation = memory.generation;
    resume.kind = with_replicas ? "memory replica" : "survivors";
    for (const std::string& file : kept) resume.sources.push_back({file, senders[file].rank});
    train.memory_resume = checkpoint::MemoryResumeToJson(resume);
    train.resumed_step = step;
    choice.used = true;
    choice.kind = resume.kind;
    return choice;
  }
  choice.note = "memory step " + std::to_string(step) + " was not used: " + out_of_reach +
                ", where this generation has no rank, and the files its nodes hold miss boxes "
                "of it";
  train.memory_step.reset();  // the job goes on from an older step: another history
  return choice;
}

uint64_t MemoryStoreBytes(const TrainRecord::MemoryStep& step) {
  std::map<std::string, uint64_t> per_node;
  for (const auto& [file, holders] : step.holders) {
    const auto info = step.manifest.files.find(file);
    if (info == step.manifest.files.end()) continue;
    for (const std::string& node : holders) per_node[node] += info->second.bytes;
  }
  uint64_t most = 0;
  for (const auto& [node, bytes] : per_node) most = std::max(most, bytes);
  return most * placement::kMemoryStepsKept;
}

int64_t MemoryTierBytesPerRank(const placement::JobSpec& spec, int world) {
  const placement::CheckpointSpec& checkpoint = spec.train.checkpoint;
  if (spec.kind != placement::JobKind::kTrain || checkpoint.memory_interval == 0 || world <= 0) {
    return 0;
  }
  int64_t params = 0;
  for (const model::TensorRow& row : model::ModelRows(spec.train.model)) params += row.numel();
  placement::ParallelSpec parallel = spec.parallel;
  parallel.dp = std::max(1, world / std::max(1, parallel.tp * parallel.pp));
  return placement::MemoryStepBytesPerRank(params, parallel, spec.data_parallel.diloco(),
                                           checkpoint.memory_replicas);
}

absl::Status CheckMemoryTier(const placement::JobSpec& spec, const Membership& membership) {
  const placement::CheckpointSpec& checkpoint = spec.train.checkpoint;
  if (spec.kind != placement::JobKind::kTrain || checkpoint.memory_interval == 0) {
    return absl::OkStatus();
  }
  const DeviceInfo::Kind kind = spec.devices == placement::DeviceKind::kCuda
                                    ? DeviceInfo::Kind::kCuda
                                    : DeviceInfo::Kind::kCpu;
  int nodes = 0, devices = 0;
  std::optional<uint64_t> smallest_cpu;
  for (const auto& [node_id, node] : membership.nodes()) {
    if (!node.alive) continue;
    bool has = false;
    for (const DeviceInfo& device : node.devices) {
      if (device.kind != kind) continue;
      has = true;
      ++devices;
      if (kind == DeviceInfo::Kind::kCpu) {
        smallest_cpu = std::min(smallest_cpu.value_or(device.memory_bytes), device.memory_bytes);
      }
    }
    nodes += has;
  }
  if (checkpoint.memory_replicas > 0 && nodes < 2) {
    return absl::InvalidArgumentError(
        "checkpoint.memory_replicas: " + std::to_string(checkpoint.memory_replicas) +
        " needs a second node to hold each shard's copy, and the cluster has " +
        std::to_string(nodes) + " alive node" + (nodes == 1 ? "" : "s") + " with " +
        std::string(placement::DeviceKindName(spec.devices)) + " devices");
  }
  const int world = spec.parallel_auto
                        ? (spec.actors > 0 ? std::min(spec.actors, devices) : devices)
                        : spec.parallel.world();
  const int64_t need = MemoryTierBytesPerRank(spec, world);
  if (smallest_cpu && need > static_cast<int64_t>(*smallest_cpu)) {
    return absl::InvalidArgumentError(
        "checkpoint.memory_interval: the memory tier needs " +
        placement::FormatApproxByteSize(static_cast<double>(need)) + " of host memory per rank (" +
        std::to_string(placement::kMemoryStepsKept) + " steps" +
        (checkpoint.memory_replicas > 0 ? " and a buddy's copy" : "") + " of 1/" +
        std::to_string(world) + " of the training state), " +
        placement::FormatApproxByteSize(
            static_cast<double>(need - static_cast<int64_t>(*smallest_cpu))) +
        " more than a device's share of its node's memory (" +
        placement::FormatApproxByteSize(static_cast<double>(*smallest_cpu)) + ")");
  }
  return absl::OkStatus();
}

std::vector<uint32_t> MemoryBuddies(const std::vector<std::string>& rank_nodes) {
  std::vector<std::string> nodes;                        // in order of first appearance
  std::map<std::string, std::vector<uint32_t>> on_node;  // ranks, in rank order
  for (size_t rank = 0; rank < rank_nodes.size(); ++rank) {
    if (!on_node.contains(rank_nodes[rank])) nodes.push_back(rank_nodes[rank]);
    on_node[rank_nodes[rank]].push_back(static_cast<uint32_t>(rank));
  }
  if (nodes.size() < 2) return {};
  std::vector<uint32_t> buddies(rank_nodes.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    const std::vector<uint32_t>& here = on_node[nodes[n]];
    const std::vector<uint32_t>& next = on_node[nodes[(n + 1) % nodes.size()]];
    for (size_t j = 0; j < here.size(); ++j) buddies[here[j]] = next[j % next.size()];
  }
  return buddies;
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
