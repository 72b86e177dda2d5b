#include "checkpoint/model_config.h"

#include <charconv>
#include <cmath>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/gpt2_hf_import.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_reader.h"
#include "common/status_macros.h"

namespace shardline::checkpoint {
namespace {

constexpr char kFormat[] = "shardline";
constexpr char kFormatVersion[] = "1";
// The `model` value of a config with GPT-2's choices; every reader before the other families
// existed checks for it, so a file of another family is refused by them, not misread.
constexpr char kGpt2Model[] = "gpt2";

// The metadata keys that hold the sizes, and where each lives in the config.
struct SizeKey {
  const char* key;
  int64_t model::ModelConfig::*field;
};
constexpr SizeKey kSizeKeys[] = {
    {"n_layer", &model::ModelConfig::layers},   {"n_embd", &model::ModelConfig::d_model},
    {"n_head", &model::ModelConfig::heads},     {"d_ff", &model::ModelConfig::d_ff},
    {"vocab_size", &model::ModelConfig::vocab}, {"n_positions", &model::ModelConfig::max_seq_len},
};

// Keys added after the first files: absent means the value those files had.
constexpr char kKvHeadsKey[] = "kv_heads";
constexpr char kTiedKey[] = "tied_embeddings";
constexpr char kNormKey[] = "norm";
constexpr char kNormEpsKey[] = "norm_eps";
constexpr char kMlpKey[] = "mlp";
constexpr char kPositionsKey[] = "positions";
constexpr char kRopeThetaKey[] = "rope_theta";
constexpr char kBiasKey[] = "bias";
constexpr char kHeadDimKey[] = "head_dim";  // absent: d_model / n_head
// Llama 3's rope scaling (absent: none), under transformers' names.
constexpr char kRopeScalingFactorKey[] = "rope_scaling.factor";
constexpr char kRopeLowKey[] = "rope_scaling.low_freq_factor";
constexpr char kRopeHighKey[] = "rope_scaling.high_freq_factor";
constexpr char kRopeOriginalKey[] = "rope_scaling.original_max_position_embeddings";

template <typename E>
struct Choice {
  std::string_view name;
  E value;
};
constexpr Choice<model::NormKind> kNorms[] = {{"layernorm", model::NormKind::kLayerNorm},
                                              {"rmsnorm", model::NormKind::kRmsNorm}};
constexpr Choice<model::MlpKind> kMlps[] = {{"gelu", model::MlpKind::kGelu},
                                            {"swiglu", model::MlpKind::kSwiGlu}};
constexpr Choice<model::PositionKind> kPositions[] = {{"learned", model::PositionKind::kLearned},
                                                      {"rotary", model::PositionKind::kRotary}};

// The shortest text that reads back as the same double: whole numbers as integers (500000), others
// in %g (1e-05).
std::string FormatDouble(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15) return absl::StrFormat("%.0f", value);
  for (int precision = 1; precision < 17; ++precision) {
    const std::string text = absl::StrFormat("%.*g", precision, value);
    double back = 0;
    if (absl::SimpleAtod(text, &back) && back == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

class MetadataReader {
 public:
  MetadataReader(const std::map<std::string, std::string>& metadata, const std::string& where)
      : metadata_(metadata), where_(where) {}

  absl::StatusOr<std::string> Required(const char* key) const {
    const auto it = metadata_.find(key);
    if (it == metadata_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where_, ": metadata key '", key, "' is missing (not a Shardline checkpoint? ",
          "Hugging Face files load through ImportHfGpt2)"));
    }
    return it->second;
  }
  const std::string* Optional(const char* key) const {
    const auto it = metadata_.find(key);
    return it == metadata_.end() ? nullptr : &it->second;
  }
  absl::Status Int(const char* key, const std::string& text, int64_t& out) const {
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
    if (error != std::errc() || end != text.data() + text.size()) {
      return Malformed(key, text, "an integer");
    }
    return absl::OkStatus();
  }
  absl::Status Double(const char* key, double& out) const {
    const std::string* text = Optional(key);
    if (text == nullptr) return absl::OkStatus();
    if (!absl::SimpleAtod(*text, &out) || !std::isfinite(out)) {
      return Malformed(key, *text, "a number");
    }
    return absl::OkStatus();
  }
  absl::Status Bool(const char* key, bool& out) const {
    const std::string* text = Optional(key);
    if (text == nullptr) return absl::OkStatus();
    if (*text != "true" && *text != "false") return Malformed(key, *text, "true or false");
    out = *text == "true";
    return absl::OkStatus();
  }
  template <typename E, size_t N>
  absl::Status Enum(const char* key, const Choice<E> (&choices)[N], E& out) const {
    const std::string* text = Optional(key);
    if (text == nullptr) return absl::OkStatus();
    std::string expected;
    for (const Choice<E>& choice : choices) {
      if (choice.name == *text) {
        out = choice.value;
        return absl::OkStatus();
      }
      absl::StrAppend(&expected, expected.empty() ? "" : " or ", std::string(choice.name));
    }
    return Malformed(key, *text, expected);
  }

 private:
  absl::Status Malformed(const char* key, const std::string& text,
                         std::string_view expected) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": metadata key '", key, "' is '", text,
                                                   "', expected ", std::string(expected)));
  }

  const std::map<std::string, std::string>& metadata_;
  const std::string& where_;
};

