// Committing a sharded checkpoint: every rank writes its shard of step s into DIR/step-NNNNNNNN
// and reports it (ShardSaved); once all ranks of the generation have, the coordinator writes the
// step's manifest.json (where every global tensor's pieces are), then DIR/latest. Each write is an
// atomic, durable rename, so a reader sees a step either fully committed or not at all, and a
// crash at any point loses nothing committed before.
//
// The manifest is the format of worker/checkpoint/manifest.h (ManifestToJson), which loaders read
// with ReadManifest. The coordinator may not include worker/ (DESIGN.md's layering), so the JSON
// is written here, with nlohmann_json, key for key the same; the integration test reads what the
// coordinator wrote back through the JSON keys of that format.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "placement/train_spec.h"

namespace shardline::coordinator {

// One global tensor's box in a shard file, as a ShardSaved reported it.
struct SavedTensorRecord {
  std::string name;
  std::string dtype;  // a safetensors dtype name
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
};

// One rank's shard of one step.
struct SavedShardRecord {
  int rank = 0;
  std::string dir;   // the step's folder, lexically normal
  std::string file;  // relative to dir
  std::vector<SavedTensorRecord> tensors;
};

// The shards of one step received so far, and what each tensor is (dtype, global shape) according
// to the first rank that reported it, so that checking a new shard costs its own tensors only.
struct PendingCheckpoint {
  struct Known {
    int rank = 0;
    std::string dtype;
    std::vector<int64_t> global_shape;
  };
  std::map<int, SavedShardRecord> shards;  // by rank
  std::map<std::string, Known> tensors;    // by name
};

// "step-00000042": the folder of a step inside the checkpoint dir; "latest" holds the name of
// the last committed one.
std::string StepDirName(int64_t step);

// InvalidArgument naming the rank, the file and the tensor unless `shard` is sound on its own
// (a relative file that stays inside the step's folder, known dtypes, boxes inside their global
// shapes, each tensor once) and agrees with the shards of the same step already received on every
// shared tensor's dtype and global shape.
absl::Status CheckSavedShard(const SavedShardRecord& shard, const PendingCheckpoint& pending);
// Adds a checked shard.
void AddSavedShard(SavedShardRecord shard, PendingCheckpoint& pending);

// The manifest metadata of a GPT model: what worker/checkpoint's Gpt2Metadata gives for the same
// config (format, format_version, model, n_layer, n_embd, n_head, d_ff, vocab_size, n_positions,
// tied_embeddings "true"/"false"), which single-file checkpoints carry in their header.
std::map<std::string, std::string> ModelMetadata(const placement::ModelSpec& model);

// The manifest of step `step` from the shards of all `world_size` ranks, as
// ManifestToJson writes it. InvalidArgument, naming the tensor, unless the shards of every tensor
// cover it exactly once (replicas, i.e. identical boxes, may repeat; partial overlaps and holes
// are errors).
absl::StatusOr<std::string> BuildManifestJson(int64_t step, int64_t world_size,
                                              const std::map<std::string, std::string>& metadata,
                                              const PendingCheckpoint& pending);

// Writes `manifest_json` to STEP_DIR/manifest.json, then "step-NNNNNNNN\n" to
// CHECKPOINT_DIR/latest, unless `update_latest` is false (a step older than one already committed).
// `step_dir` must be CHECKPOINT_DIR/StepDirName(step).
absl::Status CommitCheckpoint(const std::string& checkpoint_dir, int64_t step,
                              const std::string& manifest_json, bool update_latest);

// Writes `content` to `path` durably and atomically: a temporary in the same folder, fsync,
// rename, fsync of the folder. A reader sees the old file or the new one, never a mix.
absl::Status WriteFileAtomically(const std::string& path, std::string_view content);

}  // namespace shardline::coordinator
