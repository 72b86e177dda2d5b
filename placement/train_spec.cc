#include "placement/train_spec.h"

#include <filesystem>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "placement/string_view_compat.h"
#include "placement/train_spec_sections.h"
#include "placement/yaml_reader.h"

namespace shardline::placement {
namespace internal {
namespace {

// Past these, a single-device CPU run is not what the user meant; the numbers are generous.
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxVocab = 1 << 20;

constexpr std::string_view kArch = "arch";
// `arch:` names a preset of the family's choices (ModelConfig::Gpt, ModelConfig::Llama); the
// other keys are sizes and the choices' parameters.
enum class Arch { kGpt, kLlama };
constexpr EnumName<Arch> kArchNames[] = {{"gpt", Arch::kGpt}, {"llama", Arch::kLlama}};

// Llama's SwiGLU width: two thirds of 4·d_model (three matrices cost what GPT's two of 4·d_model
// do), rounded up to a multiple of 256 (the reference code's multiple_of; 4096 → 11008).
int64_t LlamaFf(int64_t d_model) {
  const int64_t ff = 2 * (4 * d_model) / 3;
  return (ff + 255) / 256 * 256;
}

}  // namespace

absl::StatusOr<model::ModelConfig> ParseModel(const YamlMap& map) {
  ASSIGN_OR_RETURN(const Arch arch, map.OptionalEnum(kArch, kArchNames, Arch::kGpt));
  const bool llama = arch == Arch::kLlama;
  model::ModelConfig model = llama ? model::ModelConfig::Llama({}) : model::ModelConfig::Gpt({});
  ASSIGN_OR_RETURN(model.layers, map.RequiredInt64("layers", {.min = 1, .max = 1024}));
  ASSIGN_OR_RETURN(model.heads, map.RequiredInt64("heads", {.min = 1, .max = 1024}));
  ASSIGN_OR_RETURN(model.kv_heads,
                   map.OptionalInt64("kv_heads", model.heads, {.min = 1, .max = 1024}));
  ASSIGN_OR_RETURN(model.d_model, map.RequiredInt64("d_model", {.min = 1, .max = kMaxDim}));
  ASSIGN_OR_RETURN(model.head_dim, map.OptionalInt64("head_dim", 0, {.min = 1, .max = kMaxDim}));
  ASSIGN_OR_RETURN(model.d_ff, map.OptionalInt64("d_ff", llama ? LlamaFf(model.d_model) : 4 * model.d_model, {.min = 1, .max = 4 * kMaxDim}));
  ASSIGN_OR_RETURN(model.vocab, map.OptionalInt64("vocab", 257, {.min = 2, .max = kMaxVocab}));
  ASSIGN_OR_RETURN(model.max_seq_len, map.RequiredInt64("max_seq_len", {.min = 1, .max = kMaxDim}));
  ASSIGN_OR_RETURN(model.tied_embeddings,
                   map.OptionalBool("tied_embeddings", model.tied_embeddings));
  ASSIGN_OR_RETURN(model.norm_eps, map.OptionalDouble("norm_eps", model.norm_eps,
                                                      {.min = 0, .max = 1, .min_exclusive = true}));
  if (!llama && map.Has("rope_theta")) {
    return map.ErrorAt("rope_theta",
                       "arch gpt has learned positions, not rotary ones: "
                       "rope_theta needs arch: llama");
  }
  ASSIGN_OR_RETURN(model.rope_theta, map.OptionalDouble("rope_theta", model.rope_theta,
                                                        {.min = 0, .min_exclusive = true}));
  if (!llama && map.Has("rope_scaling")) {
    return map.ErrorAt("rope_scaling", "rope_scaling needs arch: llama (rotary positions)");
  }
  // Llama 3's rescaled frequencies, under transformers' names.
  ASSIGN_OR_RETURN(
      const YamlMap scaling,
      map.OptionalMap("rope_scaling", {"rope_type", "factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"}));
  if (map.Has("rope_scaling")) {
    ASSIGN_OR_RETURN(const std::string type, scaling.OptionalString("rope_type", "llama3"));
    if (type != "llama3") {
      return scaling.ErrorAt("rope_type",
                             absl::StrCat("rope_type '", type, "' is not supported (llama3 is)"));
    }
    model::RopeScaling& r = model.rope_scaling;
    ASSIGN_OR_RETURN(r.factor, scaling.RequiredDouble("factor", {.min = 0, .min_exclusive = true}));
    ASSIGN_OR_RETURN(r.low_freq_factor, scaling.OptionalDouble("low_freq_factor", r.low_freq_factor,
                                                               {.min = 0, .min_exclusive = true}));
    ASSIGN_OR_RETURN(r.high_freq_factor,
                     scaling.OptionalDouble("high_freq_factor", r.high_freq_factor,
                                            {.min = 0, .min_exclusive = true}));
    if (r.high_freq_factor <= r.low_freq_factor) {
      return scaling.ErrorAt("high_freq_factor",
                             absl::StrCat("high_freq_factor ", r.high_freq_factor,
                                          " must exceed low_freq_factor ", r.low_freq_factor));
    }
    ASSIGN_OR_RETURN(r.original_max_positions,
                     scaling.OptionalInt64("original_max_position_embeddings",
                                           r.original_max_positions, {.min = 1}));
  }
  if (model.head_dim == 0 && model.d_model % model.heads != 0) {
    return map.ErrorAt("d_model",
                       absl::StrCat("d_model ", model.d_model, " is not divisible by heads ",
                                    model.heads, " (remainder ", model.d_model % model.heads,
                                    "; give head_dim to size the heads otherwise)"));
  }
  // Grouped-query attention: every key/value head serves heads / kv_heads query heads.
  if (model.kv_heads > model.heads || model.heads % model.kv_heads != 0) {
    return map.ErrorAt("kv_heads", absl::StrCat("heads ", model.heads,
                                                " is not divisible by kv_heads ", model.kv_heads,
                                                " (every key/value head serves a whole group of "
                                                "query heads)"));
  }
  if (!llama && model.kv_heads != model.heads) {
    return map.ErrorAt("kv_heads", absl::StrCat("arch gpt has one key/value head per head: "
                                                "kv_heads must be heads (", model.heads,
                                                "), got ", model.kv_heads,
                                                "; grouped-query attention needs arch: llama"));
  }
  if (model.vocab < 257) {
    return map.ErrorAt("vocab", absl::StrCat("the byte tokenizer needs a vocab of at least 257 "
                                             "(256 bytes + end-of-text), got ",
                                             model.vocab));
  }
  if (const absl::Status valid = model.Validate(); !valid.ok()) {
    return map.ErrorAt("layers", std::string(valid.message()));
  }
  return model;
}

absl::StatusOr<DataSpec> ParseData(const YamlMap& map) {
  DataSpec data;
  ASSIGN_OR_RETURN(data.path, map.OptionalString("path", ""));
  ASSIGN_OR_RETURN(const YamlMap synthetic, map.OptionalMap("synthetic", {"seed", "bytes"}));
  if (!data.path.empty() && map.Has("synthetic")) {
    return map.ErrorAt("synthetic", "give either path or synthetic, not both");
  }
  ASSIGN_OR_RETURN(data.per_site, map.OptionalStringList("per_site"));
  if (map.Has("per_site") && (!data.path.empty() || map.Has("synthetic"))) {
    return map.ErrorAt("per_site", "give per_site alone: each site reads only its own file");
  }
  for (size_t i = 0; i < data.per_site.size(); ++i) {
    if (data.per_site[i].empty()) return map.ErrorAtElement("per_site", i, "an empty path");
  }
  ASSIGN_OR_RETURN(const int64_t seed, synthetic.OptionalInt64("seed", 1, {.min = 0}));
  data.synthetic_seed = static_cast<uint64_t>(seed);
  ASSIGN_OR_RETURN(data.synthetic_bytes,
                   synthetic.OptionalBytes("bytes", data.synthetic_bytes,
                                           {.min = 1024, .max = int64_t{1} << 32}));
  return data;
}

absl::StatusOr<OptimizerSpec> ParseOptimizer(const YamlMap& map) {
  OptimizerSpec o;
  ASSIGN_OR_RETURN(o.lr, map.OptionalDouble("lr", o.lr, {.min = 0, .max = 10, .min_exclusive = true}));
  ASSIGN_OR_RETURN(o.beta1, map.OptionalDouble("beta1", o.beta1, {.min = 0, .max = 0.999999}));
  ASSIGN_OR_RETURN(o.beta2, map.OptionalDouble("beta2", o.beta2, {.min = 0, .max = 0.999999}));
  ASSIGN_OR_RETURN(o.eps, map.OptionalDouble("eps", o.eps, {.min = 0, .max = 1, .min_exclusive = true}));
  ASSIGN_OR_RETURN(o.weight_decay, map.OptionalDouble("weight_decay", o.weight_decay, {.min = 0, .max = 10}));
  ASSIGN_OR_RETURN(o.grad_clip, map.OptionalDouble("grad_clip", o.grad_clip, {.min = 0}));
  ASSIGN_OR_RETURN(o.warmup_steps, map.OptionalInt64("warmup_steps", 0, {.min = 0}));
  return o;
}

absl::StatusOr<CheckpointSpec> ParseCheckpoint(const YamlMap& map) {
  CheckpointSpec checkpoint;
  ASSIGN_OR_RETURN(checkpoint.dir, map.OptionalString("dir", ""));
  ASSIGN_OR_RETURN(checkpoint.interval, map.OptionalInt64("interval", 0, {.min = 0}));
  ASSIGN_OR_RETURN(checkpoint.keep, map.OptionalInt64("keep", 0, {.min = 0}));
  ASSIGN_OR_RETURN(checkpoint.memory_interval,
                   map.OptionalInt64("memory_interval", 0, {.min = 0, .max = int64_t{1} << 40}));
  // One replica: a second would guard against two nodes lost at once, which the buddy ring does
  // not place for yet.
  ASSIGN_OR_RETURN(checkpoint.memory_replicas,
                   map.OptionalInt64("memory_replicas", 0, {.min = 0, .max = 1}));
  if (checkpoint.memory_replicas > 0 && checkpoint.memory_interval == 0) {
    return map.ErrorAt("memory_replicas",
                       "needs checkpoint.memory_interval (how often the shards are copied)");
  }
  if (checkpoint.dir.empty()) {
    for (const std::string_view key : {"interval", "keep"}) {
      if (map.Has(key)) {
        return map.ErrorAt(key, "needs checkpoint.dir (where the steps are saved)");
      }
    }
  }
  ASSIGN_OR_RETURN(const std::string resume, map.OptionalString("resume", "latest"));
  if (const absl::Status status = SetResume(resume, checkpoint); !status.ok()) {
    return map.ErrorAt("resume", std::string(status.message()));
  }
  return checkpoint;
}

absl::Status ParseTrainSections(const YamlMap& map, TrainSpec& spec) {
  ASSIGN_OR_RETURN(const YamlMap model,
                   map.RequiredMap("model", {kModelKeys.begin(), kModelKeys.end()}));
  ASSIGN_OR_RETURN(spec.model, ParseModel(model));
  if (const absl::Status runs = spec.model.EngineSupports(); !runs.ok()) {
    // A config describes more models than the engine runs; `shardline plan` takes them all. The
    // message starts with what the engine cannot run: a choice of the arch, or a key of its own.
    const std::string message(runs.message());
    std::string_view key = kArch;
    for (const std::string_view own : {"kv_heads", "norm_eps"}) {
      if (absl::StartsWith(message, absl::StrCat(std::string(own), " "))) key = own;
    }
    if (absl::StartsWith(message, "model config:")) key = "d_model";
    return model.ErrorAt(key, message);
  }
  ASSIGN_OR_RETURN(const YamlMap data, map.OptionalMap("data", {"path", "synthetic", "per_site"}));
  ASSIGN_OR_RETURN(spec.data, ParseData(data));
  ASSIGN_OR_RETURN(const YamlMap optimizer,
                   map.OptionalMap("optimizer", {"lr", "beta1", "beta2", "eps", "weight_decay",
                                                 "grad_clip", "warmup_steps"}));
  ASSIGN_OR_RETURN(spec.optimizer, ParseOptimizer(optimizer));
  ASSIGN_OR_RETURN(spec.steps, map.RequiredInt64("steps", {.min = 1, .max = int64_t{1} << 40}));
  ASSIGN_OR_RETURN(spec.batch, map.RequiredInt64("batch", {.min = 1, .max = 1 << 20}));
  ASSIGN_OR_RETURN(spec.seq_len, map.OptionalInt64("seq_len", spec.model.max_seq_len, {.min = 1}));
  if (spec.seq_len > spec.model.max_seq_len) {
    return map.ErrorAt("seq_len", absl::StrCat("seq_len ", spec.seq_len,
                                               " is past the position table (model.max_seq_len ",
                                               spec.model.max_seq_len, ")"));
  }
  ASSIGN_OR_RETURN(const int64_t seed, map.OptionalInt64("seed", 1, {.min = 0}));
  spec.seed = static_cast<uint64_t>(seed);
  ASSIGN_OR_RETURN(const YamlMap checkpoint,
                   map.OptionalMap("checkpoint", {"dir", "interval", "keep", "resume",
                                                  "memory_interval", "memory_replicas"}));
  ASSIGN_OR_RETURN(spec.checkpoint, ParseCheckpoint(checkpoint));
  ASSIGN_OR_RETURN(spec.init_from, map.OptionalString("init_from", ""));
  if (const absl::Status sources = CheckStartSources(spec); !sources.ok()) {
    return map.ErrorAt("init_from", std::string(sources.message()));
  }
  ASSIGN_OR_RETURN(spec.log_interval, map.OptionalInt64("log_interval", 10, {.min = 1}));
  return absl::OkStatus();
}

}  // namespace internal

absl::Status CheckStartSources(const TrainSpec& spec) {
  if (spec.init_from.empty() || spec.checkpoint.resume != checkpoint::ResumeMode::kPath) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      "give either init_from (parameters only, a fresh optimizer) or checkpoint.resume: PATH (the "
      "whole state), not both");
}

