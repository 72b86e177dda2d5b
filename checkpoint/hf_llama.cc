#include "checkpoint/hf_llama.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/box.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"
#include "nlohmann/json.hpp"

namespace shardline::checkpoint {
namespace {

namespace stdfs = std::filesystem;
using Json = nlohmann::json;

// The Hugging Face name of each of our tensors, by role: a block's after
// "model.layers.{l}.", the others whole.
const char* HfSuffix(model::TensorRole role) {
  using enum model::TensorRole;
  switch (role) {
    case kTokenEmbedding:
      return "model.embed_tokens.weight";
    case kNorm1:
      return "input_layernorm.weight";
    case kQuery:
      return "self_attn.q_proj.weight";
    case kKey:
      return "self_attn.k_proj.weight";
    case kValue:
      return "self_attn.v_proj.weight";
    case kAttnOut:
      return "self_attn.o_proj.weight";
    case kNorm2:
      return "post_attention_layernorm.weight";
    case kMlpGate:
      return "mlp.gate_proj.weight";
    case kMlpUp:
      return "mlp.up_proj.weight";
    case kMlpDown:
      return "mlp.down_proj.weight";
    case kFinalNorm:
      return "model.norm.weight";
    case kLmHead:
      return "lm_head.weight";
    default:
      return nullptr;  // kQkv is three tensors; the rest are no Llama's
  }
}

// Architectures whose folders this reader takes; Mistral's only without a sliding window (then
// it computes what Llama computes).
constexpr char kLlama[] = "LlamaForCausalLM";
constexpr char kMistral[] = "MistralForCausalLM";

// Reads config.json's keys, naming the file and the key in every error.
class ConfigReader {
 public:
  ConfigReader(std::string path, Json json) : path_(std::move(path)), json_(std::move(json)) {}

  absl::Status Error(std::string_view key, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("Hugging Face config ", path_, ": '",
                                                   std::string(key), "' ", std::string(what)));
  }

  // nullptr when absent or null.
  const Json* Find(const Json& object, const char* key) const {
    const auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }
  const Json* Find(const char* key) const { return Find(json_, key); }

  absl::StatusOr<int64_t> Int(const Json& object, const std::string& prefix, const char* key,
                              std::optional<int64_t> if_absent) const {
    const Json* value = Find(object, key);
    const std::string name = prefix + key;
    if (value == nullptr) {
      if (if_absent) return *if_absent;
      return Error(name, "is missing");
    }
    if (!value->is_number_integer())
      return Error(name, absl::StrCat("is ", value->dump(), ", expected an integer"));
    return value->get<int64_t>();
  }
  absl::StatusOr<int64_t> Int(const char* key,
                              std::optional<int64_t> if_absent = std::nullopt) const {
    return Int(json_, "", key, if_absent);
  }

  absl::StatusOr<double> Number(const Json& object, const std::string& prefix, const char* key,
                                std::optional<double> if_absent) const {
    const Json* value = Find(object, key);
    const std::string name = prefix + key;
    if (value == nullptr) {
      if (if_absent) return *if_absent;
      return Error(name, "is missing");
    }
    if (!value->is_number() || !std::isfinite(value->get<double>())) {
      return Error(name, absl::StrCat("is ", value->dump(), ", expected a number"));
    }
    return value->get<double>();
  }

  absl::StatusOr<bool> Bool(const char* key, bool if_absent) const {
    const Json* value = Find(key);
    if (value == nullptr) return if_absent;
    if (!value->is_boolean())
      return Error(key, absl::StrCat("is ", value->dump(), ", expected true or false"));
    return value->get<bool>();
  }

  const Json& json() const { return json_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  Json json_;
};

absl::StatusOr<Json> ReadJsonFile(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  Json json;
  try {
    json = Json::parse(text.str());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not JSON: ", e.what()));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not a JSON object"));
  }
  return json;
}

