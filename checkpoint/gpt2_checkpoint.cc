#include "checkpoint/gpt2_checkpoint.h"

#include <charconv>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"

namespace shardline::checkpoint {
namespace {

constexpr char kFormat[] = "shardline";
constexpr char kFormatVersion[] = "1";
constexpr char kModel[] = "gpt2";
// Absent in files written before untied heads existed, which were all tied.
constexpr char kTiedKey[] = "tied_embeddings";

// The metadata keys that hold the config, and where each lives in it.
struct ConfigKey {
  const char* key;
  int64_t Gpt2Config::*field;
};
constexpr ConfigKey kConfigKeys[] = {
    {"n_layer", &Gpt2Config::n_layer},       {"n_embd", &Gpt2Config::n_embd},
    {"n_head", &Gpt2Config::n_head},         {"d_ff", &Gpt2Config::d_ff},
    {"vocab_size", &Gpt2Config::vocab_size}, {"n_positions", &Gpt2Config::n_positions},
};

}  // namespace

std::vector<Gpt2TensorSpec> Gpt2TensorSpecs(const Gpt2Config& config) {
  const int64_t c = config.n_embd;
  const int64_t f = config.d_ff;
  std::vector<Gpt2TensorSpec> specs;
  const auto add = [&](std::string name, std::vector<int64_t> shape) {
    specs.push_back({std::move(name), shape, shape});
  };
  add("wte", {config.vocab_size, c});
  add("wpe", {config.n_positions, c});
  for (int64_t l = 0; l < config.n_layer; ++l) {
    const std::string h = absl::StrCat("h.", l, ".");
    add(h + "ln1.w", {c});
    add(h + "ln1.b", {c});
    specs.push_back({h + "qkv.w", {3 * c, c}, {3, c, c}});
    specs.push_back({h + "qkv.b", {3 * c}, {3, c}});
    add(h + "attn_proj.w", {c, c});
    add(h + "attn_proj.b", {c});
    add(h + "ln2.w", {c});
    add(h + "ln2.b", {c});
    add(h + "fc.w", {f, c});
    add(h + "fc.b", {f});
    add(h + "fc_proj.w", {c, f});
    add(h + "fc_proj.b", {c});
  }
  add("lnf.w", {c});
  add("lnf.b", {c});
  if (!config.tied_embeddings) add("lm_head.w", {config.vocab_size, c});
  return specs;
}

absl::Status ValidateGpt2Config(const Gpt2Config& config) {
  for (const ConfigKey& key : kConfigKeys) {
    if (config.*key.field <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPT-2 config: ", key.key, " must be positive, got ", config.*key.field));
    }
  }
  if (config.n_embd % config.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GPT-2 config: n_head ", config.n_head,
                                                   " does not divide n_embd ", config.n_embd));
  }
  return absl::OkStatus();
}

std::map<std::string, std::string> Gpt2Metadata(const Gpt2Config& config) {
  std::map<std::string, std::string> metadata = {
      {"format", kFormat}, {"format_version", kFormatVersion}, {"model", kModel}};
  for (const ConfigKey& key : kConfigKeys) metadata[key.key] = absl::StrCat(config.*key.field);
  metadata[kTiedKey] = config.tied_embeddings ? "true" : "false";
  return metadata;
}

absl::StatusOr<Gpt2Config> Gpt2ConfigFromMetadata(
    const std::map<std::string, std::string>& metadata, const std::string& where) {
  const auto get = [&](const char* key) -> absl::StatusOr<std::string> {
    const auto it = metadata.find(key);
    if (it == metadata.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": metadata key '", key, "' is missing (not a Shardline GPT-2 checkpoint? ",
          "Hugging Face files load through ImportHfGpt2)"));
    }
    return it->second;
  };
  ASSIGN_OR_RETURN(const std::string format, get("format"));
  ASSIGN_OR_RETURN(const std::string version, get("format_version"));
  ASSIGN_OR_RETURN(const std::string model, get("model"));
  if (format != kFormat || version != kFormatVersion || model != kModel) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": metadata says format '", format, "' version '", version, "' model '", model,
        "', expected '", kFormat, "' version '", kFormatVersion, "' model '", kModel, "'"));
  }
  Gpt2Config config;
  for (const ConfigKey& key : kConfigKeys) {
    ASSIGN_OR_RETURN(const std::string text, get(key.key));
    int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": metadata key '", key.key, "' is '",
                                                     text, "', expected an integer"));
    }
    config.*key.field = value;
  }
  if (const auto it = metadata.find(kTiedKey); it != metadata.end()) {
    if (it->second != "true" && it->second != "false") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": metadata key '", kTiedKey, "' is '",
                                                     it->second, "', expected true or false"));
    }
    config.tied_embeddings = it->second == "true";
  }
  RETURN_IF_ERROR(Annotate(ValidateGpt2Config(config), where));
  return config;
}

absl::Status WriteGpt2Checkpoint(const std::string& path, const Gpt2Weights& weights) {
  RETURN_IF_ERROR(
      Annotate(ValidateGpt2Config(weights.config), absl::StrCat("writing checkpoint ", path)));
  SafetensorsWriter writer(path);
  for (auto& [key, value] : Gpt2Metadata(weights.config)) {
    writer.SetMetadata(key, std::move(value));
  }
  for (const Gpt2TensorSpec& spec : Gpt2TensorSpecs(weights.config)) {
    const auto it = weights.tensors.find(spec.name);
    if (it == weights.tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("writing checkpoint ", path, ": tensor '", spec.name, "' is missing"));
    }
    if (it->second.shape != spec.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("writing checkpoint ", path, ": tensor '", spec.name, "' has shape ",
                       ShapeString(it->second.shape), ", expected ", ShapeString(spec.shape)));
    }
    RETURN_IF_ERROR(writer.Add(it->second.View(spec.name)));
  }
  return writer.Finish().status();
}

absl::StatusOr<Gpt2Weights> ReadGpt2Checkpoint(const std::string& path) {
  ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
  const std::string where = absl::StrCat("checkpoint ", path);
  Gpt2Weights weights;
  ASSIGN_OR_RETURN(weights.config, Gpt2ConfigFromMetadata(reader.metadata(), where));
  const std::vector<Gpt2TensorSpec> specs = Gpt2TensorSpecs(weights.config);
  for (const Gpt2TensorSpec& spec : specs) {
    ASSIGN_OR_RETURN(HostTensor tensor, reader.ReadFloat(spec.name));
    if (tensor.shape != spec.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", spec.name, "' has shape ", ShapeString(tensor.shape),
                       ", expected ", ShapeString(spec.shape), " for the config in its metadata"));
    }
    weights.tensors.emplace(spec.name, std::move(tensor));
  }
  if (reader.tensors().size() != specs.size()) {
    for (const auto& [name, info] : reader.tensors()) {
      if (!weights.tensors.contains(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unexpected tensor '", name, "' for a GPT-2 of this config"));
      }
    }
  }
  return weights;
}

}  // namespace shardline::checkpoint
