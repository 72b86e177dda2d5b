// Writes one safetensors file (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length, a JSON header, then the tensors' bytes. Files load in PyTorch's
// safetensors.torch.load_file as they are.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/file_system.h"
#include "checkpoint/tensor_data.h"

namespace shardline::checkpoint {

// Collects tensors, then writes them all in Finish(). Not thread-safe.
//
// Layout: the header is padded with spaces so that the data section starts 8-byte aligned, and
// tensors are placed by element size, largest first (then by name), so every tensor is aligned to
// its element size. Per-tensor padding to 8 is not possible: the format forbids holes in the data.
class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string path) : path_(std::move(path)) {}

  // A string-to-string entry of "__metadata__" (the format allows nothing else there).
  void SetMetadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }

  // Records `tensor`; its bytes are not copied and must stay valid until Finish() returns.
  // InvalidArgument, naming the file and tensor, for an empty, reserved or repeated name, a
  // negative dimension, or a byte count that is not shape x dtype size.
  absl::Status Add(TensorView tensor);

  // What Finish wrote: the file's size and checksum (checksum.h's FileChecksum), and each
  // tensor's XXH3-64 (of its bytes alone).
  struct Written {
    uint64_t bytes = 0;
    uint64_t xxh3 = 0;
    std::map<std::string, uint64_t> tensor_xxh3;
  };

  // Writes the file atomically through `fs` (FileSystem::NewAtomicFile): either the old file or
  // the complete new one is there afterwards, even across a crash. The checksums are taken of the
  // bytes as they are written (each byte hashed once), not by reading the file back. Errors name
  // the path and the call.
  absl::StatusOr<Written> Finish(FileSystem& fs = DefaultFileSystem());

  // The data section in the order the tensors were added (a file the caller lays out itself, one
  // tensor after another: worker/checkpoint/shard_writer.h's in-place writer). Alignment holds
  // when every tensor has one dtype.
  void KeepAddedOrder() { keep_added_order_ = true; }
  // What Finish writes before the data: the 8-byte header length and the padded JSON header; the
  // data section follows it at this size. The views' bytes are not read.
  std::string HeaderRegion() const;

  const std::string& path() const { return path_; }

 private:
  // The tensors in file order.
  std::vector<const TensorView*> Ordered() const;

  std::string path_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorView> tensors_;
  bool keep_added_order_ = false;
};

}  // namespace shardline::checkpoint
