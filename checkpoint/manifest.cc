#include "checkpoint/manifest.h"

#include <filesystem>
#include <limits>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "checkpoint/checksum.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace shardline::checkpoint {
namespace {

using Json = nlohmann::json;

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

// nlohmann's get<int64_t>() takes any number: 2.5 becomes 2, and a float past int64's range is
// undefined behaviour (UBSan). A manifest's integers must be written as integers that fit.
int64_t Int64(const Json& value) {
  if (value.is_number_float()) {
    throw std::invalid_argument(value.dump() + " is not an integer");
  }
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw std::invalid_argument(value.dump() + " does not fit in a signed 64-bit integer");
  }
  return value.get<int64_t>();  // a type_error for what is not a number
}

uint64_t UInt64(const Json& value) {
  if (value.is_number_float() || (value.is_number_integer() && !value.is_number_unsigned())) {
    throw std::invalid_argument(value.dump() + " is not a non-negative integer");
  }
  return value.get<uint64_t>();
}

std::vector<int64_t> Int64s(const Json& value) {
  if (!value.is_array()) return value.get<std::vector<int64_t>>();  // the type_error
  std::vector<int64_t> values;
  values.reserve(value.size());
  for (const Json& element : value) values.push_back(Int64(element));
  return values;
}

uint64_t Checksum(const Json& value) {
  const std::string text = value.get<std::string>();
  const std::optional<uint64_t> checksum = ParseChecksumHex(text);
  if (!checksum) {
    throw std::invalid_argument("\"" + text + "\" is not a checksum (16 hex digits)");
  }
  return *checksum;
}

Json DataToJson(const DataIdentity& data) {
  Json json = {{"source", data.source},
               {"tokens", data.tokens},
               {"xxh3_64", ChecksumHex(data.xxh3)}};
  if (data.source == "synthetic") {
    json["synthetic_seed"] = data.synthetic_seed;
    json["synthetic_bytes"] = data.synthetic_bytes;
  } else {
    json["path"] = data.path;
  }
  return json;
}

DataIdentity DataFromJson(const Json& json) {
  DataIdentity data;
  data.source = json.at("source").get<std::string>();
  if (data.source == "synthetic") {
    data.synthetic_seed = UInt64(json.at("synthetic_seed"));
    data.synthetic_bytes = Int64(json.at("synthetic_bytes"));
  } else if (data.source == "file") {
    data.path = json.at("path").get<std::string>();
  } else {
    throw std::invalid_argument("source \"" + data.source + "\" is neither synthetic nor file");
  }
  data.tokens = Int64(json.at("tokens"));
  data.xxh3 = Checksum(json.at("xxh3_64"));
  return data;
}

Json TrainToJson(const TrainState& train) {
  const OptimizerSettings& o = train.optimizer;
  return {{"seed", train.seed},
          {"batch", train.batch},
          {"seq_len", train.seq_len},
          {"data", DataToJson(train.data)},
          {"steps", train.steps},
          {"optimizer",
           {{"lr", o.lr},
            {"beta1", o.beta1},
            {"beta2", o.beta2},
            {"eps", o.eps},
            {"weight_decay", o.weight_decay},
            {"grad_clip", o.grad_clip},
            {"warmup_steps", o.warmup_steps}}}};
}

TrainState TrainFromJson(const Json& json) {
  TrainState train;
  train.seed = UInt64(json.at("seed"));
  train.batch = Int64(json.at("batch"));
  train.seq_len = Int64(json.at("seq_len"));
  train.data = DataFromJson(json.at("data"));
  train.steps = Int64(json.at("steps"));
  const Json& o = json.at("optimizer");
  train.optimizer.lr = o.at("lr").get<double>();
  train.optimizer.beta1 = o.at("beta1").get<double>();
  train.optimizer.beta2 = o.at("beta2").get<double>();
  train.optimizer.eps = o.at("eps").get<double>();
  train.optimizer.weight_decay = o.at("weight_decay").get<double>();
  train.optimizer.grad_clip = o.at("grad_clip").get<double>();
  train.optimizer.warmup_steps = Int64(o.at("warmup_steps"));
  return train;
}

