#include "checkpoint/safetensors_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace shardline::checkpoint {
namespace {

// The official implementation refuses larger headers too; it bounds what a bad file can make
// us allocate.
constexpr uint64_t kMaxHeaderSize = 100'000'000;

using Json = nlohmann::json;

}  // namespace

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept {
  *this = std::move(other);
}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_size_);
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    data_ = std::exchange(other.data_, nullptr);
    data_size_ = std::exchange(other.data_size_, 0);
    metadata_ = std::move(other.metadata_);
    tensors_ = std::move(other.tensors_);
  }
  return *this;
}

SafetensorsReader::~SafetensorsReader() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_size_);
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  const std::string where = absl::StrCat("checkpoint ", path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string message = absl::StrCat(where, ": cannot open: ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a regular file"));
  }
  SafetensorsReader reader;
  reader.path_ = path;
  reader.map_size_ = static_cast<size_t>(info.st_size);
  if (reader.map_size_ < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(where, ": truncated: ", reader.map_size_,
                                                   " bytes, fewer than the 8-byte header length"));
  }
  void* map = ::mmap(nullptr, reader.map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(where, ": mmap: ", std::strerror(map_errno)));
  }
  reader.map_ = static_cast<const std::byte*>(map);
  RETURN_IF_ERROR(reader.ParseHeader());
  return reader;
}

absl::Status SafetensorsReader::ParseHeader() {
  const std::string where = absl::StrCat("checkpoint ", path_);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) {
    header_size = (header_size << 8) | static_cast<uint8_t>(map_[i]);
  }
  if (header_size > map_size_ - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": truncated or corrupt: the header length is ", header_size,
                     " bytes but only ", map_size_ - 8, " follow it"));
  }
  if (header_size > kMaxHeaderSize) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": header of ", header_size,
                                                   " bytes exceeds the limit of ", kMaxHeaderSize));
  }
  data_ = map_ + 8 + header_size;
  data_size_ = map_size_ - 8 - header_size;

  const char* text = reinterpret_cast<const char*>(map_ + 8);
  Json header;
  try {
    header = Json::parse(text, text + header_size);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the header is JSON ", header.type_name(), ", expected an object"));
  }

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": __metadata__ is ", entry.type_name(), ", expected an object"));
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": __metadata__ key '", key,
                                                         "' is ", value.type_name(),
                                                         ", expected a string"));
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    // An init-capture: clang 14 (the fuzz build's) cannot capture a structured binding itself.
    const auto error = [&, &name = name](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", name, "': ", what));
    };
    if (!entry.is_object()) return error(absl::StrCat("entry is ", entry.type_name()));
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || shape_it == entry.end() || offsets_it == entry.end()) {
      return error("entry needs \"dtype\", \"shape\" and \"data_offsets\"");
    }
    if (entry.size() != 3) return error("entry has keys besides dtype, shape and data_offsets");
    TensorInfo info;
    info.name = name;
    if (!dtype_it->is_string()) return error("dtype is not a string");
    const std::optional<SafetensorsDType> dtype = ParseDType(dtype_it->get<std::string>());
    if (!dtype) return error(absl::StrCat("unknown dtype \"", dtype_it->get<std::string>(), "\""));
    info.dtype = *dtype;
    if (!shape_it->is_array()) return error("shape is not an array");
    for (const Json& dim : *shape_it) {
      // number_unsigned rejects negative and fractional dimensions; the cap keeps int64 exact.
      if (!dim.is_number_unsigned() || dim.get<uint64_t>() > (uint64_t{1} << 62)) {
        return error(absl::StrCat("shape ", shape_it->dump(), " has an invalid dimension"));
      }
      info.shape.push_back(dim.get<int64_t>());
    }
    if (!offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      return error(absl::StrCat("data_offsets ", offsets_it->dump(), " are not two byte offsets"));
    }
    info.begin = (*offsets_it)[0].get<uint64_t>();
    info.end = (*offsets_it)[1].get<uint64_t>();
    if (info.begin > info.end || info.end > data_size_) {
      return error(absl::StrCat("data_offsets [", info.begin, ", ", info.end,
                                "] lie outside the data section of ", data_size_,
                                " bytes (truncated file?)"));
    }
    const std::optional<uint64_t> count = NumElements(info.shape);
    uint64_t bytes = 0;
    if (!count || __builtin_mul_overflow(*count, DTypeSize(info.dtype), &bytes) ||
        bytes != info.end - info.begin) {
      return error(absl::StrCat("shape ", ShapeString(info.shape), " of ", DTypeName(info.dtype),
                                " needs ", count ? absl::StrCat(bytes) : "too many",
                                " bytes but data_offsets [", info.begin, ", ", info.end, "] hold ",
                                info.end - info.begin));
    }
    tensors_.emplace(name, std::move(info));
  }

  // Overlapping tensors would alias each other's bytes: a corrupt or hostile file.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& [name, info] : tensors_) {
    if (info.end > info.begin) by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", by_offset[i]->name, "' (bytes [", by_offset[i]->begin,
                       ", ", by_offset[i]->end, ")) overlaps tensor '", by_offset[i - 1]->name,
                       "' (bytes [", by_offset[i - 1]->begin, ", ", by_offset[i - 1]->end, "))"));
    }
  }
  return absl::OkStatus();
}

const TensorInfo* SafetensorsReader::Find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<const TensorInfo*> SafetensorsReader::Get(const std::string& name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", path_, ": tensor '", name, "' is missing"));
  }
  return info;
}

std::span<const std::byte> SafetensorsReader::Data(const TensorInfo& info) const {
  return {data_ + info.begin, static_cast<size_t>(info.end - info.begin)};
}

absl::StatusOr<HostTensor> SafetensorsReader::ReadFloat(const std::string& name) const {
  ASSIGN_OR_RETURN(const TensorInfo* info, Get(name));
  HostTensor tensor;
  tensor.shape = info->shape;
  tensor.values.resize(*NumElements(info->shape));
  if (!ConvertToFloat(info->dtype, Data(*info).data(), tensor.values.size(),
                      tensor.values.data())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", path_, ": tensor '", name, "' has dtype ", DTypeName(info->dtype),
        ", expected a floating-point dtype (F32, F16, BF16, F64)"));
  }
  return tensor;
}

}  // namespace shardline::checkpoint
