// Internal to placement/: the parts of a training spec that `shardline train SPEC.yaml`
// (train_spec.cc) and a `kind: train` job (job_spec.cc) share, so that both read the model, data,
// optimizer and schedule with the same keys, bounds and messages.
#pragma once

#include <array>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "placement/train_spec.h"
#include "placement/yaml_reader.h"

namespace shardline::placement::internal {

// The top-level keys ParseTrainSections reads, in the order the known-key lists print them.
inline constexpr std::array<std::string_view, 10> kTrainSectionKeys = {
    "model",      "data",       "optimizer", "steps",     "batch",
    "seq_len",    "seed",       "checkpoint", "init_from", "log_interval",
};

// The keys of a `model:` section, which are also the top-level keys of a standalone model spec.
inline constexpr std::array<std::string_view, 13> kModelKeys = {
    "arch",  "layers",      "heads",           "kv_heads", "head_dim",   "d_model",      "d_ff",
    "vocab", "max_seq_len", "tied_embeddings", "norm_eps", "rope_theta", "rope_scaling",
};

// One section each: `map` is the opened `model:`, `data:` or `optimizer:` mapping.
absl::StatusOr<model::ModelConfig> ParseModel(const YamlMap& map);
absl::StatusOr<DataSpec> ParseData(const YamlMap& map);
absl::StatusOr<OptimizerSpec> ParseOptimizer(const YamlMap& map);
absl::StatusOr<CheckpointSpec> ParseCheckpoint(const YamlMap& map);

// Reads the kTrainSectionKeys of the top-level mapping `map` into `spec` (everything but its
// name), paths as written.
absl::Status ParseTrainSections(const YamlMap& map, TrainSpec& spec);

}  // namespace shardline::placement::internal
