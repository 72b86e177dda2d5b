// A train job's checkpoint saves as its ranks report them: each rank's shard of a step checked
// against the job (a later step than the last committed, the folder the spec names, the same
// token stream on every rank) and gathered until every rank has saved it, then the step
// committed: its manifest written, `latest` moved, old steps pruned. The only I/O is the commit's,
// through the checkpoint::FileSystem passed in; no clock.
#pragma once

#include <cstdint>
#include <string>

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

// Writes the manifest of `step`, whose shards every rank has saved, then `latest`, then applies
// retention (keeping the step this generation resumed from). An error says why the step could
// not be committed; the job should not train on with nothing to resume from.
absl::Status CommitStep(Job& job, int64_t step, checkpoint::FileSystem& fs);

}  // namespace shardline::coordinator
