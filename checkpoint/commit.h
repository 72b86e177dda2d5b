// Committing a checkpoint step, the same way for every writer: the coordinator of a sharded job
// (whose ranks report their shards over the wire) and the single-device trainer. Every rank writes
// its file into DIR/step-NNNNNNNN and reports what it wrote (SavedShard); once all ranks have, the
// step's manifest is built (StepAssembly), written (the commit: one atomic rename), and `latest` is
// pointed at it; older steps past `keep` are then removed (ApplyRetention). A crash at any point
// leaves every committed step loadable: a step folder without a manifest is not a checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/file_system.h"
#include "checkpoint/manifest.h"

namespace shardline::checkpoint {

// One stored piece, as the rank that wrote it reports it.
struct SavedPiece {
  std::string name;    // the global tensor: "h.3.fc.w", "optim.exp_avg.h.3.fc.w"
  std::string tensor;  // its name in the file
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  uint64_t xxh3 = 0;  // of the piece's bytes
};

// One rank's part of a step: `file` in the step's folder, or none when every box the rank holds
// is written by another rank (a tensor- or data-parallel replica).
struct SavedShard {
  int64_t rank = 0;
  std::string file;  // relative to the step's folder; empty: nothing written
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;  // of the whole file
  std::vector<SavedPiece> pieces;
};

// What the committer knows of the run, for the manifest's other sections.
struct StepHeader {
  int64_t step = 0;
  int64_t world_size = 0;
  std::map<std::string, std::string> metadata;  // ModelMetadata of the model
  TrainState train;
  PlanInfo plan;
};

// The shards of one step as they arrive, and the manifest they make. No I/O.
class StepAssembly {
 public:
  // Adds one rank's shard. InvalidArgument naming the rank, the file and the tensor unless the
  // shard is sound alone (a plain file name inside the step's folder; named pieces with known
  // dtypes, each in-file name once, boxes inside their global shapes) and agrees with the shards
  // already added on the dtype and global shape of every tensor they share; AlreadyExists when the
  // rank was added before. Nothing is added on error.
  absl::Status Add(SavedShard shard);

  size_t size() const { return shards_.size(); }
  bool Has(int64_t rank) const { return shards_.contains(rank); }

  // The step's manifest, validated by ValidateManifest: InvalidArgument naming the tensor when the
  // shards do not cover it exactly once (holes, partial overlaps).
  absl::StatusOr<Manifest> Build(const StepHeader& header) const;

 private:
  struct Known {
    int64_t rank = 0;
    SafetensorsDType dtype = SafetensorsDType::kF32;
    std::vector<int64_t> global_shape;
  };
  std::map<int64_t, SavedShard> shards_;  // by rank
  std::map<std::string, Known> known_;    // by global tensor name: as its first reporter said
};

// Commits `manifest` as step manifest.step of `dir`: checks that every file it lists is in the
// step's folder with the size its writer reported (FailedPrecondition naming the file), writes
// manifest.json (the commit), then points `latest` at the step unless a newer one is committed.
absl::Status CommitStep(FileSystem& fs, const std::string& dir, const Manifest& manifest);

// Keeps the `keep` newest committed steps of `dir` and those in `protect`, and removes the other
// committed steps, as well as the uncommitted step folders older than the newest committed step
// (saves a crash interrupted; a save in progress is always newer), and the temporaries of a
// `latest` whose writer died before renaming it. keep <= 0 keeps every committed step. Returns
// what it removed.
absl::StatusOr<std::vector<std::string>> ApplyRetention(FileSystem& fs, const std::string& dir,
                                                        int64_t keep,
                                                        std::span<const int64_t> protect = {});

}  // namespace shardline::checkpoint
