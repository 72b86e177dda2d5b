#include "checkpoint/sharded_reader.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/checksum.h"
#include "checkpoint/verify.h"
#include "common/status_macros.h"

namespace shardline::checkpoint {
namespace {

bool Overlaps(const ShardSlice& slice, std::span<const int64_t> offsets,
              std::span<const int64_t> shape) {
  for (size_t d = 0; d < shape.size(); ++d) {
    if (std::max(slice.offsets[d], offsets[d]) >=
        std::min(slice.offsets[d] + slice.shape[d], offsets[d] + shape[d])) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<ShardedReader> ShardedReader::Open(const std::string& manifest_path) {
  ShardedReader reader;
  ASSIGN_OR_RETURN(reader.manifest_, ReadManifest(manifest_path));
  reader.path_ = manifest_path;
  reader.directory_ = std::filesystem::path(manifest_path).parent_path().string();
  reader.files_ = std::make_unique<Files>();
  return reader;
}

const ManifestTensor* ShardedReader::Find(const std::string& name) const {
  const auto it = manifest_.tensors.find(name);
  return it == manifest_.tensors.end() ? nullptr : &it->second;
}

size_t ShardedReader::open_files() const {
  std::lock_guard<std::mutex> lock(files_->mutex);
  return files_->open.size();
}

absl::StatusOr<const SafetensorsReader*> ShardedReader::File(const std::string& file) const {
  std::lock_guard<std::mutex> lock(files_->mutex);
  if (const auto it = files_->open.find(file); it != files_->open.end()) return &it->second;
  // Opening under the lock costs one header parse per file, once; it keeps a file from being
  // mapped twice by concurrent readers.
  const std::string full =
      directory_.empty() ? file : (std::filesystem::path(directory_) / file).string();
  // A truncated file is named as such before its header is read (whose error would say less).
  if (const auto info = manifest_.files.find(file); info != manifest_.files.end()) {
    RETURN_IF_ERROR(CheckFileSize(full, info->second.bytes, full));
  }
  ASSIGN_OR_RETURN(SafetensorsReader opened, SafetensorsReader::Open(full));
  return &files_->open.emplace(file, std::move(opened)).first->second;
}

absl::StatusOr<std::span<const std::byte>> ShardedReader::ShardData(const std::string& name,
                                                                    const ManifestTensor& tensor,
                                                                    const ShardSlice& slice) const {
  const std::string where = absl::StrCat("sharded checkpoint ", path_, ": tensor '", name,
                                         "': shard of rank ", slice.rank, " in ", slice.file);
  absl::StatusOr<const SafetensorsReader*> file = File(slice.file);
  if (!file.ok()) return Annotate(file.status(), where);
  const TensorInfo* info = (*file)->Find(slice.tensor);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(where, ": the file has no tensor '", slice.tensor,
                                            "' (", (*file)->path(), ")"));
  }
  if (info->shape != slice.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensor '", slice.tensor, "' has shape ", ShapeString(info->shape),
                     " but the manifest gives its box the shape ", ShapeString(slice.shape)));
  }
  if (info->dtype != tensor.dtype || !IsFloatDType(info->dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensor '", slice.tensor, "' has dtype ", DTypeName(info->dtype),
                     ", the manifest says ", DTypeName(tensor.dtype),
                     IsFloatDType(tensor.dtype) ? "" : " (weights must be F32, F16, BF16 or F64)"));
  }
  const std::span<const std::byte> data = (*file)->Data(*info);
  {
    std::lock_guard<std::mutex> lock(files_->mutex);
    if (files_->verified.contains({slice.file, slice.tensor})) return data;
  }
  // Hashed outside the lock: concurrent readers of other pieces need not wait. Two readers of the
  // same piece may both hash it, which is harmless.
  const uint64_t checksum = Xxh3Of(data);
  if (checksum != slice.xxh3) {
    return absl::DataLossError(absl::StrCat(where, ": the bytes of '", slice.tensor,
                                            "' fail their checksum (", ChecksumHex(checksum),
                                            ", the manifest says ", ChecksumHex(slice.xxh3), ")"));
  }
  std::lock_guard<std::mutex> lock(files_->mutex);
  files_->verified.emplace(slice.file, slice.tensor);
  return data;
}

absl::StatusOr<std::vector<float>> ShardedReader::ReadBox(const std::string& name,
                                                          std::span<const int64_t> offsets,
                                                          std::span<const int64_t> shape) const {
  const ManifestTensor* tensor = Find(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("sharded checkpoint ", path_, ": tensor '", name, "' is not in the manifest"));
  }
  RETURN_IF_ERROR(CheckBox(tensor->global_shape, offsets, shape,
                           absl::StrCat("sharded checkpoint ", path_, ": tensor '", name, "'")));
  std::vector<float> out(*NumElements(shape));
  if (out.empty()) return out;
  // The manifest is validated: distinct boxes are disjoint and cover the tensor, so copying one
  // replica of every distinct box that overlaps ours writes each element of `out` exactly once.
  std::vector<const ShardSlice*> done;
  for (const ShardSlice& slice : tensor->shards) {
    if (!Overlaps(slice, offsets, shape)) continue;
    const auto same_box = [&](const ShardSlice* other) {
      return other->offsets == slice.offsets && other->shape == slice.shape;
    };
    if (std::any_of(done.begin(), done.end(), same_box)) continue;
    // Of a set of replicas, read one whose file is already open, so that loading a model from
    // tensor-parallel files opens no file just for a replicated LayerNorm.
    const ShardSlice* chosen = &slice;
    {
      std::lock_guard<std::mutex> lock(files_->mutex);
      for (const ShardSlice& other : tensor->shards) {
        if (same_box(&other) && files_->open.contains(other.file)) {
          chosen = &other;
          break;
        }
      }
    }
    ASSIGN_OR_RETURN(const std::span<const std::byte> data, ShardData(name, *tensor, *chosen));
    CopyBoxOverlap(tensor->dtype, data.data(), chosen->offsets, chosen->shape, offsets, shape,
                   out.data());
    done.push_back(&slice);
  }
  return out;
}

absl::StatusOr<HostTensor> ShardedReader::ReadTensor(const std::string& name) const {
  const ManifestTensor* tensor = Find(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("sharded checkpoint ", path_, ": tensor '", name, "' is not in the manifest"));
  }
  HostTensor out;
  out.shape = tensor->global_shape;
  const std::vector<int64_t> zeros(out.shape.size(), 0);
  ASSIGN_OR_RETURN(out.values, ReadBox(name, zeros, out.shape));
  return out;
}

}  // namespace shardline::checkpoint
