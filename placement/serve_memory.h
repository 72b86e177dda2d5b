// What one rank of a serving layout (tp tensor-parallel ranks in each of pp pipeline stages)
// holds in memory, and the layout a `parallel: auto` serve job runs on: the fewest devices whose
// fullest rank fits a device. The same split as the serving engine's (worker/model/
// paged_inference.h): stage s has its share of the layers (the first stages one more when they
// do not divide), each rank 1/tp of every layer's heads and MLP columns and of the vocabulary
// rows; the first stage holds the embeddings, the last the final LayerNorm and the head. No I/O.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "placement/job_spec.h"
#include "placement/train_spec.h"

namespace shardline::placement {

// Bytes of the fullest rank of a layout.
struct ServeMemory {
  int64_t weights_bytes = 0;       // its parameters (fp32) and the packed copies of its matrices
  int64_t kv_cache_bytes = 0;      // the cache it sizes: limits.kv_cache, or max_running contexts
  int64_t min_kv_cache_bytes = 0;  // one whole context: the least cache an engine takes
  int64_t workspace_bytes = 0;     // one step's activations and logits, at max_tokens_per_step
  int64_t total() const { return weights_bytes + kv_cache_bytes + workspace_bytes; }
  // "1.2 GiB (weights 900 MiB + KV cache 300 MiB + step 12 MiB)".
  std::string Describe() const;
};

// InvalidArgument when tp does not divide the heads and the MLP width, or pp is not 1..layers,
// naming the numbers; or when limits.kv_cache holds less than one whole context, by how much.
absl::StatusOr<ServeMemory> EstimateServeMemory(const model::ModelConfig& model, int tp, int pp,
                                                const ServeLimits& limits);

// The layout of the fewest devices (at most `devices`) whose fullest rank fits in
// `device_memory`; for as many devices, the most tensor parallelism that stays within one node
// (`devices_per_node`), then pipeline stages. FailedPrecondition saying by how much the layout
// that comes closest is short.
absl::StatusOr<ParallelSpec> PlanServeLayout(const model::ModelConfig& model,
                                             const ServeLimits& limits, int64_t device_memory,
                                             int devices, int devices_per_node);

}  // namespace shardline::placement
