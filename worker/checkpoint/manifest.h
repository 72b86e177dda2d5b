// The manifest of a sharded checkpoint: one safetensors file per rank, and this JSON file saying
// where every global tensor's pieces are. A loader with another plan reads, for each slice it
// needs, the overlapping parts of the shards listed here (the resharding itself comes with the
// sharded model; these are the types and their validation).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/checkpoint/tensor_data.h"

namespace shardline::checkpoint {

// One stored piece of a global tensor: the box [offsets, offsets + shape) of it, held by `rank`
// as tensor `tensor` (shape `shape`) in `file` (relative to the manifest's directory).
struct ShardSlice {
  int64_t rank = 0;
  std::string file;
  std::string tensor;
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;

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

struct Manifest {
  int64_t step = 0;
  int64_t world_size = 0;
  std::map<std::string, std::string> metadata;    // e.g. the model config, as in single files
  std::map<std::string, ManifestTensor> tensors;  // by global name

  bool operator==(const Manifest&) const = default;
};

// InvalidArgument, naming `source` and the tensor, unless every slice has the tensor's rank, lies
// inside the global shape, belongs to a rank in [0, world_size), and the slices cover the tensor
// exactly (partial overlaps and holes are errors; identical replicas are not).
absl::Status ValidateManifest(const Manifest& manifest, const std::string& source);

std::string ManifestToJson(const Manifest& manifest);
// Parses and validates; `source` names the text in errors.
absl::StatusOr<Manifest> ParseManifest(std::string_view json, const std::string& source);

// Validates, then writes atomically (committing a step is this one rename).
absl::Status WriteManifest(const std::string& path, const Manifest& manifest);
absl::StatusOr<Manifest> ReadManifest(const std::string& path);

}  // namespace shardline::checkpoint
