#include "worker/training/model_checkpoint.h"

#include <cctype>
#include <charconv>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/checkpoint/gpt2_hf_import.h"

namespace shardline::training {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestName[] = "manifest.json";
constexpr char kSingleFileName[] = "model.safetensors";

checkpoint::Gpt2Config ToCheckpointConfig(const model::GptConfig& config) {
  checkpoint::Gpt2Config out;
  out.n_layer = config.layers;
  out.n_embd = config.d_model;
  out.n_head = config.heads;
  out.d_ff = config.ff();
  out.vocab_size = config.vocab;
  out.n_positions = config.max_seq_len;
  out.tied_embeddings = config.tied_embeddings;
  return out;
}

// The file's sizes are int64; the model's are int. A size past INT_MAX would wrap silently.
absl::StatusOr<model::GptConfig> ToModelConfig(const checkpoint::Gpt2Config& config,
                                               const std::string& where) {
  for (const int64_t size : {config.n_layer, config.n_head, config.n_embd, config.d_ff,
                             config.vocab_size, config.n_positions}) {
    if (size > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a model size of ", size, " in the metadata is too large"));
    }
  }
  model::GptConfig out;
  out.layers = static_cast<int>(config.n_layer);
  out.heads = static_cast<int>(config.n_head);
  out.d_model = static_cast<int>(config.n_embd);
  out.d_ff = static_cast<int>(config.d_ff);
  out.vocab = static_cast<int>(config.vocab_size);
  out.max_seq_len = static_cast<int>(config.n_positions);
  out.tied_embeddings = config.tied_embeddings;
  return out;
}

// ResolveCheckpoint hands sharded checkpoints out as their manifest, single ones as the file.
bool IsManifest(const std::string& path) { return fs::path(path).extension() == ".json"; }

// Hugging Face files name their tensors after the PyTorch modules ("wte.weight"); ours do not.
bool LooksLikeHuggingFace(const checkpoint::SafetensorsReader& reader) {
  return reader.Find("wte.weight") != nullptr || reader.Find("transformer.wte.weight") != nullptr;
}

// Whether `name` has the form of one of our GPT parameters (of some config): a manifest tensor of
// that form which the config does not have means metadata and tensors disagree (a writer that
// forgot tied_embeddings=false, or a wrong n_layer), which must not be ignored.
bool LooksLikeParameter(const std::string& name) {
  static constexpr const char* kOuter[] = {"wte", "wpe", "lnf.w", "lnf.b", "lm_head.w"};
  for (const char* outer : kOuter) {
    if (name == outer) return true;
  }
  if (!name.starts_with("h.")) return false;
  int64_t layer = 0;
  const char* begin = name.data() + 2;
  const char* end = name.data() + name.size();
  const auto [rest, error] = std::from_chars(begin, end, layer);
  if (error != std::errc() || rest == begin || rest == end || *rest != '.') return false;
  static constexpr const char* kBlock[] = {"ln1.w",       "ln1.b",       "qkv.w",     "qkv.b",
                                           "attn_proj.w", "attn_proj.b", "ln2.w",     "ln2.b",
                                           "fc.w",        "fc.b",        "fc_proj.w", "fc_proj.b"};
  const std::string_view suffix(rest + 1, end);
  for (const char* block : kBlock) {
    if (suffix == block) return true;
  }
  return false;
}

// N of a file inside a folder named step-N (the single-device trainer's layout).
std::optional<int64_t> StepOfFolder(const std::string& file) {
  const std::string folder = fs::path(file).parent_path().filename().string();
  if (!folder.starts_with("step-")) return std::nullopt;
  int64_t step = 0;
  const char* begin = folder.data() + 5;
  const char* end = folder.data() + folder.size();
  const auto [rest, error] = std::from_chars(begin, end, step);
  if (error != std::errc() || rest != end || rest == begin) return std::nullopt;
  return step;
}

// Every parameter of the config must be in the manifest with its sharded shape, and nothing named
// like a parameter may be there besides.
absl::Status CheckManifestHoldsTheModel(
    const checkpoint::Manifest& manifest,
    const std::map<std::string, checkpoint::Gpt2TensorSpec>& specs, const std::string& where) {
  for (const auto& [name, spec] : specs) {
    const auto it = manifest.tensors.find(name);
    if (it == manifest.tensors.end()) {
      return absl::NotFoundError(absl::StrCat(where, ": tensor '", name,
                                              "' is missing (the config in the metadata has it)"));
    }
    if (it->second.global_shape != spec.sharded_shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", name, "' has global shape ",
                       checkpoint::ShapeString(it->second.global_shape), ", expected ",
                       checkpoint::ShapeString(spec.sharded_shape),
                       spec.sharded_shape != spec.shape
                           ? " (sharded checkpoints store the fused QKV as (3, C, C) and (3, C))"
                           : " for the config in the metadata"));
    }
  }
  for (const auto& [name, tensor] : manifest.tensors) {
    if (!specs.contains(name) && LooksLikeParameter(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor '", name, "' is not a parameter of the config in the metadata (",
          "n_layer, tied_embeddings)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveModel(const model::GptModel& model, const std::string& path) {
  return SaveModel(model.config(), model.params(), path);
}

absl::Status SaveModel(const model::GptConfig& config, std::span<const float> params,
                       const std::string& path) {
  const model::ParamLayout layout(config);
  if (static_cast<int64_t>(params.size()) != layout.total()) {
    return absl::InvalidArgumentError(absl::StrCat("SaveModel ", path, ": ", params.size(),
                                                   " parameters for a model of ", layout.total()));
  }
  checkpoint::Gpt2Weights weights;
  weights.config = ToCheckpointConfig(config);
  for (const auto& info : layout.tensors()) {
    checkpoint::HostTensor tensor;
    tensor.shape = info.shape;
    tensor.values.assign(params.begin() + info.offset, params.begin() + info.offset + info.numel);
    weights.tensors.emplace(info.name, std::move(tensor));
  }
  std::error_code ec;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
  return checkpoint::WriteGpt2Checkpoint(path, weights);
}

absl::StatusOr<std::unique_ptr<model::GptModel>> LoadModel(const std::string& path,
                                                           kernels::Allocator& allocator,
                                                           int hf_heads) {
  ASSIGN_OR_RETURN(const std::string file, ResolveCheckpoint(path));
  if (IsManifest(file)) {
    // Gathered box by box through the same reader a sharded trainer uses, so that a model loaded
    // here and one assembled from the ranks' boxes cannot disagree.
    ASSIGN_OR_RETURN(const CheckpointSource source, CheckpointSource::Open(file));
    ASSIGN_OR_RETURN(auto gpt, model::GptModel::Create(source.config(), allocator));
    auto params = gpt->params();
    for (const auto& info : gpt->NamedTensors()) {
      ASSIGN_OR_RETURN(const std::vector<int64_t> shape, source.BoxShape(info.name));
      const std::vector<int64_t> zeros(shape.size(), 0);
      // (3, C, C) of qkv is (3C, C) in the model: the same bytes, so a flat copy.
      ASSIGN_OR_RETURN(const std::vector<float> values,
                       ReadCheckpointBox(source, info.name, zeros, shape));
      if (static_cast<int64_t>(values.size()) != info.numel) {
        return absl::InternalError(absl::StrCat(file, ": tensor ", info.name, " has ",
                                                values.size(), " elements, the model ",
                                                info.numel));
      }
      std::memcpy(params.data() + info.offset, values.data(), sizeof(float) * values.size());
    }
    return gpt;
  }

  ASSIGN_OR_RETURN(auto reader, checkpoint::SafetensorsReader::Open(file));
  checkpoint::Gpt2Weights weights;
  if (LooksLikeHuggingFace(reader)) {
    ASSIGN_OR_RETURN(weights, checkpoint::ImportHfGpt2(file, hf_heads));
  } else {
    ASSIGN_OR_RETURN(weights, checkpoint::ReadGpt2Checkpoint(file));
  }
  ASSIGN_OR_RETURN(const model::GptConfig config,
                   ToModelConfig(weights.config, absl::StrCat("checkpoint ", file)));
  ASSIGN_OR_RETURN(auto gpt, model::GptModel::Create(config, allocator));
  auto params = gpt->params();
  for (const auto& info : gpt->NamedTensors()) {
    auto it = weights.tensors.find(info.name);
    if (it == weights.tensors.end()) {
      return absl::InvalidArgumentError(file + ": tensor " + info.name + " is missing");
    }
    if (it->second.shape != info.shape ||
        static_cast<int64_t>(it->second.values.size()) != info.numel) {
      return absl::InvalidArgumentError(file + ": tensor " + info.name +
                                        " does not have the model's shape");
    }
    std::memcpy(params.data() + info.offset, it->second.values.data(),
                sizeof(float) * static_cast<size_t>(info.numel));
  }
  return gpt;
}

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  const fs::path p(path);
  if (fs::is_regular_file(p)) return path;
  if (!fs::is_directory(p)) return absl::NotFoundError("no checkpoint at " + path);
  if (fs::is_regular_file(p / kManifestName)) return (p / kManifestName).string();
  if (fs::is_regular_file(p / "latest")) {
    std::ifstream in(p / "latest");
    std::string step;
    std::getline(in, step);
    // Tolerate a hand-edited file's trailing blanks or CR.
    while (!step.empty() && std::isspace(static_cast<unsigned char>(step.back()))) step.pop_back();
    if (step.empty()) return absl::NotFoundError(path + "/latest is empty");
    // A sharded job's step folder holds a manifest, a single-device job's one file.
    for (const char* name : {kManifestName, kSingleFileName}) {
      if (fs::is_regular_file(p / step / name)) return (p / step / name).string();
    }
    return absl::NotFoundError(path + "/latest points at " + step +
                               ", which has neither manifest.json nor model.safetensors");
  }
  if (fs::is_regular_file(p / kSingleFileName)) return (p / kSingleFileName).string();
  return absl::NotFoundError(path +
                             " holds neither a 'latest' file, manifest.json nor model.safetensors");
}

absl::StatusOr<CheckpointSource> CheckpointSource::Open(const std::string& path, int hf_heads) {
  CheckpointSource source;
  ASSIGN_OR_RETURN(source.path_, ResolveCheckpoint(path));
  const std::string& file = source.path_;
  checkpoint::Gpt2Config config;
  std::string where;
  if (IsManifest(file)) {
    source.kind_ = CheckpointKind::kSharded;
    where = absl::StrCat("sharded checkpoint ", file);
    ASSIGN_OR_RETURN(source.sharded_, checkpoint::ShardedReader::Open(file));
    const checkpoint::Manifest& manifest = source.sharded_->manifest();
    ASSIGN_OR_RETURN(config, checkpoint::Gpt2ConfigFromMetadata(manifest.metadata, where));
    source.step_ = manifest.step;
  } else {
    where = absl::StrCat("checkpoint ", file);
    ASSIGN_OR_RETURN(checkpoint::SafetensorsReader reader,
                     checkpoint::SafetensorsReader::Open(file));
    if (LooksLikeHuggingFace(reader)) {
      source.kind_ = CheckpointKind::kHuggingFace;
      ASSIGN_OR_RETURN(source.imported_, checkpoint::ImportHfGpt2(file, hf_heads));
      config = source.imported_->config;
    } else {
      source.kind_ = CheckpointKind::kSingleFile;
      ASSIGN_OR_RETURN(config, checkpoint::Gpt2ConfigFromMetadata(reader.metadata(), where));
      source.file_ = std::move(reader);
    }
    source.step_ = StepOfFolder(file);
  }
  ASSIGN_OR_RETURN(source.config_, ToModelConfig(config, where));
  for (checkpoint::Gpt2TensorSpec& spec : checkpoint::Gpt2TensorSpecs(config)) {
    std::string name = spec.name;
    source.specs_.emplace(std::move(name), std::move(spec));
  }
  // Checked here, from headers only, so that a bad checkpoint fails before any rank reads a box.
  if (source.sharded_) {
    RETURN_IF_ERROR(CheckManifestHoldsTheModel(source.sharded_->manifest(), source.specs_, where));
  }
  if (source.file_) {
    for (const auto& [name, spec] : source.specs_) {
      ASSIGN_OR_RETURN(const checkpoint::TensorInfo* info, source.file_->Get(name));
      if (info->shape != spec.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": tensor '", name, "' has shape ", checkpoint::ShapeString(info->shape),
            ", expected ", checkpoint::ShapeString(spec.shape), " for the config in its metadata"));
      }
    }
  }
  return source;
}