template <typename E, size_t N>
std::string ChoiceName(const Choice<E> (&choices)[N], E value) {
  for (const Choice<E>& choice : choices) {
    if (choice.value == value) return std::string(choice.name);
  }
  return "unknown";
}

// A Hugging Face Llama folder's config, once the whole folder is checked (every tensor present
// with its shape: HfLlamaFolder::Open reads only headers), so that whoever sizes a job from it
// refuses a bad folder before any rank starts.
absl::StatusOr<model::ModelConfig> ReadHfLlamaFolderConfig(const std::string& file) {
  ASSIGN_OR_RETURN(const HfLlamaFolder folder, HfLlamaFolder::Open(file));
  return folder.config();
}

}  // namespace

std::map<std::string, std::string> ModelMetadata(const model::ModelConfig& config) {
  const std::string_view family = config.FamilyName();
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"format_version", kFormatVersion},
      {"model", family == "gpt" ? kGpt2Model : std::string(family)}};
  for (const SizeKey& key : kSizeKeys) metadata[key.key] = absl::StrCat(config.*key.field);
  metadata["d_ff"] = absl::StrCat(config.ff());  // resolved: readers before 0 meant 4·C had none
  metadata[kKvHeadsKey] = absl::StrCat(config.kv());
  metadata[kTiedKey] = config.tied_embeddings ? "true" : "false";
  metadata[kNormKey] = ChoiceName(kNorms, config.norm);
  metadata[kNormEpsKey] = FormatDouble(config.norm_eps);
  metadata[kMlpKey] = ChoiceName(kMlps, config.mlp);
  metadata[kPositionsKey] = ChoiceName(kPositions, config.positions);
  metadata[kRopeThetaKey] = FormatDouble(config.rope_theta);
  metadata[kBiasKey] = config.bias ? "true" : "false";
  metadata[kHeadDimKey] = absl::StrCat(config.head_size());
  if (config.rope_scaling.enabled()) {
    metadata[kRopeScalingFactorKey] = FormatDouble(config.rope_scaling.factor);
    metadata[kRopeLowKey] = FormatDouble(config.rope_scaling.low_freq_factor);
    metadata[kRopeHighKey] = FormatDouble(config.rope_scaling.high_freq_factor);
    metadata[kRopeOriginalKey] = absl::StrCat(config.rope_scaling.original_max_positions);
  }
  return metadata;
}