// The architecture config.json names, checked to be one this reader takes.
absl::StatusOr<std::string> Architecture(const ConfigReader& reader) {
  const Json* architectures = reader.Find("architectures");
  std::string name;
  if (architectures != nullptr) {
    if (!architectures->is_array() || architectures->size() != 1 ||
        !(*architectures)[0].is_string()) {
      return reader.Error("architectures",
                          absl::StrCat("is ", architectures->dump(),
                                       ", expected one name such as [\"", kLlama, "\"]"));
    }
    name = (*architectures)[0].get<std::string>();
  } else {
    // A config written by hand may leave it out; model_type says the same.
    const Json* model_type = reader.Find("model_type");
    if (model_type == nullptr) {
      return reader.Error("architectures", "is missing (and there is no model_type)");
    }
    if (*model_type == "llama") name = kLlama;
    if (*model_type == "mistral") name = kMistral;
    if (name.empty()) {
      return reader.Error("model_type", absl::StrCat("is ", model_type->dump(),
                                                     " and there is no architectures: Shardline "
                                                     "reads llama and mistral folders"));
    }
  }
  if (name != kLlama && name != kMistral) {
    return reader.Error(
        "architectures",
        absl::StrCat("is [\"", name, "\"]: not supported (Shardline reads Hugging Face folders of ",
                     kLlama, " and of ", kMistral,
                     " without a sliding window, and GPT-2's model.safetensors)"));
  }
  if (name == kMistral) {
    // MistralConfig's default window is 4096: only an explicit null turns it off.
    const auto it = reader.json().find("sliding_window");
    if (it == reader.json().end() || !it->is_null()) {
      return reader.Error("sliding_window",
                          absl::StrCat(it == reader.json().end() ? "is absent (4096 by default)"
                                                                 : "is " + it->dump(),
                                       ": sliding-window attention is not supported (", kMistral,
                                       " is read only with sliding_window null)"));
    }
  }
  return name;
}

// The rotary settings: transformers 5's rope_parameters, or transformers 4's rope_theta and
// rope_scaling.
absl::Status ReadRope(const ConfigReader& reader, model::ModelConfig& config) {
  const Json* parameters = reader.Find("rope_parameters");
  const Json* scaling = nullptr;
  std::string prefix;
  if (parameters != nullptr) {
    if (!parameters->is_object()) {
      return reader.Error("rope_parameters",
                          absl::StrCat("is ", parameters->dump(), ", expected an object"));
    }
    // rope_theta lives inside it; a top-level one (a config converted by hand) is the fallback.
    ASSIGN_OR_RETURN(const double top_theta,
                     reader.Number(reader.json(), "", "rope_theta", 10000.0));
    ASSIGN_OR_RETURN(config.rope_theta,
                     reader.Number(*parameters, "rope_parameters.", "rope_theta", top_theta));
    scaling = parameters;
    prefix = "rope_parameters.";
  } else {
    ASSIGN_OR_RETURN(config.rope_theta, reader.Number(reader.json(), "", "rope_theta", 10000.0));
    scaling = reader.Find("rope_scaling");
    if (scaling == nullptr) return absl::OkStatus();
    if (!scaling->is_object()) {
      return reader.Error("rope_scaling",
                          absl::StrCat("is ", scaling->dump(), ", expected null or an object"));
    }
    prefix = "rope_scaling.";
  }
  // "rope_type", or "type" in configs from before transformers 4.43.
  std::string type_key = "rope_type";
  const Json* type = reader.Find(*scaling, "rope_type");
  if (type == nullptr) {
    type = reader.Find(*scaling, "type");
    if (type != nullptr) type_key = "type";
  }
  if (type == nullptr) {
    if (parameters != nullptr) return absl::OkStatus();  // rope_parameters without a type: default
    return reader.Error(prefix + "rope_type", "is missing");
  }
  if (*type == "default") return absl::OkStatus();
  if (*type != "llama3") {
    return reader.Error(prefix + type_key,
                        absl::StrCat("is ", type->dump(),
                                     ": not supported (Shardline computes rotary positions of "
                                     "rope_type \"default\" and \"llama3\")"));
  }
  model::RopeScaling& rope = config.rope_scaling;
  ASSIGN_OR_RETURN(rope.factor, reader.Number(*scaling, prefix, "factor", std::nullopt));
  ASSIGN_OR_RETURN(rope.low_freq_factor,
                   reader.Number(*scaling, prefix, "low_freq_factor", std::nullopt));
  ASSIGN_OR_RETURN(rope.high_freq_factor,
                   reader.Number(*scaling, prefix, "high_freq_factor", std::nullopt));
  ASSIGN_OR_RETURN(rope.original_max_positions,
                   reader.Int(*scaling, prefix, "original_max_position_embeddings", std::nullopt));
  if (!(rope.factor > 0)) {
    return reader.Error(prefix + "factor", absl::StrCat("is ", rope.factor, ", expected > 0"));
  }
  return absl::OkStatus();
}