absl::StatusOr<std::vector<int64_t>> CheckpointSource::BoxShape(const std::string& name) const {
  if (const auto it = specs_.find(name); it != specs_.end()) return it->second.sharded_shape;
  if (sharded_) {
    if (const checkpoint::ManifestTensor* tensor = sharded_->Find(name)) {
      return tensor->global_shape;
    }
  } else if (file_) {
    if (const checkpoint::TensorInfo* info = file_->Find(name)) return info->shape;
  }
  return absl::NotFoundError(absl::StrCat(kind_ == CheckpointKind::kSharded ? "sharded " : "",
                                          "checkpoint ", path_, ": tensor '", name,
                                          "' is missing"));
}

absl::StatusOr<std::vector<float>> ReadCheckpointBox(const CheckpointSource& source,
                                                     const std::string& global_name,
                                                     std::span<const int64_t> offsets,
                                                     std::span<const int64_t> shape) {
  ASSIGN_OR_RETURN(const std::vector<int64_t> global, source.BoxShape(global_name));
  if (source.sharded_) return source.sharded_->ReadBox(global_name, offsets, shape);

  // One stored tensor: the whole of it is the one piece, seen in the box view (for qkv the same
  // bytes as the stored (3C, C)).
  const std::string where =
      absl::StrCat("checkpoint ", source.path_, ": tensor '", global_name, "'");
  RETURN_IF_ERROR(checkpoint::CheckBox(global, offsets, shape, where));
  checkpoint::SafetensorsDType dtype = checkpoint::SafetensorsDType::kF32;
  const std::byte* data = nullptr;
  if (source.file_) {
    const checkpoint::TensorInfo* info = source.file_->Find(global_name);
    dtype = info->dtype;  // present: BoxShape found it, or Open checked every parameter
    data = source.file_->Data(*info).data();
  } else {
    const checkpoint::HostTensor& tensor = source.imported_->tensors.at(global_name);
    data = reinterpret_cast<const std::byte*>(tensor.values.data());
  }
  std::vector<float> out(*checkpoint::NumElements(shape));
  const std::vector<int64_t> zeros(global.size(), 0);
  if (!checkpoint::CopyBoxOverlap(dtype, data, zeros, global, offsets, shape, out.data())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has dtype ", checkpoint::DTypeName(dtype),
                     ", expected a floating-point dtype (F32, F16, BF16, F64)"));
  }
  return out;
}

}  // namespace shardline::training
