// Writes a model of Llama's choices as a Hugging Face LlamaForCausalLM folder (model.safetensors +
// config.json) that `transformers.LlamaForCausalLM.from_pretrained(DIR)` loads as it is, and that
// HfLlamaFolder (and so every Shardline loader) reads back bit-exact. hf_llama.h gives the names.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "checkpoint/file_system.h"
#include "checkpoint/gpt2_checkpoint.h"

namespace shardline::checkpoint {

// Writes out_dir/model.safetensors and out_dir/config.json (each atomically, model first),
// creating out_dir. Tensors are F32 under save_pretrained's names ("model.layers.0.self_attn.
// q_proj.weight"; a fused qkv.w is split into q_proj, k_proj and v_proj), with `__metadata__`
// {"format": "pt"} (transformers refuses a file without it). A tied head is not stored
// (tie_word_embeddings true); an untied one is lm_head.weight. config.json is in the form
// transformers 4 writes (rope_theta, and rope_scaling {"rope_type": "llama3", ...} or null),
// readable by transformers 5 too, and states every setting our model computes with (silu, no
// biases, rms_norm_eps, head_dim) rather than leaving it to LlamaConfig's defaults.
//
// InvalidArgument, naming out_dir and the tensor or the setting, for a config that is not a
// Llama's (CheckLlamaChoices) or is invalid, or a tensor of `weights` that is missing, has the
// wrong shape or is not part of the model; file system errors name the file.
absl::Status ExportHfLlama(const Gpt2Weights& weights, const std::string& out_dir,
                           FileSystem& fs = DefaultFileSystem());

}  // namespace shardline::checkpoint
