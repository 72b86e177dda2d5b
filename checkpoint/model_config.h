// The model config's form in checkpoint metadata (a single file's safetensors header, a sharded
// checkpoint's manifest.json), and reading the config of any checkpoint from its headers alone, for
// those that must size a model before they load it (the coordinator placing a serve job).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "model/model_config.h"

namespace shardline::checkpoint {

// The metadata that describes a checkpoint of `config`: format, format_version, model (the
// config's FamilyName, "gpt2" for GPT-2's choices), the sizes under GPT-2's names (n_layer,
// n_embd, n_head, d_ff, vocab_size, n_positions) and kv_heads, tied_embeddings, and the family's
// choices (norm, norm_eps, mlp, positions, rope_theta, bias). Every writer of either uses this.
std::map<std::string, std::string> ModelMetadata(const model::ModelConfig& config);

// The config from such metadata. Keys that files from before them lack take what those files
// were: tied_embeddings true, GPT-2's choices, kv_heads = n_head. InvalidArgument, prefixed by
// `where`, naming the missing or malformed key, or when the format is not ours or the config is
// invalid.
absl::StatusOr<model::ModelConfig> ModelConfigFromMetadata(
    const std::map<std::string, std::string>& metadata, const std::string& where);

// The config of what ResolveCheckpoint(path) names: a checkpoint step's manifest, a single
// file's safetensors metadata, a Hugging Face GPT-2 file's tensor shapes and the config.json
// beside it (ReadHfGpt2Config; `hf_n_head` when it gives no head count), or a Hugging Face Llama
// folder's config.json, once every tensor of the folder has been checked against it from the
// headers (HfLlamaFolder::Open). Errors name the file: NotFound for a path that holds no
// checkpoint or a missing tensor, InvalidArgument for a header or config that is malformed or a
// tensor of the wrong shape.
absl::StatusOr<model::ModelConfig> ReadCheckpointConfig(const std::string& path,
                                                        int64_t hf_n_head = 12);

}  // namespace shardline::checkpoint