// Settings of LlamaConfig that change what the model computes, where ours is fixed.
absl::Status CheckComputeSettings(const ConfigReader& reader) {
  if (const Json* act = reader.Find("hidden_act"); act != nullptr && *act != "silu") {
    return reader.Error("hidden_act", absl::StrCat("is ", act->dump(),
                                                   ": not supported (Shardline's SwiGLU gates "
                                                   "with silu)"));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    ASSIGN_OR_RETURN(const bool bias, reader.Bool(key, false));
    if (bias) {
      return reader.Error(key, "is true: biases on a Llama's projections are not supported");
    }
  }
  return absl::OkStatus();
}

std::string ConfigPathOf(const std::string& path) {
  std::error_code ec;
  const stdfs::path p(path);
  if (stdfs::is_directory(p, ec)) return (p / kHfConfigFileName).string();
  return (p.parent_path() / kHfConfigFileName).string();
}

// A piece located in a file: where its bytes are.
struct Located {
  HfPiece piece;
  std::string file;  // its name in the folder
  const TensorInfo* info = nullptr;
};

}  // namespace

absl::StatusOr<model::ModelConfig> ReadHfLlamaConfig(const std::string& path) {
  const std::string config_path = ConfigPathOf(path);
  std::error_code ec;
  if (!stdfs::is_regular_file(config_path, ec)) {
    return absl::NotFoundError(absl::StrCat("Hugging Face folder ",
                                            stdfs::path(config_path).parent_path().string(),
                                            " has no ", std::string(kHfConfigFileName)));
  }
  ASSIGN_OR_RETURN(Json json, ReadJsonFile(config_path, "Hugging Face config"));
  const ConfigReader reader(config_path, std::move(json));
  RETURN_IF_ERROR(Architecture(reader).status());
  model::ModelConfig sizes;
  ASSIGN_OR_RETURN(sizes.d_model, reader.Int("hidden_size"));
  ASSIGN_OR_RETURN(sizes.d_ff, reader.Int("intermediate_size"));
  ASSIGN_OR_RETURN(sizes.layers, reader.Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(sizes.heads, reader.Int("num_attention_heads"));
  ASSIGN_OR_RETURN(sizes.kv_heads, reader.Int("num_key_value_heads", sizes.heads));
  ASSIGN_OR_RETURN(sizes.vocab, reader.Int("vocab_size"));
  ASSIGN_OR_RETURN(sizes.max_seq_len, reader.Int("max_position_embeddings", 2048));
  for (const auto& [key, value] :
       {std::pair{"hidden_size", sizes.d_model}, std::pair{"intermediate_size", sizes.d_ff},
        std::pair{"num_hidden_layers", sizes.layers}, std::pair{"num_attention_heads", sizes.heads},
        std::pair{"num_key_value_heads", sizes.kv_heads}, std::pair{"vocab_size", sizes.vocab},
        std::pair{"max_position_embeddings", sizes.max_seq_len}}) {
    if (value < 1) return reader.Error(key, absl::StrCat("is ", value, ", expected >= 1"));
  }
  if (sizes.heads % sizes.kv_heads != 0) {
    return reader.Error(
        "num_key_value_heads",
        absl::StrCat("is ", sizes.kv_heads,
                     ", which does not divide "
                     "num_attention_heads ",
                     sizes.heads, " (every key/value head serves a whole group of query heads)"));
  }
  if (const Json* head_dim = reader.Find("head_dim"); head_dim != nullptr) {
    ASSIGN_OR_RETURN(sizes.head_dim, reader.Int("head_dim"));
    if (sizes.head_dim < 1) {
      return reader.Error("head_dim", absl::StrCat("is ", sizes.head_dim, ", expected >= 1"));
    }
    // The default's 0 when it is hidden_size / heads, so that configs compare equal.
    if (sizes.head_dim * sizes.heads == sizes.d_model) sizes.head_dim = 0;
  } else if (sizes.d_model % sizes.heads != 0) {
    return reader.Error("num_attention_heads",
                        absl::StrCat("is ", sizes.heads, ", which does not divide hidden_size ",
                                     sizes.d_model, " (and there is no head_dim)"));
  }
  model::ModelConfig config = model::ModelConfig::Llama(sizes);
  ASSIGN_OR_RETURN(config.norm_eps, reader.Number(reader.json(), "", "rms_norm_eps", 1e-6));
  if (!(config.norm_eps > 0)) {
    return reader.Error("rms_norm_eps", absl::StrCat("is ", config.norm_eps, ", expected > 0"));
  }
  ASSIGN_OR_RETURN(config.tied_embeddings, reader.Bool("tie_word_embeddings", false));
  RETURN_IF_ERROR(ReadRope(reader, config));
  RETURN_IF_ERROR(CheckComputeSettings(reader));
  const std::string where = absl::StrCat("Hugging Face config ", config_path);
  RETURN_IF_ERROR(Annotate(config.Validate(), where));
  RETURN_IF_ERROR(Annotate(config.EngineSupports(), where));
  return config;
}

absl::Status CheckLlamaChoices(const model::ModelConfig& config) {
  if (config.norm != model::NormKind::kRmsNorm) {
    return absl::InvalidArgumentError("a Llama's norm is rmsnorm, not layernorm");
  }
  if (config.mlp != model::MlpKind::kSwiGlu) {
    return absl::InvalidArgumentError("a Llama's MLP is swiglu, not gelu");
  }
  if (config.positions != model::PositionKind::kRotary) {
    return absl::InvalidArgumentError("a Llama's positions are rotary, not learned");
  }
  if (config.bias) return absl::InvalidArgumentError("a Llama has no biases (bias true)");
  return absl::OkStatus();
}

std::map<std::string, std::vector<HfPiece>> HfLlamaTensorMap(const model::ModelConfig& config) {
  std::map<std::string, std::vector<HfPiece>> map;
  const auto add = [&](const model::TensorRow& row, const std::string& name,
                       const std::string& hf_prefix) {
    std::vector<HfPiece>& pieces = map[name];
    if (row.role == model::TensorRole::kQkv) {
      // (3, heads·hd, C): q_proj, k_proj and v_proj are its three slabs of dimension 0.
      const std::vector<int64_t>& view = row.sharded_shape;
      using enum model::TensorRole;
      const char* parts[] = {HfSuffix(kQuery), HfSuffix(kKey), HfSuffix(kValue)};
      for (int64_t i = 0; i < 3; ++i) {
        pieces.push_back(
            HfPiece{hf_prefix + parts[i], {i, 0, 0}, {1, view[1], view[2]}, {view[1], view[2]}});
      }
      return;
    }
    const char* suffix = HfSuffix(row.role);
    // Every row of a Llama config has a name; CheckLlamaChoices keeps the others out.
    pieces.push_back(HfPiece{hf_prefix + (suffix != nullptr ? suffix : row.name),
                             std::vector<int64_t>(row.sharded_shape.size(), 0), row.sharded_shape,
                             row.shape});
  };
  for (const model::TensorRow& row : model::EmbeddingRows(config)) add(row, row.name, "");
  const std::vector<model::TensorRow> block = model::BlockRows(config);
  for (int64_t l = 0; l < config.layers; ++l) {
    const std::string prefix = absl::StrCat("model.layers.", l, ".");
    for (const model::TensorRow& row : block) add(row, model::BlockTensorName(l, row.name), prefix);
  }
  for (const model::TensorRow& row : model::HeadRows(config)) add(row, row.name, "");
  return map;
}

bool IsHfLlamaFile(const SafetensorsReader& reader) {
  const auto format = reader.metadata().find("format");
  if (format != reader.metadata().end() && format->second == "shardline") return false;
  std::error_code ec;
  return reader.Find("model.embed_tokens.weight") != nullptr ||
         stdfs::is_regular_file(stdfs::path(reader.path()).parent_path() / kHfConfigFileName, ec);
}

// The open files (node-based: entries never move, so Located's pointers stay valid when the
// folder moves) and the pieces of every tensor, behind a pointer so that the folder is movable.
struct HfLlamaFolder::Files {
  std::map<std::string, SafetensorsReader> open;           // by name in the folder
  std::map<std::string, std::vector<Located>> tensors;     // by our name
  std::map<std::string, std::vector<int64_t>> box_shapes;  // by our name: sharded_shape
  std::atomic<uint64_t> bytes_read{0};
};

HfLlamaFolder::HfLlamaFolder() : files_(std::make_unique<Files>()) {}
HfLlamaFolder::HfLlamaFolder(HfLlamaFolder&&) noexcept = default;
HfLlamaFolder& HfLlamaFolder::operator=(HfLlamaFolder&&) noexcept = default;
HfLlamaFolder::~HfLlamaFolder() = default;

absl::StatusOr<HfLlamaFolder> HfLlamaFolder::Open(const std::string& path) {
  HfLlamaFolder folder;
  folder.config_path_ = ConfigPathOf(path);
  folder.dir_ = stdfs::path(folder.config_path_).parent_path().string();
  ASSIGN_OR_RETURN(folder.config_, ReadHfLlamaConfig(folder.config_path_));
  const std::string where = absl::StrCat("Hugging Face folder ", folder.dir_);
  Files& files = *folder.files_;

  // Which file holds each Hugging Face tensor.
  std::map<std::string, std::string> weight_map;
  const stdfs::path dir(folder.dir_);
  std::error_code ec;
  const std::string single = (dir / kModelFileName).string();
  const std::string index = (dir / kHfIndexFileName).string();
  if (stdfs::is_regular_file(single, ec)) {
    ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(single));
    for (const auto& [name, info] : reader.tensors()) {
      weight_map.emplace(name, kModelFileName);
    }
    files.open.emplace(std::string(kModelFileName), std::move(reader));
  } else if (stdfs::is_regular_file(index, ec)) {
    ASSIGN_OR_RETURN(const Json json, ReadJsonFile(index, "Hugging Face index"));
    const auto map = json.find("weight_map");
    if (map == json.end() || !map->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Hugging Face index ", index, ": 'weight_map' is missing or not an object"));
    }
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string() || !IsNameInsideStepFolder(file.get<std::string>())) {
        return absl::InvalidArgumentError(
            absl::StrCat("Hugging Face index ", index, ": 'weight_map' entry '", name, "' is ",
                         file.dump(), ", expected the name of a file in the folder"));
      }
      const std::string& file_name = file.get_ref<const std::string&>();
      if (!files.open.contains(file_name)) {
        absl::StatusOr<SafetensorsReader> reader =
            SafetensorsReader::Open((dir / file_name).string());
        if (!reader.ok()) {
          return Annotate(reader.status(), absl::StrCat("Hugging Face index ", index,
                                                        ": 'weight_map' entry '", name, "'"));
        }
        files.open.emplace(file_name, std::move(*reader));
      }
      if (files.open.at(file_name).Find(name) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("Hugging Face index ", index, ": 'weight_map' puts tensor '", name,
                         "' in ", file_name, ", which does not hold it"));
      }
      weight_map.emplace(name, file_name);
    }
  } else {
    return absl::NotFoundError(absl::StrCat(where, " holds neither ", std::string(kModelFileName),
                                            " nor ", std::string(kHfIndexFileName)));
  }

  // Every tensor the config needs, with its shape and a float dtype.
  std::set<std::string> used;
  for (const model::TensorRow& row : model::ModelRows(folder.config_)) {
    files.box_shapes.emplace(row.name, row.sharded_shape);
  }
  for (auto& [ours, pieces] : HfLlamaTensorMap(folder.config_)) {
    std::vector<Located>& located = files.tensors[ours];
    for (HfPiece& piece : pieces) {
      const auto file = weight_map.find(piece.hf_name);
      if (file == weight_map.end()) {
        return absl::NotFoundError(absl::StrCat(
            where, ": tensor '", piece.hf_name, "' is missing",
            piece.hf_name == "lm_head.weight" ? absl::StrCat(" (", std::string(kHfConfigFileName),
                                                             " says tie_word_embeddings false)")
                                              : ""));
      }
      const TensorInfo* info = files.open.at(file->second).Find(piece.hf_name);
      const std::string file_path = (dir / file->second).string();
      if (info->shape != piece.hf_shape) {
        return absl::InvalidArgumentError(
            absl::StrCat("Hugging Face file ", file_path, ": tensor '", piece.hf_name,
                         "' has shape ", ShapeString(info->shape), ", expected ",
                         ShapeString(piece.hf_shape), " from ", folder.config_path_));
      }
      if (!IsFloatDType(info->dtype)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Hugging Face file ", file_path, ": tensor '", piece.hf_name, "' has dtype ",
            DTypeName(info->dtype), ", expected a floating-point dtype (F32, BF16, F16, F64)"));
      }
      used.insert(piece.hf_name);
      located.push_back(Located{std::move(piece), file->second, info});
    }
  }
  // Nothing left over: another tensor means another model than config.json describes.
  for (const auto& [name, file] : weight_map) {
    if (used.contains(name)) continue;
    if (name.ends_with(".rotary_emb.inv_freq")) continue;  // a buffer older exports saved
    if (name == "lm_head.weight" && folder.config_.tied_embeddings) continue;  // tied: unused
    return absl::InvalidArgumentError(
        absl::StrCat("Hugging Face file ", (dir / file).string(), ": tensor '", name,
                     "' is not part of the model ", folder.config_path_, " describes (",
                     folder.config_.DebugString(), ")"));
  }
  return folder;
}

