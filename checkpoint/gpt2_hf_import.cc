#include "checkpoint/gpt2_hf_import.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors_reader.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"
#include "nlohmann/json.hpp"

namespace shardline::checkpoint {
namespace {

constexpr HfGpt2LayerTensor kLayerTensors[] = {
    {"ln_1.weight", "ln1.w", false},
    {"ln_1.bias", "ln1.b", false},
    {"attn.c_attn.weight", "qkv.w", true},
    {"attn.c_attn.bias", "qkv.b", false},
    {"attn.c_proj.weight", "attn_proj.w", true},
    {"attn.c_proj.bias", "attn_proj.b", false},
    {"ln_2.weight", "ln2.w", false},
    {"ln_2.bias", "ln2.b", false},
    {"mlp.c_fc.weight", "fc.w", true},
    {"mlp.c_fc.bias", "fc.b", false},
    {"mlp.c_proj.weight", "fc_proj.w", true},
    {"mlp.c_proj.bias", "fc_proj.b", false},
};

// Parses "h.{i}." at the start of `name`; nullopt when it is not a layer tensor.
std::optional<int64_t> LayerIndex(std::string_view name) {
  if (!name.starts_with("h.")) return std::nullopt;
  int64_t index = -1;
  const char* begin = name.data() + 2;
  const auto [end, error] = std::from_chars(begin, name.data() + name.size(), index);
  if (error != std::errc() || end == begin || *end != '.') return std::nullopt;
  return index;
}

// A config.json beside the weights, as read.
struct HfConfigFile {
  std::string path;
  nlohmann::json json;
};

// The config.json beside `weights_path`; nullopt when there is none.
absl::StatusOr<std::optional<HfConfigFile>> ReadHfConfigBeside(const std::string& weights_path) {
  namespace stdfs = std::filesystem;
  const stdfs::path path = stdfs::path(weights_path).parent_path() / kHfConfigFileName;
  std::error_code ec;
  if (!stdfs::exists(path, ec)) return std::optional<HfConfigFile>();
  HfConfigFile file{path.string(), {}};
  const std::string where = absl::StrCat("Hugging Face GPT-2 config ", file.path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat(where, ": cannot be read"));
  try {
    file.json = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not JSON: ", e.what()));
  }
  if (!file.json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  }
  return std::optional<HfConfigFile>(std::move(file));
}

class Importer {
 public:
  Importer(const SafetensorsReader& reader, int64_t n_head, std::optional<HfConfigFile> hf_config)
      : reader_(reader),
        where_(absl::StrCat("Hugging Face GPT-2 checkpoint ", reader.path())),
        hf_config_(std::move(hf_config)) {
    weights_.config.heads = n_head;
  }

  // The config, from the tensors' shapes in the header and the config.json: no tensor is read.
  absl::StatusOr<model::ModelConfig> ReadConfig() {
    RETURN_IF_ERROR(IndexNames());
    ASSIGN_OR_RETURN(const std::vector<int64_t> wte, HeaderShape("wte.weight", 2));
    ASSIGN_OR_RETURN(const std::vector<int64_t> wpe, HeaderShape("wpe.weight", 2));
    model::ModelConfig& config = weights_.config;
    config.vocab = wte[0];
    config.d_model = wte[1];
    config.max_seq_len = wpe[0];
    if (wpe[1] != config.d_model) {
      const std::vector<int64_t> expected = {config.max_seq_len, config.d_model};
      return Error("wpe.weight", absl::StrCat("has shape ", ShapeString(wpe), ", expected ",
                                              ShapeString(expected), " from wte/wpe/h.0.mlp.c_fc"));
    }
    config.layers = CountLayers();
    if (config.layers == 0) return Error("h.0.ln_1.weight", "is missing (no layers found)");
    // d_ff is read off layer 0's MLP; every layer is then checked against it.
    if (const std::string* name = Lookup("h.0.mlp.c_fc.weight");
        name != nullptr && reader_.Find(*name)->shape.size() == 2) {
      config.d_ff = reader_.Find(*name)->shape[1];
    } else {
      return Error("h.0.mlp.c_fc.weight", "is missing or not 2-d");
    }
    if (hf_config_) RETURN_IF_ERROR(ApplyHfConfig());
    RETURN_IF_ERROR(Annotate(ValidateHfGpt2Config(config), where_));
    return config;
  }

  // ReadConfig with the head's tie guessed without reading it: a lm_head.weight is a head of its
  // own unless the config.json says tie_word_embeddings (Run compares the values instead).
  absl::StatusOr<model::ModelConfig> HeaderConfig() {
    ASSIGN_OR_RETURN(model::ModelConfig config, ReadConfig());
    if (Lookup("lm_head.weight") != nullptr && ConfigTie() != true) config.tied_embeddings = false;
    return config;
  }

