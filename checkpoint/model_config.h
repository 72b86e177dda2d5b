// The model config of any checkpoint from its headers alone, for those that must size a model
// before they load it (the coordinator placing a serve job): no tensor is read.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/gpt2_checkpoint.h"

namespace shardline::checkpoint {

// The GPT-2 config of what ResolveCheckpoint(path) names: a checkpoint step's manifest, a single
// file's safetensors metadata, or a Hugging Face file's tensor shapes and the config.json beside
// it (ReadHfGpt2Config; `hf_n_head` when it gives no head count). Errors name the file: NotFound
// for a path that holds no checkpoint, InvalidArgument for a header or config that is malformed.
absl::StatusOr<Gpt2Config> ReadCheckpointConfig(const std::string& path, int64_t hf_n_head = 12);

}  // namespace shardline::checkpoint
