#include "worker/training/model_checkpoint.h"

#include <cctype>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "checkpoint/gpt2_hf_import.h"
#include "checkpoint/layout.h"
#include "checkpoint/model_config.h"
#include "checkpoint/verify.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"
#include "worker/model/data/tokenizer.h"

namespace shardline::training {
namespace {

namespace fs = std::filesystem;

// Whether a resolved checkpoint file (not a manifest) is a Hugging Face Llama folder's: an index,
// or a safetensors file that is neither ours nor GPT-2's. A file that cannot be opened is not:
// its error comes from the reader that opens it next.
bool IsHfLlama(const std::string& file) {
  if (checkpoint::IsHfIndexPath(file)) return true;
  absl::StatusOr<checkpoint::SafetensorsReader> reader = checkpoint::SafetensorsReader::Open(file);
  return reader.ok() && !checkpoint::IsHuggingFaceGpt2File(*reader) &&
         checkpoint::IsHfLlamaFile(*reader);
}

}  // namespace

absl::Status SaveModel(const model::ModelParams& model, const std::string& path) {
  return SaveModel(model.config(), model.values(), path);
}

absl::Status SaveModel(const model::ModelConfig& config, std::span<const float> params,
                       const std::string& path) {
  const model::ParamLayout layout(config);
  if (static_cast<int64_t>(params.size()) != layout.total()) {
    return absl::InvalidArgumentError(absl::StrCat("SaveModel ", path, ": ", params.size(),
                                                   " parameters for a model of ", layout.total()));
  }
  checkpoint::Gpt2Weights weights;
  weights.config = config;
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

absl::StatusOr<model::ModelParams> LoadModel(const std::string& path, int hf_heads) {
  ASSIGN_OR_RETURN(const std::string file, checkpoint::ResolveCheckpoint(path));
  if (checkpoint::IsManifestPath(file) || IsHfLlama(file)) {
    // Gathered box by box through the same reader a sharded trainer uses, so that a model loaded
    // here and one assembled from the ranks' boxes cannot disagree.
    ASSIGN_OR_RETURN(const CheckpointSource source, CheckpointSource::Open(file));
    ASSIGN_OR_RETURN(model::ModelParams gpt, model::ModelParams::Zeros(source.config()));
    const std::span<float> params = gpt.values();
    for (const auto& info : gpt.layout().tensors()) {
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
  if (checkpoint::IsHuggingFaceGpt2File(reader)) {
    ASSIGN_OR_RETURN(weights, checkpoint::ImportHfGpt2(file, hf_heads));
  } else {
    ASSIGN_OR_RETURN(weights, checkpoint::ReadGpt2Checkpoint(file));
  }
  const model::ModelConfig& config = weights.config;
  RETURN_IF_ERROR(Annotate(config.EngineSupports(), absl::StrCat("checkpoint ", file)));
  ASSIGN_OR_RETURN(model::ModelParams gpt, model::ModelParams::Zeros(config));
  const std::span<float> params = gpt.values();
  for (const auto& info : gpt.layout().tensors()) {
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

absl::StatusOr<CheckpointSource> CheckpointSource::Open(const std::string& path, int hf_heads) {
  CheckpointSource source;
  ASSIGN_OR_RETURN(source.path_, checkpoint::ResolveCheckpoint(path));
  const std::string& file = source.path_;
  model::ModelConfig config;
  std::string where;
  if (checkpoint::IsManifestPath(file)) {
    source.kind_ = CheckpointKind::kSharded;
    where = absl::StrCat("sharded checkpoint ", file);
    ASSIGN_OR_RETURN(source.sharded_, checkpoint::ShardedReader::Open(file));
    const checkpoint::Manifest& manifest = source.sharded_->manifest();
    ASSIGN_OR_RETURN(config, checkpoint::ModelConfigFromMetadata(manifest.metadata, where));
  } else if (checkpoint::IsHfIndexPath(file)) {
    source.kind_ = CheckpointKind::kHuggingFaceLlama;
    where = absl::StrCat("Hugging Face folder ", fs::path(file).parent_path().string());
    ASSIGN_OR_RETURN(source.hf_llama_, checkpoint::HfLlamaFolder::Open(file));
    config = source.hf_llama_->config();
  } else {
    where = absl::StrCat("checkpoint ", file);
    ASSIGN_OR_RETURN(checkpoint::SafetensorsReader reader,
                     checkpoint::SafetensorsReader::Open(file));
    if (checkpoint::IsHuggingFaceGpt2File(reader)) {
      source.kind_ = CheckpointKind::kHuggingFace;
      ASSIGN_OR_RETURN(source.imported_, checkpoint::ImportHfGpt2(file, hf_heads));
      config = source.imported_->config;
    } else if (checkpoint::IsHfLlamaFile(reader)) {
      // Its folder's reader maps the files again; this one only told what the file is.
      source.kind_ = CheckpointKind::kHuggingFaceLlama;
      where = absl::StrCat("Hugging Face folder ", fs::path(file).parent_path().string());
      ASSIGN_OR_RETURN(source.hf_llama_, checkpoint::HfLlamaFolder::Open(file));
      config = source.hf_llama_->config();
    } else {
      source.kind_ = CheckpointKind::kSingleFile;
      ASSIGN_OR_RETURN(config, checkpoint::ModelConfigFromMetadata(reader.metadata(), where));
      source.file_ = std::move(reader);
    }
  }
  RETURN_IF_ERROR(Annotate(config.EngineSupports(), where));
  source.config_ = config;
  for (model::TensorRow& spec : model::ModelRows(config)) {
    std::string name = spec.name;
    source.specs_.emplace(std::move(name), std::move(spec));
  }
  // Checked here, from headers only, so that a bad checkpoint fails before any rank reads a box.
  if (source.sharded_) {
    RETURN_IF_ERROR(checkpoint::CheckModelTensors(source.sharded_->manifest(), where));
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
  if (hf_llama_) {
    return absl::NotFoundError(absl::StrCat("Hugging Face folder ", hf_llama_->dir(), ": tensor '",
                                            name, "' is not part of the model"));
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
  if (source.hf_llama_) return source.hf_llama_->ReadBox(global_name, offsets, shape);

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

std::string TokenizerSpecFor(const std::string& given, const std::string& resolved) {
  if (!given.empty()) return given;
  const std::string dir = std::filesystem::path(resolved).parent_path().string();
  const bool hf_folder = !checkpoint::IsManifestPath(resolved) && data::HoldsTokenizerFiles(dir);
  return hf_folder ? dir : "bytes";
}

}  // namespace shardline::training
