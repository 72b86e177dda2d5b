#include "worker/training/model_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/status_macros.h"
#include "worker/checkpoint/gpt2_checkpoint.h"
#include "worker/checkpoint/gpt2_hf_import.h"
#include "worker/checkpoint/safetensors_reader.h"

namespace shardline::training {
namespace {

namespace fs = std::filesystem;

checkpoint::Gpt2Config ToCheckpointConfig(const model::GptConfig& config) {
  checkpoint::Gpt2Config out;
  out.n_layer = config.layers;
  out.n_embd = config.d_model;
  out.n_head = config.heads;
  out.d_ff = config.ff();
  out.vocab_size = config.vocab;
  out.n_positions = config.max_seq_len;
  return out;
}

model::GptConfig ToModelConfig(const checkpoint::Gpt2Config& config) {
  model::GptConfig out;
  out.layers = static_cast<int>(config.n_layer);
  out.heads = static_cast<int>(config.n_head);
  out.d_model = static_cast<int>(config.n_embd);
  out.d_ff = static_cast<int>(config.d_ff);
  out.vocab = static_cast<int>(config.vocab_size);
  out.max_seq_len = static_cast<int>(config.n_positions);
  out.tied_embeddings = true;
  return out;
}

// Hugging Face files name their tensors after the PyTorch modules ("wte.weight"); ours do not.
absl::StatusOr<bool> LooksLikeHuggingFace(const std::string& path) {
  ASSIGN_OR_RETURN(auto reader, checkpoint::SafetensorsReader::Open(path));
  return reader.Find("wte.weight") != nullptr || reader.Find("transformer.wte.weight") != nullptr;
}

}  // namespace

absl::Status SaveModel(const model::GptModel& model, const std::string& path) {
  if (!model.config().tied_embeddings) {
    return absl::FailedPreconditionError(
        "saving " + path + ": models with an untied output head are not in the checkpoint format yet");
  }
  checkpoint::Gpt2Weights weights;
  weights.config = ToCheckpointConfig(model.config());
  const auto params = model.params();
  for (const auto& info : model.NamedTensors()) {
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
  ASSIGN_OR_RETURN(const bool huggingface, LooksLikeHuggingFace(path));
  checkpoint::Gpt2Weights weights;
  if (huggingface) {
    ASSIGN_OR_RETURN(weights, checkpoint::ImportHfGpt2(path, hf_heads));
  } else {
    ASSIGN_OR_RETURN(weights, checkpoint::ReadGpt2Checkpoint(path));
  }
  const model::GptConfig config = ToModelConfig(weights.config);
  ASSIGN_OR_RETURN(auto gpt, model::GptModel::Create(config, allocator));
  auto params = gpt->params();
  for (const auto& info : gpt->NamedTensors()) {
    auto it = weights.tensors.find(info.name);
    if (it == weights.tensors.end()) {
      return absl::InvalidArgumentError(path + ": tensor " + info.name + " is missing");
    }
    if (it->second.shape != info.shape ||
        static_cast<int64_t>(it->second.values.size()) != info.numel) {
      return absl::InvalidArgumentError(path + ": tensor " + info.name +
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
  if (fs::is_regular_file(p / "latest")) {
    std::ifstream in(p / "latest");
    std::string step;
    std::getline(in, step);
    const fs::path file = p / step / "model.safetensors";
    if (!fs::is_regular_file(file)) {
      return absl::NotFoundError(path + "/latest points at " + step + ", which has no model.safetensors");
    }
    return file.string();
  }
  if (fs::is_regular_file(p / "model.safetensors")) return (p / "model.safetensors").string();
  return absl::NotFoundError(path + " holds neither a 'latest' file nor model.safetensors");
}

}  // namespace shardline::training