absl::Status SetResume(std::string_view resume, CheckpointSpec& checkpoint) {
  checkpoint.resume_path.clear();
  if (resume.empty()) {
    return absl::InvalidArgumentError("give latest, none or the path of a checkpoint step");
  }
  if (resume == "latest") {
    checkpoint.resume = checkpoint::ResumeMode::kLatest;
  } else if (resume == "none") {
    checkpoint.resume = checkpoint::ResumeMode::kNone;
  } else {
    checkpoint.resume = checkpoint::ResumeMode::kPath;
    checkpoint.resume_path = std::string(resume);
  }
  return absl::OkStatus();
}

absl::Status SetTrainDevice(std::string_view device, TrainSpec& spec) {
  int index = 0;
  const bool cuda_n = absl::StartsWith(AbslView(device), "cuda:") &&
                      absl::SimpleAtoi(AbslView(device.substr(5)), &index) && index >= 0;
  if (device == "cpu") {
    spec.device = TrainDevice::kCpu;
  } else if (device == "cuda" || cuda_n) {
    spec.device = TrainDevice::kCuda;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", AbslView(device), "' is not a device: cpu, cuda or cuda:N"));
  }
  spec.device_index = index;
  spec.precision =
      spec.device == TrainDevice::kCuda ? TrainPrecision::kBFloat16 : TrainPrecision::kFloat32;
  return absl::OkStatus();
}

