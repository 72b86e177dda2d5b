// Loads a Hugging Face GPT-2 safetensors checkpoint (model.safetensors of "gpt2", "gpt2-medium",
// ... or a GPT2LMHeadModel saved with save_pretrained) into our names and layout, so that real
// GPT-2 weights run on Shardline. docs/checkpoint-format.md gives the mapping.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors_reader.h"

namespace shardline::checkpoint {

// Reads `path`, accepting names with or without the "transformer." prefix. HF's Conv1D weights
// are stored (in, out); they are transposed into our (out, in). The attention-mask buffers
// "h.{i}.attn.bias" / "attn.masked_bias" that old exports carry are skipped. F16/BF16/F64 weights
// are widened to fp32.
//
// The head: no "lm_head.weight", or one equal to wte, is GPT-2's tied head; one that differs is
// an untied head (tied_embeddings false, our "lm_head.w").
//
// The config is inferred from the shapes (layers, n_embd, d_ff, vocab, n_positions) except the
// head count, which no tensor shows. When a config.json lies beside `path` (what save_pretrained
// and ExportHfGpt2 write) it gives n_head and is held against the tensors: n_layer, n_embd,
// n_inner, vocab_size and n_positions must match them, tie_word_embeddings (default true) must
// agree with the head (false with a head equal to wte is honoured as untied), and settings our
// model cannot compute (model_type other than gpt2, an activation other than the tanh GELU, a
// LayerNorm eps other than 1e-5, unscaled or layer-scaled attention) are refused. Without a
// config.json, or without n_head in it, `n_head` is used (12 for the 124M "gpt2").
//
// InvalidArgument naming the file and the Hugging Face tensor for a missing tensor, a shape that
// disagrees with the others, a non-float dtype or an unexpected tensor; naming the config.json
// and its key for a config that disagrees with the tensors or that is malformed.
absl::StatusOr<Gpt2Weights> ImportHfGpt2(const std::string& path, int64_t n_head = 12);

// The config ImportHfGpt2 would give, from the file's header (the tensors' shapes) and the
// config.json beside it, with the same checks of those; no tensor is read, so a lm_head.weight
// counts as a head of its own unless the config.json says tie_word_embeddings.
absl::StatusOr<model::ModelConfig> ReadHfGpt2Config(const std::string& path, int64_t n_head = 12);

// Whether a safetensors file is a Hugging Face GPT-2 (its tensors are named after the PyTorch
// modules, "wte.weight"; ours are not).
bool IsHuggingFaceGpt2File(const SafetensorsReader& reader);

// One layer tensor: its Hugging Face suffix ("attn.c_attn.weight"), ours ("qkv.w"), and whether
// it is a Conv1D weight, (in, out) there and (out, in) here. The one mapping the importer and the
// exporter (gpt2_hf_export.h) share, in model::ModelRows' order (model/tensor_table.h).
struct HfGpt2LayerTensor {
  const char* hf;
  const char* ours;
  bool transpose;
};
std::span<const HfGpt2LayerTensor> HfGpt2LayerTensors();

// config.Validate() in GPT-2's Hugging Face words (config.json's keys: "n_head 3 does not divide
// n_embd 8"), for the importer and the exporter, whose users read those names.
absl::Status ValidateHfGpt2Config(const model::ModelConfig& config);

// save_pretrained's prefix of every tensor of GPT2LMHeadModel but lm_head.weight.
inline constexpr std::string_view kHfGpt2Prefix = "transformer.";

}  // namespace shardline::checkpoint
