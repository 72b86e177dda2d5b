// Hugging Face Llama-family folders as checkpoints: LlamaForCausalLM (and MistralForCausalLM
// without a sliding window), as save_pretrained writes them — config.json, and model.safetensors
// or several safetensors files listed by model.safetensors.index.json — read by boxes of our
// tensors, so that each rank of a sharded job reads only its own part. docs/checkpoint-format.md
// gives the mapping of names.
//
//   ours                 Hugging Face
//   wte                  model.embed_tokens.weight
//   h.{l}.ln1.w          model.layers.{l}.input_layernorm.weight
//   h.{l}.q.w/k.w/v.w    model.layers.{l}.self_attn.{q,k,v}_proj.weight
//   h.{l}.qkv.w          the same three, stacked (the fused product of a model without
//                        grouped-query attention; its box view (3, heads·hd, C) has one of them
//                        per index of dimension 0)
//   h.{l}.attn_proj.w    model.layers.{l}.self_attn.o_proj.weight
//   h.{l}.ln2.w          model.layers.{l}.post_attention_layernorm.weight
//   h.{l}.gate.w/up.w/down.w  model.layers.{l}.mlp.{gate,up,down}_proj.weight
//   lnf.w                model.norm.weight
//   lm_head.w            lm_head.weight (untied heads only)
//
// Every tensor is nn.Linear's (out, in), as ours, and the rotary layout is the same (rotate_half):
// no tensor is transposed or permuted.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/safetensors_reader.h"
#include "model/model_config.h"

namespace shardline::checkpoint {

// The model that the config.json of a Hugging Face folder describes; `path` is the folder or its
// config.json. Accepts `architectures` ["LlamaForCausalLM"], and ["MistralForCausalLM"] with
// sliding_window null. Reads the sizes (hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, vocab_size required; num_key_value_heads, head_dim, max_position_embeddings
// with transformers' defaults), rms_norm_eps and tie_word_embeddings, and the rotary positions in
// either form transformers writes: version 4's rope_theta + rope_scaling (null, or rope_type/type
// "default" or "llama3" with factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings), or version 5's rope_parameters (the same keys and rope_theta
// in one object). hidden_act must be silu and attention_bias/mlp_bias false.
//
// InvalidArgument naming the config.json and the key (and the value) for another architecture, a
// rope type or setting our model does not compute (linear, dynamic, yarn, ...), a missing or
// malformed key, num_attention_heads not divisible by num_key_value_heads, or any other invalid
// size; NotFound when there is no config.json.
absl::StatusOr<model::ModelConfig> ReadHfLlamaConfig(const std::string& path);

// One stored Hugging Face tensor of one of our tensors: the box it fills of our tensor's box view
// (model::TensorRow::sharded_shape). Its elements are in the same order in both: a tensor is one
// piece, the fused qkv.w three.
struct HfPiece {
  std::string hf_name;
  std::vector<int64_t> offsets;   // in our tensor's box view
  std::vector<int64_t> shape;     // in our tensor's box view
  std::vector<int64_t> hf_shape;  // as the Hugging Face model stores it
};
// For every tensor of model::ModelRows(config), by our name: its pieces, in order. The one
// mapping the reader and the exporter (hf_llama_export.h) share. Expects a config of Llama's
// choices (RMSNorm, SwiGLU, rotary positions, no biases).
std::map<std::string, std::vector<HfPiece>> HfLlamaTensorMap(const model::ModelConfig& config);

// OK when `config` is one a LlamaForCausalLM computes (RMSNorm, SwiGLU, rotary positions, no
// biases); InvalidArgument naming the first choice that is not.
absl::Status CheckLlamaChoices(const model::ModelConfig& config);

// Whether a safetensors file that is not a Hugging Face GPT-2 file (IsHuggingFaceGpt2File) belongs
// to a Hugging Face folder of the Llama kind: it is not ours (its metadata does not say format
// "shardline") and it has model.embed_tokens.weight or a config.json beside it.
bool IsHfLlamaFile(const SafetensorsReader& reader);

// An open Hugging Face Llama folder. Opening reads config.json (ReadHfLlamaConfig), the index
// when there is one, and the header of every safetensors file (each is memory-mapped: a mapping
// reads nothing, and a box read touches only the pages of its rows), and checks the whole model
// up front, so that a bad folder fails before any rank loads: every tensor the config needs is
// present with its shape and a floating-point dtype (F32, BF16, F16, F64), and no tensor is left
// over but the rotary inv_freq buffers old exports carry and a tied model's lm_head.weight.
// Movable; reads may run concurrently.
class HfLlamaFolder {
 public:
  // `path`: the folder, its config.json, its model.safetensors or its index. Errors name the file
  // at fault (config.json and the key; the index and the entry; a safetensors file and the
  // tensor): NotFound for a missing config.json, weights file or tensor (an untied config without
  // lm_head.weight names lm_head.weight); InvalidArgument for a malformed file, a wrong shape or
  // dtype, an index entry whose file does not hold its tensor, or a tensor that is not part of the
  // model the config describes.
  static absl::StatusOr<HfLlamaFolder> Open(const std::string& path);

  HfLlamaFolder(HfLlamaFolder&&) noexcept;
  HfLlamaFolder& operator=(HfLlamaFolder&&) noexcept;
  ~HfLlamaFolder();

  const std::string& dir() const { return dir_; }
  const std::string& config_path() const { return config_path_; }
  const model::ModelConfig& config() const { return config_; }
  // The safetensors files it reads, by their names in the folder.
  std::vector<std::string> files() const;

  // The box [offsets, offsets + shape) of our tensor `name` in its box view (sharded_shape), as
  // f32, row-major in `shape`, converted from what is stored. Reads only the box's elements.
  // NotFound naming the tensor when the model has no such tensor; InvalidArgument for a box
  // outside it.
  absl::StatusOr<std::vector<float>> ReadBox(const std::string& name,
                                             std::span<const int64_t> offsets,
                                             std::span<const int64_t> shape) const;

  // How many stored bytes the box reads have converted so far (for tests of partial loading).
  uint64_t bytes_read() const;

 private:
  struct Files;
  HfLlamaFolder();

  std::string dir_;
  std::string config_path_;
  model::ModelConfig config_;
  std::unique_ptr<Files> files_;
};

}  // namespace shardline::checkpoint
