// A whole model in one checkpoint file (docs/checkpoint-format.md is the specification; keep the
// two in step): the tensors of model/tensor_table.h's ModelRows by their names and shapes, and the
// config in the metadata (checkpoint/model_config.h). Weights are row-major and every linear
// layer's weight is (out, in), as nn.Linear stores it; a tied output head has no tensor of its own.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/tensor_data.h"
#include "model/model_config.h"

namespace shardline::checkpoint {

// A whole model in fp32, by our names.
struct Gpt2Weights {
  model::ModelConfig config;
  std::map<std::string, HostTensor> tensors;
};

// OK when `weights` holds exactly its config's tensors (model::ModelRows) with their shapes;
// else InvalidArgument, prefixed by `where`, naming the tensor missing, of the wrong shape, or not
// part of a `family` ("GPT-2", "Llama") of this config. The exporters' check of what they write.
absl::Status CheckHoldsExactlyItsTensors(const Gpt2Weights& weights, const std::string& where,
                                         const std::string& family);

// Writes `weights` as one F32 safetensors file with the config in its metadata. InvalidArgument
// naming the tensor when one is missing or has the wrong shape.
absl::Status WriteGpt2Checkpoint(const std::string& path, const Gpt2Weights& weights);

// Reads a file written by WriteGpt2Checkpoint (F16/BF16 tensors are widened to fp32). The config
// comes from the metadata; every tensor must be present with its shape, and no other tensor may
// be. Errors name the file and the tensor or metadata key.
absl::StatusOr<Gpt2Weights> ReadGpt2Checkpoint(const std::string& path);

}  // namespace shardline::checkpoint