Json PlanToJson(const PlanInfo& plan) {
  return {{"tp", plan.tp},
          {"pp", plan.pp},
          {"dp", plan.dp},
          {"zero", plan.zero},
          {"micro_batch", plan.micro_batch},
          {"stage_layers", plan.stage_layers},
          {"device", plan.device},
          {"precision", plan.precision},
          {"schedule", plan.schedule},
          {"virtual_stages", plan.virtual_stages},
          {"recompute", plan.recompute}};
}

PlanInfo PlanFromJson(const Json& json) {
  PlanInfo plan;
  plan.tp = Int64(json.at("tp"));
  plan.pp = Int64(json.at("pp"));
  plan.dp = Int64(json.at("dp"));
  plan.zero = Int64(json.at("zero"));
  plan.micro_batch = Int64(json.at("micro_batch"));
  plan.stage_layers = Int64s(json.at("stage_layers"));
  plan.device = json.at("device").get<std::string>();
  plan.precision = json.at("precision").get<std::string>();
  // Written since the schedules and recomputation came; older manifests have none of the three.
  if (json.contains("schedule")) plan.schedule = json.at("schedule").get<std::string>();
  if (json.contains("virtual_stages")) plan.virtual_stages = Int64(json.at("virtual_stages"));
  if (json.contains("recompute")) plan.recompute = json.at("recompute").get<std::string>();
  return plan;
}

}  // namespace