absl::Status SetTrainPrecision(std::string_view precision, TrainSpec& spec) {
  if (precision == "fp32") {
    spec.precision = TrainPrecision::kFloat32;
  } else if (precision == "bf16") {
    if (spec.device == TrainDevice::kCpu) {
      return absl::InvalidArgumentError(
          "bf16 needs device cuda (the CPU kernels compute in fp32)");
    }
    spec.precision = TrainPrecision::kBFloat16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", AbslView(precision), "' is not a precision: fp32 or bf16"));
  }
  return absl::OkStatus();
}

namespace {

// The keys of a standalone spec that a cluster job does not have (its devices are placed).
absl::Status ParseTrainDevice(const YamlMap& map, TrainSpec& spec) {
  for (const std::string_view key : {"device", "precision"}) {
    if (!map.Has(key)) continue;
    ASSIGN_OR_RETURN(const std::string value, map.RequiredString(key));
    const absl::Status status =
        key == "device" ? SetTrainDevice(value, spec) : SetTrainPrecision(value, spec);
    if (!status.ok()) return map.ErrorAt(key, std::string(status.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainSpec> ParseTrainSpec(const std::string& yaml_text,
                                         const std::string& source_name) {
  std::vector<std::string_view> known_keys = {"name", "device", "precision"};
  known_keys.insert(known_keys.end(), internal::kTrainSectionKeys.begin(),
                    internal::kTrainSectionKeys.end());
  ASSIGN_OR_RETURN(const YamlMap map, YamlMap::Parse(yaml_text, source_name, known_keys));
  TrainSpec spec;
  ASSIGN_OR_RETURN(spec.name, map.RequiredString("name"));
  RETURN_IF_ERROR(ParseTrainDevice(map, spec));
  RETURN_IF_ERROR(internal::ParseTrainSections(map, spec));
  if (!spec.data.per_site.empty()) {
    return map.ErrorAt("data",
                       "per_site is a cluster job's (one file per data-parallel site); "
                       "`shardline train` runs one site: give data.path");
  }
  if (spec.checkpoint.memory_interval > 0) {
    return map.ErrorAt("checkpoint",
                       "memory_interval is a cluster job's (its ranks' nodes hold the copies); "
                       "`shardline train` saves to checkpoint.dir only");
  }
  return spec;
}

std::string TrainDeviceName(const TrainSpec& spec) {
  const std::string device =
      spec.device == TrainDevice::kCpu ? "cpu" : absl::StrCat("cuda:", spec.device_index);
  return absl::StrCat(device, spec.precision == TrainPrecision::kBFloat16 ? ", bf16" : ", fp32");
}

absl::StatusOr<model::ModelConfig> ParseModelConfig(const std::string& yaml_text,
                                                    const std::string& source_name) {
  ASSIGN_OR_RETURN(const YamlMap map,
                   YamlMap::Parse(yaml_text, source_name,
                                  {internal::kModelKeys.begin(), internal::kModelKeys.end()}));
  return internal::ParseModel(map);
}

absl::StatusOr<model::ModelConfig> LoadModelConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  return ParseModelConfig(text, path);
}

absl::StatusOr<TrainSpec> LoadTrainSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  ASSIGN_OR_RETURN(TrainSpec spec, ParseTrainSpec(text, path));
  if (!spec.data.path.empty() && std::filesystem::path(spec.data.path).is_relative()) {
    spec.data.path = (std::filesystem::path(path).parent_path() / spec.data.path).string();
  }
  return spec;
}

}  // namespace shardline::placement
