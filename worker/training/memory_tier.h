// A rank's side of the memory tier (checkpoint.memory_interval; the format in
// checkpoint/memory_step.h): the shard copied into the node's memory store every K steps and, with
// memory_replicas, sent to the rank's buddy on another node; and, when the coordinator resumes a
// generation from a memory step, the files this rank's boxes need fetched from the ranks on the
// nodes that hold them, so that the one resharding reader loads them as it loads a disk step.
//
// Both move files over `transfers`, a Gloo group of every rank of the generation that nothing
// else uses (the training thread's groups stay its own): the copies run on the memory writer's
// thread while training goes on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/commit.h"
#include "checkpoint/memory_step.h"
#include "worker/comm/communicator.h"
#include "worker/model/sharded_gpt.h"

namespace shardline::training {

// One rank's memory step, as it reports it: its shard (in `dir`, the step's folder in its node's
// store) and the ranks whose shards of the step it received and holds beside it.
struct MemorySaved {
  int64_t step = 0;
  std::string dir;
  checkpoint::SavedShard shard;
  std::vector<uint32_t> replica_of;
  checkpoint::DataIdentity data;  // the token stream it trained on (as a disk step's report)
};

struct MemoryTierOptions {
  std::string store;  // this node's memory store; empty: no memory tier
  std::string job_id;
  uint32_t generation = 0;
  int64_t interval = 0;  // steps; 0: no memory steps
  // For every rank, the rank that holds a copy of its memory shards; empty: no replicas.
  std::vector<uint32_t> buddies;
  // Every rank of the generation, plain Gloo; null when the generation is on one node and keeps
  // no replicas (then every file is where it is needed).
  comm::Communicator* transfers = nullptr;
  // Called on the memory writer's thread once the step's shard and the replicas this rank
  // receives are in its node's store.
  std::function<absl::Status(const MemorySaved&)> on_saved;
  // Assignment.memoryResume: the memory step to resume from; empty: none.
  std::string resume;
};

// The step folder where rank files of `step` go in this node's store.
absl::StatusOr<std::string> MemoryStepDir(const MemoryTierOptions& options, int64_t step);

// Exchanges the replicas of `step` after this rank wrote its shard of it (`own`, whose file's
// bytes are `own_bytes`): sends its file to its buddy and receives the files of the ranks whose
// buddy it is into `dir`. Every rank calls it for the same step. Returns the ranks it received
// for.
absl::StatusOr<std::vector<uint32_t>> ExchangeReplicas(const MemoryTierOptions& options, int rank,
                                                       const std::string& dir,
                                                       const checkpoint::SavedShard& own,
                                                       std::span<const std::byte> own_bytes);

// Removes what no resume can pick any more from this node's store: older generations' step
// folders before `keep_from`, and of this generation's the replicas this rank received for steps
// before it (`received`, by step: their folders; pruned entries are erased), then those folders
// once empty. Its own files are not removed: its in-place writer renames them into new steps.
void PruneMemorySteps(const MemoryTierOptions& options, int64_t keep_from,
                      std::map<int64_t, std::vector<std::string>>& received);

// Makes the memory step `resume` loadable here: works out which of its files this rank's boxes
// overlap (by a dry run of gpt.LoadState), has the ranks that hold them send those this node's
// store lacks, and writes the manifest beside them. Every rank calls it together. Returns the
// path of the manifest, which a CheckpointSource opens as a disk step's. Errors name the file.
absl::StatusOr<std::string> FetchMemoryStep(const MemoryTierOptions& options, int rank,
                                            const checkpoint::MemoryResume& resume,
                                            model::ShardedGpt& gpt);

}  // namespace shardline::training
