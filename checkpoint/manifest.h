// The manifest of a checkpoint step: one safetensors file per rank, and this JSON file saying where
// every global tensor's pieces are, with a checksum of every file and every piece, the training
// state beside the tensors (train_state.h) and the plan that wrote it. A loader with any plan reads,
// for each box it needs, the overlapping parts of the pieces listed here (sharded_reader.h).
// docs/checkpoint-format.md is the specification.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/file_system.h"
#include "checkpoint/tensor_data.h"
#include "checkpoint/train_state.h"

namespace shardline::checkpoint {

inline constexpr int kManifestVersion = 2;

// One stored piece of a global tensor: the box [offsets, offsets + shape) of it, held by `rank`
// as tensor `tensor` (shape `shape`) in `file` (relative to the manifest's directory), whose bytes
// have the XXH3-64 `xxh3`.
struct ShardSlice {
  int64_t rank = 0;
  std::string file;
  std::string tensor;
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  uint64_t xxh3 = 0;

  bool operator==(const ShardSlice&) const = default;
};

struct ManifestTensor {
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> global_shape;
  // Together the slices cover the global tensor exactly once, except that replicas (slices with
  // the same box, e.g. data-parallel copies) may repeat; any one of them may be read.
  std::vector<ShardSlice> shards;

  bool operator==(const ManifestTensor&) const = default;
};

// One rank file as its writer saw it.
struct ShardFileInfo {
  int64_t rank = 0;
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;

  bool operator==(const ShardFileInfo&) const = default;
};

struct Manifest {
  int64_t step = 0;
  int64_t world_size = 0;
  std::map<std::string, std::string> metadata;  // the model config (ModelMetadata)
  TrainState train;
  PlanInfo plan;
  std::map<std::string, ShardFileInfo> files;     // by name, relative to the manifest's folder
  std::map<std::string, ManifestTensor> tensors;  // by global name

  bool operator==(const Manifest&) const = default;
};

// InvalidArgument, naming `source` and the tensor or file, unless: every file name is a plain
// relative path inside the step's folder (no "..", not absolute) of a rank in [0, world_size);
// every slice has the tensor's rank, lies inside the global shape, belongs to a rank in
// [0, world_size) and names a listed file of that rank; and the slices cover the tensor exactly
// (partial overlaps and holes are errors; identical replicas are not).
absl::Status ValidateManifest(const Manifest& manifest, const std::string& source);

std::string ManifestToJson(const Manifest& manifest);
// Parses and validates; `source` names the text in errors. Other versions than kManifestVersion
// are refused, saying which.
absl::StatusOr<Manifest> ParseManifest(std::string_view json, const std::string& source);

// Validates, then writes atomically (committing a step is this one rename).
absl::Status WriteManifest(FileSystem& fs, const std::string& path, const Manifest& manifest);
absl::StatusOr<Manifest> ReadManifest(const std::string& path);

// Whether the manifest holds both AdamW moments of every parameter it holds, so that a run can
// resume from it (and not only start from its parameters).
bool HasOptimizerState(const Manifest& manifest);

}  // namespace shardline::checkpoint
