// Our GPT-2 checkpoint: tensor names, shapes and metadata (docs/checkpoint-format.md is the
// specification; keep the two in step). Weights are row-major and every linear layer's weight is
// (out, in), as nn.Linear stores it; the output head is tied to wte and has no tensor of its own,
// unless the config unties it (then it is lm_head.w, (V, C)).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/tensor_data.h"

namespace shardline::checkpoint {

struct Gpt2Config {
  int64_t n_layer = 0;
  int64_t n_embd = 0;  // C, d_model
  int64_t n_head = 0;
  int64_t d_ff = 0;         // 4C in GPT-2
  int64_t vocab_size = 0;   // V
  int64_t n_positions = 0;  // the longest sequence wpe covers
  // GPT-2 ties the output head to wte; when false the model has its own lm_head.w (V, C).
  bool tied_embeddings = true;

  bool operator==(const Gpt2Config&) const = default;
};

// One tensor of the model: its name in our checkpoints and its (global, unsharded) shape.
struct Gpt2TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  // The global shape in a sharded checkpoint's manifest, whose shards are boxes of it: `shape`,
  // except the fused QKV, h.{l}.qkv.w (3, C, C) and h.{l}.qkv.b (3, C), so that a range of heads
  // is a box. The same bytes in the same order either way.
  std::vector<int64_t> sharded_shape;
};

// Every tensor of a model with `config`, in a fixed order: wte, wpe, then per layer l
// h.{l}.ln1.w/.b, qkv.w/.b, attn_proj.w/.b, ln2.w/.b, fc.w/.b, fc_proj.w/.b, then lnf.w/.b, and
// lm_head.w when the head is untied (the order of model::ParamLayout).
std::vector<Gpt2TensorSpec> Gpt2TensorSpecs(const Gpt2Config& config);

// InvalidArgument unless every size is positive and n_head divides n_embd.
absl::Status ValidateGpt2Config(const Gpt2Config& config);

// The metadata that describes a GPT-2 checkpoint of `config`: format, format_version, model, the
// config's sizes, and tied_embeddings ("true" or "false"). Single files carry it in the
// safetensors header, sharded checkpoints in manifest.json; writers of either should use this.
std::map<std::string, std::string> Gpt2Metadata(const Gpt2Config& config);

// The config from such metadata (a missing tied_embeddings means tied: files from before the key).
// InvalidArgument, prefixed by `where`, naming the missing or malformed key, or when the format is
// not ours or the config is invalid.
absl::StatusOr<Gpt2Config> Gpt2ConfigFromMetadata(
    const std::map<std::string, std::string>& metadata, const std::string& where);

// A whole model in fp32, by our names.
struct Gpt2Weights {
  Gpt2Config config;
  std::map<std::string, HostTensor> tensors;
};

// Writes `weights` as one F32 safetensors file with the config in its metadata. InvalidArgument
// naming the tensor when one is missing or has the wrong shape.
absl::Status WriteGpt2Checkpoint(const std::string& path, const Gpt2Weights& weights);

// Reads a file written by WriteGpt2Checkpoint (F16/BF16 tensors are widened to fp32). The config
// comes from the metadata; every tensor must be present with its shape, and no other tensor may
// be. Errors name the file and the tensor or metadata key.
absl::StatusOr<Gpt2Weights> ReadGpt2Checkpoint(const std::string& path);

}  // namespace shardline::checkpoint