absl::StatusOr<model::ModelConfig> ModelConfigFromMetadata(
    const std::map<std::string, std::string>& metadata, const std::string& where) {
  const MetadataReader reader(metadata, where);
  ASSIGN_OR_RETURN(const std::string format, reader.Required("format"));
  ASSIGN_OR_RETURN(const std::string version, reader.Required("format_version"));
  ASSIGN_OR_RETURN(const std::string family, reader.Required("model"));
  if (format != kFormat || version != kFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": metadata says format '", format,
                                                   "' version '", version, "', expected '", kFormat,
                                                   "' version '", kFormatVersion, "'"));
  }
  model::ModelConfig config;  // GPT-2's choices until the keys say otherwise
  for (const SizeKey& key : kSizeKeys) {
    ASSIGN_OR_RETURN(const std::string text, reader.Required(key.key));
    RETURN_IF_ERROR(reader.Int(key.key, text, config.*key.field));
  }
  if (const std::string* kv = reader.Optional(kKvHeadsKey); kv != nullptr) {
    RETURN_IF_ERROR(reader.Int(kKvHeadsKey, *kv, config.kv_heads));
  }
  RETURN_IF_ERROR(reader.Bool(kTiedKey, config.tied_embeddings));
  RETURN_IF_ERROR(reader.Enum(kNormKey, kNorms, config.norm));
  RETURN_IF_ERROR(reader.Double(kNormEpsKey, config.norm_eps));
  RETURN_IF_ERROR(reader.Enum(kMlpKey, kMlps, config.mlp));
  RETURN_IF_ERROR(reader.Enum(kPositionsKey, kPositions, config.positions));
  RETURN_IF_ERROR(reader.Double(kRopeThetaKey, config.rope_theta));
  RETURN_IF_ERROR(reader.Bool(kBiasKey, config.bias));
  if (const std::string* head_dim = reader.Optional(kHeadDimKey); head_dim != nullptr) {
    RETURN_IF_ERROR(reader.Int(kHeadDimKey, *head_dim, config.head_dim));
    // Stored resolved; keep the default's 0 when it is d_model / heads, so configs compare equal.
    if (config.heads > 0 && config.head_dim * config.heads == config.d_model) config.head_dim = 0;
  }
  if (reader.Optional(kRopeScalingFactorKey) != nullptr) {
    RETURN_IF_ERROR(reader.Double(kRopeScalingFactorKey, config.rope_scaling.factor));
    RETURN_IF_ERROR(reader.Double(kRopeLowKey, config.rope_scaling.low_freq_factor));
    RETURN_IF_ERROR(reader.Double(kRopeHighKey, config.rope_scaling.high_freq_factor));
    const std::string* original = reader.Optional(kRopeOriginalKey);
    if (original == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": metadata has ", kRopeScalingFactorKey, " but not ", kRopeOriginalKey));
    }
    RETURN_IF_ERROR(
        reader.Int(kRopeOriginalKey, *original, config.rope_scaling.original_max_positions));
  }
  const std::string_view expected_family = config.FamilyName();
  const std::string expected = expected_family == "gpt" ? kGpt2Model : std::string(expected_family);
  if (family != expected) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": metadata says model '", family,
                                                   "' but its choices are those of '", expected,
                                                   "' (", config.DebugString(), ")"));
  }
  RETURN_IF_ERROR(Annotate(config.Validate(), where));
  return config;
}

absl::StatusOr<model::ModelConfig> ReadCheckpointConfig(const std::string& path,
                                                        int64_t hf_n_head) {
  ASSIGN_OR_RETURN(const std::string file, ResolveCheckpoint(path));
  if (IsManifestPath(file)) {
    ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(file));
    return ModelConfigFromMetadata(manifest.metadata, absl::StrCat("sharded checkpoint ", file));
  }
  if (IsHfIndexPath(file)) return ReadHfLlamaFolderConfig(file);
  ASSIGN_OR_RETURN(const SafetensorsReader reader, SafetensorsReader::Open(file));
  if (IsHuggingFaceGpt2File(reader)) return ReadHfGpt2Config(file, hf_n_head);
  if (IsHfLlamaFile(reader)) return ReadHfLlamaFolderConfig(file);
  return ModelConfigFromMetadata(reader.metadata(), absl::StrCat("checkpoint ", file));
}

}  // namespace shardline::checkpoint
