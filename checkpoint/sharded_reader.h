// Reads a sharded checkpoint (a manifest.json and the per-rank safetensors files it lists) by
// boxes of the global tensors, whatever plan wrote it: the resharding half of loading. A box that
// spans several shards is put together from the overlapping part of each; a rank of another plan
// reads only the shards its box touches.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/box.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/tensor_data.h"

namespace shardline::checkpoint {

// Movable, not copyable. Thread-safe: reads may run concurrently (the cache of open files is
// locked; the files themselves are read-only mappings).
class ShardedReader {
 public:
  // Reads and validates the manifest at `manifest_path` (ReadManifest: every tensor covered
  // exactly). Opens no shard file yet: each is opened, mapped and its header checked on the first
  // read that needs it, then kept open. Errors as ReadManifest's.
  static absl::StatusOr<ShardedReader> Open(const std::string& manifest_path);

  const std::string& path() const { return path_; }
  // The folder shard file names are relative to.
  const std::string& directory() const { return directory_; }
  const Manifest& manifest() const { return manifest_; }
  // nullptr when the manifest has no such tensor.
  const ManifestTensor* Find(const std::string& name) const;

  // The box [offsets, offsets + shape) of global tensor `name` as f32, row-major in `shape`.
  // Reads, from one of each set of replicas, the part of every shard that overlaps the box,
  // opening only those shards' files. Errors name the manifest, the tensor and, where one is at
  // fault, the shard (its rank and file): NotFound for a tensor not in the manifest or a missing
  // shard file or tensor in it; InvalidArgument for a box outside the global shape, a truncated or
  // malformed shard file, a shard tensor whose shape differs from its box in the manifest or whose
  // dtype differs from the manifest's or is not floating point; DataLoss for a file whose size
  // differs from the manifest's or a piece whose bytes fail their checksum (every piece is hashed
  // once, on its first read, so a load verifies exactly what it reads).
  absl::StatusOr<std::vector<float>> ReadBox(const std::string& name,
                                             std::span<const int64_t> offsets,
                                             std::span<const int64_t> shape) const;
  // The whole global tensor (ReadBox of all of it), shaped as the manifest's global_shape.
  absl::StatusOr<HostTensor> ReadTensor(const std::string& name) const;

  // How many shard files are open (for tests of lazy opening).
  size_t open_files() const;

 private:
  // Open files by their name in the manifest, and the pieces whose checksum has been checked;
  // behind a pointer so that the reader stays movable.
  struct Files {
    mutable std::mutex mutex;
    std::map<std::string, SafetensorsReader> open;  // node-based: entries never move
    std::set<std::pair<std::string, std::string>> verified;  // (file, tensor in it)
  };

  ShardedReader() = default;
  // The reader of `file` (relative to directory_), opening it on first use.
  absl::StatusOr<const SafetensorsReader*> File(const std::string& file) const;
  // The stored tensor of `slice`, checked against the manifest's box and dtype.
  absl::StatusOr<std::span<const std::byte>> ShardData(const std::string& name,
                                                       const ManifestTensor& tensor,
                                                       const ShardSlice& slice) const;

  std::string path_;
  std::string directory_;
  Manifest manifest_;
  std::unique_ptr<Files> files_;
};

}  // namespace shardline::checkpoint