std::vector<std::string> HfLlamaFolder::files() const {
  std::vector<std::string> names;
  for (const auto& [name, reader] : files_->open) names.push_back(name);
  return names;
}

absl::StatusOr<std::vector<float>> HfLlamaFolder::ReadBox(const std::string& name,
                                                          std::span<const int64_t> offsets,
                                                          std::span<const int64_t> shape) const {
  const auto it = files_->tensors.find(name);
  if (it == files_->tensors.end()) {
    return absl::NotFoundError(absl::StrCat("Hugging Face folder ", dir_, ": tensor '", name,
                                            "' is not part of the model"));
  }
  const std::vector<int64_t>& global = files_->box_shapes.at(name);
  RETURN_IF_ERROR(CheckBox(global, offsets, shape,
                           absl::StrCat("Hugging Face folder ", dir_, ": tensor '", name, "'")));
  std::vector<float> out(*NumElements(shape));
  uint64_t bytes = 0;
  for (const Located& located : it->second) {
    const HfPiece& piece = located.piece;
    const SafetensorsReader& reader = files_->open.at(located.file);
    // Open checked the dtype: the copy cannot refuse it.
    CopyBoxOverlap(located.info->dtype, reader.Data(*located.info).data(), piece.offsets,
                   piece.shape, offsets, shape, out.data());
    uint64_t overlap = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      const int64_t lo = std::max(piece.offsets[d], offsets[d]);
      const int64_t hi = std::min(piece.offsets[d] + piece.shape[d], offsets[d] + shape[d]);
      overlap *= static_cast<uint64_t>(std::max<int64_t>(0, hi - lo));
    }
    bytes += overlap * DTypeSize(located.info->dtype);
  }
  files_->bytes_read.fetch_add(bytes, std::memory_order_relaxed);
  return out;
}

uint64_t HfLlamaFolder::bytes_read() const {
  return files_->bytes_read.load(std::memory_order_relaxed);
}

}  // namespace shardline::checkpoint
