// A train job's checkpoint saves as its ranks report them: each rank's shard of a step checked
// against the job (a later step than the last committed, the folder the spec names, the same
// token stream on every rank) and gathered until every rank has saved it, then the step
// committed: its manifest written, `latest` moved, old steps pruned. The only I/O is the commit's,
// through the checkpoint::FileSystem passed in; no clock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/commit.h"
#include "checkpoint/file_system.h"
#include "coordinator/job.h"

namespace shardline::coordinator {

// One rank's ShardSaved, decoded.
struct ShardReport {
  uint64_t step = 0;
  std::string dir;  // where the rank says it saved, resolved against the job's work dir
  checkpoint::SavedShard shard;   // shard.rank: the rank that saved it
  checkpoint::DataIdentity data;  // the token stream it trains on (tokens, checksum)
};

struct ShardVerdict {
  bool complete = false;  // every rank of the generation saved the step: commit it
  // The ranks do not train on one model's data: the job cannot go on (fail it with this).
  std::string job_error;
};

// Checks `report` against the job and adds it to its step. An error (nothing added) says why the
// shard cannot be part of a checkpoint of this job.
absl::StatusOr<ShardVerdict> AddShard(Job& job, ShardReport report);

// A memory step's shard (ShardSaved.memory): checked like a disk shard (the job keeps memory
// steps, a later step than its newest committed memory step, the folder its generation's ranks
// write into, the same token stream) and added, with the node holding it (`node`) and the ranks
// whose replicas that node now holds too (`replica_of`). Complete once every rank has reported.
absl::StatusOr<ShardVerdict> AddMemoryShard(Job& job, ShardReport report, const std::string& node,
                                            const std::vector<int64_t>& replica_of);
// Makes the memory step `step`, whose shards every rank reported, the job's newest committed
// memory step (no I/O: its manifest stays in memory). An error says why its shards do not make
// one; the job can go on (its disk steps are untouched).
absl::Status CommitMemoryStep(Job& job, int64_t step);

// Where a new generation placed on `rank_nodes` (by rank) resumes from when the job's newest
// committed memory step is newer than `job.train.resumed_step` (the disk's): that memory step
// when the files held on nodes this generation has ranks on cover every box of it (the lowest
// such rank sends each; the writers' own nodes' copies are tried alone first), filling
// train.memory_resume (the manifest of those files) and train.resumed_step; else a note saying
// which file is out of reach (and the memory step is dropped: the generation follows another
// history).
struct MemoryChoice {
  bool used = false;
  std::string kind;  // "survivors" (the nodes' own copies) or "memory replica" (buddies' too)
  std::string note;  // why not, when a newer memory step was not used
};
MemoryChoice ChooseMemoryResume(Job& job, const std::vector<std::string>& rank_nodes);

// The host memory a job's memory steps take on its fullest node: the steps a node keeps at once
// (placement::kMemoryStepsKept) times the bytes of `step`'s files that node holds.
uint64_t MemoryStoreBytes(const TrainRecord::MemoryStep& step);

// placement::MemoryStepBytesPerRank for the job's model and layout over `world` ranks (a
// `parallel: auto` job's dp from it); 0 without a memory tier.
int64_t MemoryTierBytesPerRank(const placement::JobSpec& spec, int world);
// At submit: a memory tier the cluster cannot give. InvalidArgument naming the key when
// memory_replicas asks for a copy on another node and fewer than 2 nodes are alive (saying how
// many), or when MemoryTierBytesPerRank is more than the smallest alive CPU device's share of its
// node's memory (saying by how much). GPU nodes' host memory is not known here: not checked.
absl::Status CheckMemoryTier(const placement::JobSpec& spec, const Membership& membership);

// Every rank's memory buddy for a generation placed on `rank_nodes`: a rank of the next node in
// the order the nodes first appear, at the same index among that node's ranks (modulo its count),
// so that no node's loss takes a shard and its copy together. Empty when there is one node.
std::vector<uint32_t> MemoryBuddies(const std::vector<std::string>& rank_nodes);

// Writes the manifest of `step`, whose shards every rank has saved, then `latest`, then applies
// retention (keeping the step this generation resumed from). An error says why the step could
// not be committed; the job should not train on with nothing to resume from.
absl::Status CommitStep(Job& job, int64_t step, checkpoint::FileSystem& fs);

}  // namespace shardline::coordinator
