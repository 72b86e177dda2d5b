// Reads and validates one safetensors file. The file is memory-mapped: opening costs only the
// header, and a rank that loads a slice touches only the pages it reads.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/tensor_data.h"

namespace shardline::checkpoint {

// One tensor's header entry; begin/end are byte offsets into the data section.
struct TensorInfo {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Movable, not copyable; thread-safe for concurrent reads once opened.
class SafetensorsReader {
 public:
  // Opens and validates `path`: the header length lies within the file and below 100 MB, the
  // header is a JSON object, "__metadata__" maps strings to strings, every tensor has a known
  // dtype, a non-negative shape and data_offsets [begin, end] inside the data section with
  // end - begin == elements x dtype size, and no two tensors' bytes overlap. NotFound for a
  // missing file; InvalidArgument for a malformed one. Every message names the file, and the
  // tensor when one is at fault.
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);

  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  ~SafetensorsReader();

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Every tensor, by name.
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }

  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;
  // NotFound naming the file and the tensor when absent.
  absl::StatusOr<const TensorInfo*> Get(const std::string& name) const;
  // The tensor's bytes, valid while this reader lives.
  std::span<const std::byte> Data(const TensorInfo& info) const;
  // The 8-byte header length and the header itself, as in the file (what FileChecksum covers
  // besides the tensors).
  std::span<const std::byte> HeaderRegion() const {
    return {map_, static_cast<size_t>(data_ - map_)};
  }

  // The tensor converted to fp32 (from F32, F64, F16 or BF16). NotFound when absent,
  // InvalidArgument for another dtype; both name the file and the tensor.
  absl::StatusOr<HostTensor> ReadFloat(const std::string& name) const;

 private:
  SafetensorsReader() = default;
  absl::Status ParseHeader();

  std::string path_;
  const std::byte* map_ = nullptr;  // the whole file
  size_t map_size_ = 0;
  const std::byte* data_ = nullptr;  // the data section, after the header
  size_t data_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace shardline::checkpoint