absl::Status ValidateManifest(const Manifest& manifest, const std::string& source) {
  const auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("manifest ", source, ": ", what));
  };
  if (manifest.world_size < 1) return error(absl::StrCat("world_size ", manifest.world_size));
  if (manifest.step < 0) return error(absl::StrCat("step ", manifest.step));
  for (const auto& [name, file] : manifest.files) {
    if (!IsNameInsideStepFolder(name)) {
      return error(absl::StrCat("file \"", name, "\" is not a name inside the step's folder"));
    }
    if (file.rank < 0 || file.rank >= manifest.world_size) {
      return error(absl::StrCat("file ", name, ": rank ", file.rank, " outside [0, ",
                                manifest.world_size, ")"));
    }
  }
  for (const auto& [name, tensor] : manifest.tensors) {
    // An init-capture: clang 14 (the fuzz build's) cannot capture a structured binding itself.
    const auto tensor_error = [&, &name = name](absl::string_view what) {
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
      const auto file = manifest.files.find(slice.file);
      if (file == manifest.files.end()) {
        return tensor_error(absl::StrCat(which, ": the file is not among the manifest's files"));
      }
      if (file->second.rank != slice.rank) {
        return tensor_error(absl::StrCat(which, ": the file belongs to rank ", file->second.rank));
      }
      if (slice.offsets.size() != tensor.global_shape.size() ||
          slice.shape.size() != tensor.global_shape.size()) {
        return tensor_error(absl::StrCat(which, ": offsets ", ShapeString(slice.offsets),
                                         " and shape ", ShapeString(slice.shape),
                                         " do not match the rank of ",
                                         ShapeString(tensor.global_shape)));
      }
      for (size_t d = 0; d < slice.offsets.size(); ++d) {
        // Written so that no sum can overflow, whatever a file holds.
        if (slice.offsets[d] < 0 || slice.shape[d] < 0 ||
            slice.offsets[d] > tensor.global_shape[d] ||
            slice.shape[d] > tensor.global_shape[d] - slice.offsets[d]) {
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
  Json files = Json::object();
  for (const auto& [name, file] : manifest.files) {
    files[name] = {{"rank", file.rank}, {"bytes", file.bytes}, {"xxh3_64", ChecksumHex(file.xxh3)}};
  }
  Json tensors = Json::object();
  for (const auto& [name, tensor] : manifest.tensors) {
    Json shards = Json::array();
    for (const ShardSlice& slice : tensor.shards) {
      shards.push_back({{"rank", slice.rank},
                        {"file", slice.file},
                        {"tensor", slice.tensor},
                        {"offsets", slice.offsets},
                        {"shape", slice.shape},
                        {"xxh3_64", ChecksumHex(slice.xxh3)}});
    }
    tensors[name] = {{"dtype", DTypeName(tensor.dtype)},
                     {"global_shape", tensor.global_shape},
                     {"shards", shards}};
  }
  const Json json = {{"version", kManifestVersion},
                     {"step", manifest.step},
                     {"world_size", manifest.world_size},
                     {"metadata", manifest.metadata},
                     {"train", TrainToJson(manifest.train)},
                     {"plan", PlanToJson(manifest.plan)},
                     {"files", files},
                     {"tensors", tensors}};
  return json.dump(1);
}

absl::StatusOr<Manifest> ParseManifest(std::string_view text, const std::string& source) {
  Manifest manifest;
  // nlohmann reports wrong types by exception, our parsers bad values by invalid_argument; each
  // becomes an error naming the key it was in.
  std::string context = "the document";
  try {
    const Json json = Json::parse(text.begin(), text.end());
    context = "version";
    if (Int64(json.at("version")) != kManifestVersion) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest ", source, ": version ", json.at("version").dump(), ", expected ",
          kManifestVersion,
          " (version 1 manifests predate checksums and optimizer state; load their parameters "
          "with an older shardline, or re-save)"));
    }
    context = "step";
    manifest.step = Int64(json.at("step"));
    context = "world_size";
    manifest.world_size = Int64(json.at("world_size"));
    context = "metadata";
    manifest.metadata = json.at("metadata").get<std::map<std::string, std::string>>();
    context = "train";
    manifest.train = TrainFromJson(json.at("train"));
    context = "plan";
    manifest.plan = PlanFromJson(json.at("plan"));
    for (const auto& [name, entry] : json.at("files").items()) {
      context = absl::StrCat("file '", name, "'");
      manifest.files.emplace(name, ShardFileInfo{Int64(entry.at("rank")),
                                                 UInt64(entry.at("bytes")),
                                                 Checksum(entry.at("xxh3_64"))});
    }
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
        tensor.shards.push_back(ShardSlice{
            Int64(shard.at("rank")), shard.at("file").get<std::string>(),
            shard.at("tensor").get<std::string>(), Int64s(shard.at("offsets")),
            Int64s(shard.at("shape")), Checksum(shard.at("xxh3_64"))});
      }
      manifest.tensors.emplace(name, std::move(tensor));
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest ", source, ": in ", context, ": ", e.what()));
  } catch (const std::invalid_argument& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest ", source, ": in ", context, ": ", e.what()));
  }
  RETURN_IF_ERROR(ValidateManifest(manifest, source));
  return manifest;
}

absl::Status WriteManifest(FileSystem& fs, const std::string& path, const Manifest& manifest) {
  RETURN_IF_ERROR(ValidateManifest(manifest, path));
  return WriteFileAtomically(fs, path, ManifestToJson(manifest) + "\n");
}

absl::StatusOr<Manifest> ReadManifest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("manifest ", path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseManifest(text.str(), path);
}

bool HasOptimizerState(const Manifest& manifest) {
  bool any = false;
  for (const auto& [name, tensor] : manifest.tensors) {
    const StateTensor state = ParseStateTensorName(name);
    if (state.kind != StateKind::kParam) continue;
    any = true;
    for (const StateKind kind : {StateKind::kExpAvg, StateKind::kExpAvgSq}) {
      const auto moment = manifest.tensors.find(StateTensorName(kind, name));
      if (moment == manifest.tensors.end() || moment->second.global_shape != tensor.global_shape) {
        return false;
      }
    }
  }
  return any;
}

}  // namespace shardline::checkpoint