  absl::StatusOr<Gpt2Weights> Run() {
    ASSIGN_OR_RETURN(const model::ModelConfig config, ReadConfig());
    ASSIGN_OR_RETURN(HostTensor wte, Take("wte.weight"));
    ASSIGN_OR_RETURN(HostTensor wpe, Take("wpe.weight"));
    RETURN_IF_ERROR(ExpectShape("wte.weight", wte, {config.vocab, config.d_model}));
    RETURN_IF_ERROR(ExpectShape("wpe.weight", wpe, {config.max_seq_len, config.d_model}));
    weights_.tensors.emplace("wte", std::move(wte));
    weights_.tensors.emplace("wpe", std::move(wpe));
    for (int64_t l = 0; l < config.layers; ++l) RETURN_IF_ERROR(ImportLayer(l));
    RETURN_IF_ERROR(ImportPlain("ln_f.weight", "lnf.w", {config.d_model}));
    RETURN_IF_ERROR(ImportPlain("ln_f.bias", "lnf.b", {config.d_model}));
    RETURN_IF_ERROR(ImportHead());
    RETURN_IF_ERROR(CheckNothingLeft());
    return std::move(weights_);
  }

 private:
  // Maps every name, without the optional prefix, to the name in the file.
  absl::Status IndexNames() {
    for (const auto& [name, info] : reader_.tensors()) {
      const std::string_view view = name;
      const std::string_view prefix = kHfGpt2Prefix;
      const std::string bare(view.starts_with(prefix) ? view.substr(prefix.size()) : view);
      if (!names_.emplace(bare, name).second) {
        return absl::InvalidArgumentError(absl::StrCat(where_, ": tensor '", bare,
                                                       "' is present both with and without the '",
                                                       std::string(kHfGpt2Prefix), "' prefix"));
      }
    }
    return absl::OkStatus();
  }

  const std::string* Lookup(const std::string& bare) const {
    const auto it = names_.find(bare);
    return it == names_.end() ? nullptr : &it->second;
  }

  absl::Status Error(const std::string& bare, absl::string_view what) const {
    const std::string* name = Lookup(bare);
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": tensor '", name != nullptr ? *name : bare, "' ", what));
  }

  // Reads and converts a tensor, marking it used.
  absl::StatusOr<HostTensor> Take(const std::string& bare) {
    const std::string* name = Lookup(bare);
    if (name == nullptr) return Error(bare, "is missing");
    used_.insert(bare);
    absl::StatusOr<HostTensor> tensor = reader_.ReadFloat(*name);
    if (!tensor.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Hugging Face GPT-2 ", ToString(tensor.status().message())));
    }
    return tensor;
  }

  // A tensor's shape from the header, which must have `rank` dimensions.
  absl::StatusOr<std::vector<int64_t>> HeaderShape(const std::string& bare, size_t rank) const {
    const std::string* name = Lookup(bare);
    if (name == nullptr) return Error(bare, "is missing");
    const std::vector<int64_t>& shape = reader_.Find(*name)->shape;
    if (shape.size() == rank) return shape;
    return Error(bare,
                 absl::StrCat("has shape ", ShapeString(shape), ", expected ", rank, " dimensions"));
  }

  absl::Status ExpectShape(const std::string& bare, const HostTensor& tensor,
                           const std::vector<int64_t>& shape) const {
    if (tensor.shape == shape) return absl::OkStatus();
    return Error(bare, absl::StrCat("has shape ", ShapeString(tensor.shape), ", expected ",
                                    ShapeString(shape), " from wte/wpe/h.0.mlp.c_fc"));
  }

  // Layers must be numbered 0..n-1; the count is one past the highest index seen, so a gap shows
  // up as a missing tensor of the skipped layer.
  int64_t CountLayers() const {
    int64_t count = 0;
    for (const auto& [bare, name] : names_) {
      if (const std::optional<int64_t> index = LayerIndex(bare))
        count = std::max(count, *index + 1);
    }
    return count;
  }

  absl::Status ImportPlain(const std::string& bare, const std::string& ours,
                           const std::vector<int64_t>& shape) {
    ASSIGN_OR_RETURN(HostTensor tensor, Take(bare));
    RETURN_IF_ERROR(ExpectShape(bare, tensor, shape));
    weights_.tensors.emplace(ours, std::move(tensor));
    return absl::OkStatus();
  }

