// Reads a sharded checkpoint (a manifest.json and the per-rank safetensors files it lists) by
// boxes of the global tensors, whatever plan wrote it: the resharding half of loading. A box that
// spans several shards is put together from the overlapping part of each; a rank of another plan
// reads only the shards its box touches.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/safetensors_reader.h"
#include "worker/checkpoint/tensor_data.h"

namespace shardline::checkpoint {

// OK when the box [offsets, offsets + shape) has the rank of `global_shape` and lies inside it;
// otherwise InvalidArgument prefixed by `where`, with the numbers.
absl::Status CheckBox(std::span<const int64_t> global_shape, std::span<const int64_t> offsets,
                      std::span<const int64_t> shape, const std::string& where);

// Copies into `out` (the box `box_offsets`/`box_shape` of a global tensor, f32, row-major) the
// elements that it shares with `piece`: the box `piece_offsets`/`piece_shape` of the same tensor,
// stored at `data` as `dtype`, row-major. Elements of `out` outside the piece are left alone. Any
// rank, including 0 (a scalar). False, copying nothing, when `dtype` is not F32/F64/F16/BF16.
bool CopyBoxOverlap(SafetensorsDType dtype, const std::byte* data,
                    std::span<const int64_t> piece_offsets, std::span<const int64_t> piece_shape,
                    std::span<const int64_t> box_offsets, std::span<const int64_t> box_shape,
                    float* out);

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
  // dtype differs from the manifest's or is not floating point.
  absl::StatusOr<std::vector<float>> ReadBox(const std::string& name,
                                             std::span<const int64_t> offsets,
                                             std::span<const int64_t> shape) const;
  // The whole global tensor (ReadBox of all of it), shaped as the manifest's global_shape.
  absl::StatusOr<HostTensor> ReadTensor(const std::string& name) const;

  // How many shard files are open (for tests of lazy opening).
  size_t open_files() const;

 private:
  // Open files by their name in the manifest; behind a pointer so that the reader stays movable.
  struct Files {
    mutable std::mutex mutex;
    std::map<std::string, SafetensorsReader> open;  // node-based: entries never move
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
