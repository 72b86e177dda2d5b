#include "worker/checkpoint/manifest.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/atomic_file.h"

namespace shardline::checkpoint {
namespace {

using Json = nlohmann::json;

constexpr int kManifestVersion = 1;

bool SameBox(const ShardSlice& a, const ShardSlice& b) {
  return a.offsets == b.offsets && a.shape == b.shape;
}

bool Intersect(const ShardSlice& a, const ShardSlice& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] + a.shape[d] <= b.offsets[d] || b.offsets[d] + b.shape[d] <= a.offsets[d]) {
      return false;
    }
  }
  return true;
}

std::vector<int64_t> Int64s(const Json& value) { return value.get<std::vector<int64_t>>(); }

}  // namespace

absl::Status ValidateManifest(const Manifest& manifest, const std::string& source) {
  const auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("manifest ", source, ": ", what));
  };
  if (manifest.world_size < 1) return error(absl::StrCat("world_size ", manifest.world_size));
  if (manifest.step < 0) return error(absl::StrCat("step ", manifest.step));
  for (const auto& [name, tensor] : manifest.tensors) {
    const auto tensor_error = [&](absl::string_view what) {
      return error(absl::StrCat("tensor '", name, "': ", what));
    };
    const std::optional<uint64_t> volume = NumElements(tensor.global_shape);
    if (!volume)
      return tensor_error(absl::StrCat("invalid global shape ", ShapeString(tensor.global_shape)));
    if (tensor.shards.empty() && *volume > 0) return tensor_error("has no shards");
    uint64_t covered = 0;
    for (size_t i = 0; i < tensor.shards.size(); ++i) {
      const ShardSlice& slice = tensor.shards[i];
      const std::string which = absl::StrCat("shard of rank ", slice.rank, " in ", slice.file);
      if (slice.rank < 0 || slice.rank >= manifest.world_size) {
        return tensor_error(absl::StrCat(which, ": rank outside [0, ", manifest.world_size, ")"));
      }
      if (slice.file.empty() || slice.tensor.empty()) {
        return tensor_error(absl::StrCat(which, ": empty file or tensor name"));
      }
      if (slice.offsets.size() != tensor.global_shape.size() ||
          slice.shape.size() != tensor.global_shape.size()) {
        return tensor_error(absl::StrCat(which, ": offsets ", ShapeString(slice.offsets),
                                         " and shape ", ShapeString(slice.shape),
                                         " do not match the rank of ",
                                         ShapeString(tensor.global_shape)));
      }
      for (size_t d = 0; d < slice.offsets.size(); ++d) {
        if (slice.offsets[d] < 0 || slice.shape[d] < 0 ||
            slice.offsets[d] + slice.shape[d] > tensor.global_shape[d]) {
          return tensor_error(absl::StrCat(which, ": box at ", ShapeString(slice.offsets),
                                           " of shape ", ShapeString(slice.shape),
                                           " leaves the global shape ",
                                           ShapeString(tensor.global_shape)));
        }
      }
      bool replica = false;
      for (size_t j = 0; j < i; ++j) {
        const ShardSlice& other = tensor.shards[j];
        if (SameBox(slice, other)) {
          replica = true;
          break;
        }
        if (Intersect(slice, other) && *NumElements(slice.shape) > 0 &&
            *NumElements(other.shape) > 0) {
          return tensor_error(absl::StrCat(which, " partly overlaps the shard of rank ", other.rank,
                                           " in ", other.file));
        }
      }
      if (!replica) covered += *NumElements(slice.shape);
    }
    // Disjoint boxes inside the tensor cover it exactly when their volumes add up to it.
    if (covered != *volume) {
      return tensor_error(absl::StrCat("shards cover ", covered, " of ", *volume, " elements"));
    }
  }
  return absl::OkStatus();
}

std::string ManifestToJson(const Manifest& manifest) {
  Json tensors = Json::object();
  for (const auto& [name, tensor] : manifest.tensors) {
    Json shards = Json::array();
    for (const ShardSlice& slice : tensor.shards) {
      shards.push_back({{"rank", slice.rank},
                        {"file", slice.file},
                        {"tensor", slice.tensor},
                        {"offsets", slice.offsets},
                        {"shape", slice.shape}});
    }
    tensors[name] = {{"dtype", DTypeName(tensor.dtype)},
                     {"global_shape", tensor.global_shape},
                     {"shards", shards}};
  }
  const Json json = {{"version", kManifestVersion},
                     {"step", manifest.step},
                     {"world_size", manifest.world_size},
                     {"metadata", manifest.metadata},
                     {"tensors", tensors}};
  return json.dump(1);
}

absl::StatusOr<Manifest> ParseManifest(std::string_view text, const std::string& source) {
  Manifest manifest;
  // nlohmann reports wrong types by exception; each becomes an error naming the key it was in.
  std::string context = "the document";
  try {
    const Json json = Json::parse(text.begin(), text.end());
    context = "version";
    if (json.at("version").get<int>() != kManifestVersion) {
      return absl::InvalidArgumentError(absl::StrCat("manifest ", source, ": version ",
                                                     json.at("version").dump(), ", expected ",
                                                     kManifestVersion));
    }
    context = "step";
    manifest.step = json.at("step").get<int64_t>();
    context = "world_size";
    manifest.world_size = json.at("world_size").get<int64_t>();
    context = "metadata";
    manifest.metadata = json.at("metadata").get<std::map<std::string, std::string>>();
    for (const auto& [name, entry] : json.at("tensors").items()) {
      context = absl::StrCat("tensor '", name, "'");
      ManifestTensor tensor;
      const std::string dtype_name = entry.at("dtype").get<std::string>();
      const std::optional<SafetensorsDType> dtype = ParseDType(dtype_name);
      if (!dtype) {
        return absl::InvalidArgumentError(absl::StrCat("manifest ", source, ": tensor '", name,
                                                       "': unknown dtype \"", dtype_name, "\""));
      }
      tensor.dtype = *dtype;
      tensor.global_shape = Int64s(entry.at("global_shape"));
      for (const Json& shard : entry.at("shards")) {
        tensor.shards.push_back(ShardSlice{shard.at("rank").get<int64_t>(),
                                           shard.at("file").get<std::string>(),
                                           shard.at("tensor").get<std::string>(),
                                           Int64s(shard.at("offsets")), Int64s(shard.at("shape"))});
      }
      manifest.tensors.emplace(name, std::move(tensor));
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest ", source, ": in ", context, ": ", e.what()));
  }
  RETURN_IF_ERROR(ValidateManifest(manifest, source));
  return manifest;
}

absl::Status WriteManifest(const std::string& path, const Manifest& manifest) {
  RETURN_IF_ERROR(ValidateManifest(manifest, path));
  const std::string text = ManifestToJson(manifest) + "\n";
  const std::span<const std::byte> parts[] = {std::as_bytes(std::span<const char>(text))};
  return WriteFileAtomically(path, parts);
}

absl::StatusOr<Manifest> ReadManifest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("manifest ", path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseManifest(text.str(), path);
}

}  // namespace shardline::checkpoint