  absl::Status ImportLayer(int64_t l) {
    // Layer numbering is the same on both sides: "h.{l}." prefixes both names.
    const std::string hf_prefix = absl::StrCat("h.", l, ".");
    const std::vector<model::TensorRow> specs = model::ModelRows(weights_.config);
    for (const HfGpt2LayerTensor& entry : kLayerTensors) {
      const std::string bare = hf_prefix + entry.hf;
      const std::string ours = hf_prefix + entry.ours;
      const auto spec = std::find_if(specs.begin(), specs.end(),
                                     [&](const model::TensorRow& s) { return s.name == ours; });
      if (!entry.transpose) {
        RETURN_IF_ERROR(ImportPlain(bare, ours, spec->shape));
        continue;
      }
      // Conv1D computes x @ W with W stored (in, out); ours is (out, in) like nn.Linear.
      const int64_t out = spec->shape[0];
      const int64_t in = spec->shape[1];
      ASSIGN_OR_RETURN(HostTensor conv, Take(bare));
      RETURN_IF_ERROR(ExpectShape(bare, conv, {in, out}));
      HostTensor linear;
      linear.shape = {out, in};
      linear.values.resize(conv.values.size());
      for (int64_t i = 0; i < in; ++i) {
        for (int64_t o = 0; o < out; ++o) linear.values[o * in + i] = conv.values[i * out + o];
      }
      weights_.tensors.emplace(ours, std::move(linear));
    }
    // Old exports carry the causal mask as a buffer; it is not a weight.
    for (const char* buffer : {"attn.bias", "attn.masked_bias"}) {
      if (Lookup(hf_prefix + buffer) != nullptr) used_.insert(hf_prefix + buffer);
    }
    return absl::OkStatus();
  }

  // The head is tied (our format then has no head tensor) unless the file's lm_head.weight
  // differs from wte or its config.json unties it; a config that ties a head the file has apart
  // from wte is an error rather than a silently dropped tensor.
  absl::Status ImportHead() {
    const std::optional<bool> tie = ConfigTie();
    if (Lookup("lm_head.weight") == nullptr) {
      if (tie == false) {
        return ConfigError(absl::StrCat("says tie_word_embeddings false, but ", reader_.path(),
                                        " has no lm_head.weight"));
      }
      return absl::OkStatus();
    }
    model::ModelConfig& config = weights_.config;
    ASSIGN_OR_RETURN(HostTensor head, Take("lm_head.weight"));
    RETURN_IF_ERROR(ExpectShape("lm_head.weight", head, {config.vocab, config.d_model}));
    const HostTensor& wte = weights_.tensors.at("wte");
    const bool same_as_wte =
        std::memcmp(head.values.data(), wte.values.data(), head.values.size() * sizeof(float)) == 0;
    if (tie == true && !same_as_wte) {
      return ConfigError(absl::StrCat("says tie_word_embeddings true, but the lm_head.weight of ",
                                      reader_.path(), " differs from wte.weight"));
    }
    if (same_as_wte && tie != false) return absl::OkStatus();
    config.tied_embeddings = false;
    weights_.tensors.emplace("lm_head.w", std::move(head));
    return absl::OkStatus();
  }

  // tie_word_embeddings of the config.json (true when the key is absent, as GPT2Config's
  // default); nullopt without a config.json. Checked to be a boolean by ApplyHfConfig.
  std::optional<bool> ConfigTie() const {
    if (!hf_config_) return std::nullopt;
    const auto it = hf_config_->json.find("tie_word_embeddings");
    return it == hf_config_->json.end() ? true : it->get<bool>();
  }

