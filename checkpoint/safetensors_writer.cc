#include "checkpoint/safetensors_writer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "checkpoint/checksum.h"
#include "common/status_macros.h"

namespace shardline::checkpoint {

absl::Status SafetensorsWriter::Add(TensorView tensor) {
  const auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("writing checkpoint ", path_, ": tensor '", tensor.name, "': ", what));
  };
  if (tensor.name.empty()) return error("the name is empty");
  if (tensor.name == "__metadata__") return error("the name is reserved for the metadata");
  for (const TensorView& existing : tensors_) {
    if (existing.name == tensor.name) return error("added twice");
  }
  const std::optional<uint64_t> count = NumElements(tensor.shape);
  if (!count) return error(absl::StrCat("invalid shape ", ShapeString(tensor.shape)));
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(*count, DTypeSize(tensor.dtype), &bytes) ||
      bytes != tensor.data.size()) {
    return error(absl::StrCat("shape ", ShapeString(tensor.shape), " of ", DTypeName(tensor.dtype),
                              " needs ", *count, " x ", DTypeSize(tensor.dtype), " bytes, got ",
                              tensor.data.size()));
  }
  tensors_.push_back(std::move(tensor));
  return absl::OkStatus();
}

std::vector<const TensorView*> SafetensorsWriter::Ordered() const {
  std::vector<const TensorView*> order;
  for (const TensorView& tensor : tensors_) order.push_back(&tensor);
  if (keep_added_order_) return order;
  std::sort(order.begin(), order.end(), [](const TensorView* a, const TensorView* b) {
    const size_t size_a = DTypeSize(a->dtype);
    const size_t size_b = DTypeSize(b->dtype);
    return size_a != size_b ? size_a > size_b : a->name < b->name;
  });
  return order;
}

std::string SafetensorsWriter::HeaderRegion() const {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const TensorView* tensor : Ordered()) {
    header[tensor->name] = {{"dtype", DTypeName(tensor->dtype)},
                            {"shape", tensor->shape},
                            {"data_offsets", {offset, offset + tensor->data.size()}}};
    offset += tensor->data.size();
  }
  std::string header_text = header.dump();
  // Spaces are valid JSON whitespace; the official writer pads the same way.
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');
  const uint64_t header_size = header_text.size();
  std::string region(8, '\0');
  for (int i = 0; i < 8; ++i) region[i] = static_cast<char>(header_size >> (8 * i));
  return region + header_text;
}

absl::StatusOr<SafetensorsWriter::Written> SafetensorsWriter::Finish(FileSystem& fs) {
  const std::vector<const TensorView*> order = Ordered();
  const std::string header_region = HeaderRegion();
  uint64_t offset = 0;
  for (const TensorView* tensor : order) offset += tensor->data.size();

  Written written;
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs.NewAtomicFile(path_));
  RETURN_IF_ERROR(file->Append(std::as_bytes(std::span<const char>(header_region))));
  std::vector<uint64_t> checksums;
  for (const TensorView* tensor : order) {
    checksums.push_back(Xxh3Of(tensor->data));
    written.tensor_xxh3[tensor->name] = checksums.back();
    RETURN_IF_ERROR(file->Append(tensor->data));
  }
  RETURN_IF_ERROR(file->Commit());
  written.bytes = header_region.size() + offset;
  written.xxh3 = FileChecksum(std::as_bytes(std::span<const char>(header_region)), checksums);
  return written;
}

}  // namespace shardline::checkpoint
