// Saving and loading a whole model's parameters (ModelParams) as a safetensors checkpoint (our
// format, Hugging Face GPT-2 files and Llama folders, and the sharded checkpoints of a sharded job,
// docs/checkpoint-format.md), finding the newest checkpoint in a training run's folder, and reading
// any box of a tensor from any of them (what a sharded trainer loads its own shard with, whatever
// plan wrote the checkpoint).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/sharded_reader.h"
#include "kernels/allocator.h"
#include "model/tensor_table.h"
#include "worker/model/model_params.h"

namespace shardline::training {

// Writes every parameter of `model` to `path` (atomically), untied output head included.
absl::Status SaveModel(const model::ModelParams& model, const std::string& path);
// The same from a model's parameters in ParamLayout(config) order, wherever the model computes.
absl::Status SaveModel(const model::ModelConfig& config, std::span<const float> params,
                       const std::string& path);

// Loads a whole model's parameters from:
//   - a checkpoint written by SaveModel;
//   - a Hugging Face GPT-2 safetensors file (recognised by its tensor names; its head count is
//     not stored, so `hf_heads` gives it);
//   - a Hugging Face Llama folder (checkpoint/hf_llama.h): the folder, or its config.json,
//     model.safetensors or model.safetensors.index.json;
//   - a sharded checkpoint: its manifest.json, or the step folder holding one (every tensor is
//     gathered from the rank files; the result is the model a single file would give);
//   - a training run's folder (through checkpoint::ResolveCheckpoint).
// A sharded checkpoint must hold every parameter of the config in its metadata, with the global
// shapes of model::TensorRow::sharded_shape; other tensors (optimizer state, say) are ignored
// unless they are named like a parameter the config does not have. Errors name the file and the
// tensor.
absl::StatusOr<model::ModelParams> LoadModel(const std::string& path, int hf_heads = 12);

enum class CheckpointKind {
  kSingleFile,        // our format, one safetensors file
  kHuggingFace,       // a Hugging Face GPT-2 safetensors file
  kSharded,           // manifest.json + one safetensors file per rank
  kHuggingFaceLlama,  // a Hugging Face Llama folder: config.json + one or several safetensors
};

// An open checkpoint of any kind, to read boxes of its tensors from (ReadCheckpointBox). Our
// single files, sharded checkpoints and Hugging Face Llama folders are memory-mapped, so a rank
// that reads its box touches only those bytes (a sharded one opens only the rank files its boxes
// overlap); a Hugging Face GPT-2 file is imported (transposed) into memory whole. Movable; reads
// may run concurrently.
class CheckpointSource {
 public:
  // Opens what checkpoint::ResolveCheckpoint(path) names and reads its config (from the file's or
  // the manifest's metadata, or a Hugging Face folder's config.json), and checks from the headers
  // that it holds every tensor of the model with the model's shape (checkpoint::
  // CheckModelTensors, HfLlamaFolder::Open), so that a bad checkpoint fails before any rank reads
  // a box. Errors name the file, and the tensor or the key at fault.
  static absl::StatusOr<CheckpointSource> Open(const std::string& path, int hf_heads = 12);

  CheckpointKind kind() const { return kind_; }
  // The resolved file: the safetensors file, the manifest, or a Hugging Face index.
  const std::string& path() const { return path_; }
  const model::ModelConfig& config() const { return config_; }
  // The training step of a checkpoint step (its manifest's); nullopt for a single model file.
  std::optional<int64_t> step() const {
    return sharded_ ? std::optional<int64_t>(sharded_->manifest().step) : std::nullopt;
  }
  // The manifest of a checkpoint step; nullptr for a single model file.
  const checkpoint::Manifest* manifest() const {
    return sharded_ ? &sharded_->manifest() : nullptr;
  }
  // The Hugging Face Llama folder of a kHuggingFaceLlama checkpoint; nullptr for other kinds.
  const checkpoint::HfLlamaFolder* hf_llama() const { return hf_llama_ ? &*hf_llama_ : nullptr; }
  // Whether it holds the AdamW moments of every parameter (a step a run can resume from).
  bool has_optimizer_state() const {
    return sharded_ && checkpoint::HasOptimizerState(sharded_->manifest());
  }

  // The global shape that boxes of `name` are given in: for the model's parameters
  // model::TensorRow::sharded_shape (so h.{l}.qkv.w is (3, C, C) and h.{l}.qkv.b (3, C), whatever
  // the kind); for any other tensor its stored shape. NotFound naming the tensor when it is absent.
  absl::StatusOr<std::vector<int64_t>> BoxShape(const std::string& name) const;

 private:
  friend absl::StatusOr<std::vector<float>> ReadCheckpointBox(const CheckpointSource& source,
                                                              const std::string& global_name,
                                                              std::span<const int64_t> offsets,
                                                              std::span<const int64_t> shape);
  CheckpointSource() = default;

  CheckpointKind kind_ = CheckpointKind::kSingleFile;
  std::string path_;
  model::ModelConfig config_;
  std::map<std::string, model::TensorRow> specs_;            // the model's parameters, by name
  std::optional<checkpoint::SafetensorsReader> file_;        // kSingleFile
  std::optional<checkpoint::Gpt2Weights> imported_;          // kHuggingFace
  std::optional<checkpoint::ShardedReader> sharded_;         // kSharded
  std::optional<checkpoint::HfLlamaFolder> hf_llama_;        // kHuggingFaceLlama
};

// The box [offsets, offsets + shape) of tensor `global_name` (in the shape BoxShape gives) as f32,
// row-major in `shape`: e.g. a tensor-parallel rank's heads of h.3.qkv.w are
// offsets {0, h0·C/H, 0}, shape {3, (h1-h0)·C/H, C}. Errors name the checkpoint, the tensor and,
// for sharded checkpoints, the shard at fault: NotFound for a tensor or shard file that is absent;
// InvalidArgument for a box outside the tensor, a stored tensor whose shape disagrees with the
// config or manifest, a dtype that is not floating point, a truncated file.
absl::StatusOr<std::vector<float>> ReadCheckpointBox(const CheckpointSource& source,
                                                     const std::string& global_name,
                                                     std::span<const int64_t> offsets,
                                                     std::span<const int64_t> shape);

// The tokenizer for the checkpoint at `resolved` (checkpoint::ResolveCheckpoint's answer), as
// data::LoadTokenizer takes it: `given` when not empty, else a Hugging Face folder's own tokenizer
// files (the ids it was trained on), else "bytes" (what our own checkpoints are trained on).
std::string TokenizerSpecFor(const std::string& given, const std::string& resolved);

}  // namespace shardline::training