  absl::Status ConfigError(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("Hugging Face GPT-2 config ", hf_config_->path, ": ", what));
  }

  // The integer at `key` of the config.json; nullopt when absent (or null, which n_inner uses
  // for 4 n_embd).
  absl::StatusOr<std::optional<int64_t>> ConfigInt(const char* key) const {
    const auto it = hf_config_->json.find(key);
    if (it == hf_config_->json.end() || it->is_null()) return std::optional<int64_t>();
    if (!it->is_number_integer()) {
      return ConfigError(absl::StrCat("'", key, "' is ", it->dump(), ", expected an integer"));
    }
    return std::optional<int64_t>(it->get<int64_t>());
  }

  // Takes n_head from the config.json and holds its other sizes and settings against the
  // config inferred from the tensors.
  absl::Status ApplyHfConfig() {
    model::ModelConfig& config = weights_.config;
    const nlohmann::json& json = hf_config_->json;
    // The norms' epsilon is the model's (GPT2Config's default 1e-5 when absent).
    if (const auto it = json.find("layer_norm_epsilon"); it != json.end()) {
      if (!it->is_number() || !(it->get<double>() > 0)) {
        return ConfigError(
            absl::StrCat("layer_norm_epsilon ", it->dump(), " is not a positive number"));
      }
      config.norm_eps = it->get<double>();
    }
    if (const auto it = json.find("model_type"); it != json.end() && *it != "gpt2") {
      return ConfigError(absl::StrCat("model_type is ", it->dump(), ", expected \"gpt2\""));
    }
    ASSIGN_OR_RETURN(const std::optional<int64_t> n_head, ConfigInt("n_head"));
    if (n_head) {
      if (*n_head <= 0 || config.d_model % *n_head != 0) {
        return ConfigError(absl::StrCat("n_head ", *n_head, " does not divide n_embd ",
                                        config.d_model, " of ", reader_.path()));
      }
      config.heads = *n_head;
    }
    // HF's key, what the tensors say, and the tensor that says it.
    struct Size {
      const char* key;
      int64_t from_tensors;
      const char* tensor;
      std::optional<int64_t> if_absent;
    };
    const Size sizes[] = {
        {"n_layer", config.layers, "h.{l} numbering", std::nullopt},
        {"n_embd", config.d_model, "wte.weight", std::nullopt},
        {"vocab_size", config.vocab, "wte.weight", std::nullopt},
        {"n_positions", config.max_seq_len, "wpe.weight", std::nullopt},
        {"n_inner", config.d_ff, "h.0.mlp.c_fc.weight", 4 * config.d_model},
    };
    for (const Size& size : sizes) {
      ASSIGN_OR_RETURN(std::optional<int64_t> value, ConfigInt(size.key));
      if (!value) value = size.if_absent;
      if (value && *value != size.from_tensors) {
        return ConfigError(absl::StrCat(size.key, " is ", *value, ", but ", reader_.path(), " has ",
                                        size.from_tensors, " (", size.tensor, ")"));
      }
    }
    if (const auto it = json.find("tie_word_embeddings"); it != json.end() && !it->is_boolean()) {
      return ConfigError(
          absl::StrCat("'tie_word_embeddings' is ", it->dump(), ", expected true or false"));
    }
    return CheckComputeSettings();
  }

  // Settings of GPT2Config that change what the model computes, where ours is fixed.
  absl::Status CheckComputeSettings() const {
    const nlohmann::json& json = hf_config_->json;
    if (const auto it = json.find("activation_function"); it != json.end()) {
      // Both are the tanh approximation our GELU computes (kernels/cpu/elementwise.cc).
      if (*it != "gelu_new" && *it != "gelu_pytorch_tanh") {
        return ConfigError(absl::StrCat("activation_function ", it->dump(),
                                        " is not supported: Shardline's GELU is the tanh "
                                        "approximation (gelu_new)"));
      }
    }
    // GPT2Config's defaults (true, false) are what our attention computes.
    for (const auto& [key, ours] : {std::pair{"scale_attn_weights", true},
                                    std::pair{"scale_attn_by_inverse_layer_idx", false}}) {
      if (const auto it = json.find(key); it != json.end() && *it != ours) {
        return ConfigError(absl::StrCat(key, " ", it->dump(), " is not supported: Shardline's ",
                                        "attention scales by 1/sqrt(head size) only"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckNothingLeft() const {
    for (const auto& [bare, name] : names_) {
      if (!used_.contains(bare)) {
        return Error(bare,
                     "is not part of GPT-2 (another architecture, or more layers than "
                     "the numbering says?)");
      }
    }
    return absl::OkStatus();
  }

  const SafetensorsReader& reader_;
  const std::string where_;
  const std::optional<HfConfigFile> hf_config_;
  std::map<std::string, std::string> names_;  // bare name -> name in the file
  std::set<std::string> used_;
  Gpt2Weights weights_;
};

}  // namespace

absl::StatusOr<Gpt2Weights> ImportHfGpt2(const std::string& path, int64_t n_head) {
  ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
  ASSIGN_OR_RETURN(std::optional<HfConfigFile> hf_config, ReadHfConfigBeside(path));
  return Importer(reader, n_head, std::move(hf_config)).Run();
}

absl::StatusOr<model::ModelConfig> ReadHfGpt2Config(const std::string& path, int64_t n_head) {
  ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
  ASSIGN_OR_RETURN(std::optional<HfConfigFile> hf_config, ReadHfConfigBeside(path));
  return Importer(reader, n_head, std::move(hf_config)).HeaderConfig();
}

absl::Status ValidateHfGpt2Config(const model::ModelConfig& config) {
  if (config.heads > 0 && config.d_model % config.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GPT-2 config: n_head ", config.heads,
                                                   " does not divide n_embd ", config.d_model));
  }
  return config.Validate();
}

bool IsHuggingFaceGpt2File(const SafetensorsReader& reader) {
  return reader.Find("wte.weight") != nullptr || reader.Find("transformer.wte.weight") != nullptr;
}

std::span<const HfGpt2LayerTensor> HfGpt2LayerTensors() { return kLayerTensors; }

}  // namespace shardline::checkpoint
