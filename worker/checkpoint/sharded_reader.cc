#include "worker/checkpoint/sharded_reader.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::checkpoint {
namespace {

bool IsFloat(SafetensorsDType dtype) {
  return dtype == SafetensorsDType::kF32 || dtype == SafetensorsDType::kF64 ||
         dtype == SafetensorsDType::kF16 || dtype == SafetensorsDType::kBF16;
}

// Row-major strides, in elements.
std::vector<int64_t> Strides(std::span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

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

absl::Status CheckBox(std::span<const int64_t> global_shape, std::span<const int64_t> offsets,
                      std::span<const int64_t> shape, const std::string& where) {
  if (offsets.size() != global_shape.size() || shape.size() != global_shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": box at ", ShapeString(offsets), " of shape ", ShapeString(shape),
                     " does not have the rank of the global shape ", ShapeString(global_shape)));
  }
  for (size_t d = 0; d < global_shape.size(); ++d) {
    // Written so that no sum can overflow, whatever a caller passes.
    if (offsets[d] < 0 || shape[d] < 0 || offsets[d] > global_shape[d] ||
        shape[d] > global_shape[d] - offsets[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": box at ", ShapeString(offsets), " of shape ", ShapeString(shape),
                       " leaves the global shape ", ShapeString(global_shape)));
    }
  }
  return absl::OkStatus();
}

bool CopyBoxOverlap(SafetensorsDType dtype, const std::byte* data,
                    std::span<const int64_t> piece_offsets, std::span<const int64_t> piece_shape,
                    std::span<const int64_t> box_offsets, std::span<const int64_t> box_shape,
                    float* out) {
  if (!IsFloat(dtype)) return false;
  const size_t rank = piece_shape.size();
  if (rank == 0) return ConvertToFloat(dtype, data, 1, out);
  // The overlap [lo, lo + extent) in global coordinates.
  std::vector<int64_t> lo(rank), extent(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = std::max(piece_offsets[d], box_offsets[d]);
    const int64_t hi = std::min(piece_offsets[d] + piece_shape[d], box_offsets[d] + box_shape[d]);
    if (hi <= lo[d]) return true;  // nothing shared
    extent[d] = hi - lo[d];
  }
  const std::vector<int64_t> src_strides = Strides(piece_shape);
  const std::vector<int64_t> dst_strides = Strides(box_shape);
  // Trailing dimensions that the overlap spans whole in both the piece and the box are contiguous
  // in both, so each copy takes all of them at once: a row split of (V, C) copies one run.
  size_t inner = rank - 1;
  int64_t run = extent[inner];
  while (inner > 0 && extent[inner] == piece_shape[inner] && extent[inner] == box_shape[inner]) {
    --inner;
    run *= extent[inner];
  }
  const size_t element = DTypeSize(dtype);
  std::vector<int64_t> index(inner, 0);  // over the outer dimensions [0, inner)
  while (true) {
    int64_t src = (lo[inner] - piece_offsets[inner]) * src_strides[inner];
    int64_t dst = (lo[inner] - box_offsets[inner]) * dst_strides[inner];
    for (size_t d = 0; d < inner; ++d) {
      src += (lo[d] + index[d] - piece_offsets[d]) * src_strides[d];
      dst += (lo[d] + index[d] - box_offsets[d]) * dst_strides[d];
    }
    ConvertToFloat(dtype, data + static_cast<size_t>(src) * element, static_cast<size_t>(run),
                   out + dst);
    size_t d = inner;
    while (d > 0 && ++index[d - 1] == extent[d - 1]) index[--d] = 0;
    if (d == 0) break;
  }
  return true;
}

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
  if (info->dtype != tensor.dtype || !IsFloat(info->dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensor '", slice.tensor, "' has dtype ", DTypeName(info->dtype),
                     ", the manifest says ", DTypeName(tensor.dtype),
                     IsFloat(tensor.dtype) ? "" : " (weights must be F32, F16, BF16 or F64)"));
  }
  return (*file)->Data(*info);
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
