#include "placement/serve_memory.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "placement/byte_size.h"

namespace shardline::placement {
namespace {

constexpr int64_t kFloat = 4;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The layers of pipeline stage `stage`: the engine's split (InferenceStageLayers).
int64_t StageLayers(int64_t layers, int pp, int stage) {
  return layers / pp + (stage < layers % pp ? 1 : 0);
}

}  // namespace

std::string ServeMemory::Describe() const {
  return absl::StrCat(FormatApproxByteSize(static_cast<double>(total())), " (weights ",
                      FormatApproxByteSize(static_cast<double>(weights_bytes)), " + KV cache ",
                      FormatApproxByteSize(static_cast<double>(kv_cache_bytes)), " + step ",
                      FormatApproxByteSize(static_cast<double>(workspace_bytes)), ")");
}

absl::StatusOr<ServeMemory> EstimateServeMemory(const model::ModelConfig& model, int tp, int pp,
                                                const ServeLimits& limits) {
  const int64_t d = model.d_model, ff = model.ff(), heads = model.heads;
  if (tp < 1 || heads % tp != 0 || ff % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tp ", tp, " must divide the ", heads,
                                                   " heads and the MLP width of ", ff));
  }
  if (pp < 1 || pp > model.layers) {
    return absl::InvalidArgumentError(absl::StrCat("pp ", pp, ": a model of ", model.layers,
                                                   " layers has 1 to ", model.layers,
                                                   " pipeline stages"));
  }
  // One layer's share on a rank: LayerNorms and the row-parallel biases whole, the rest 1/tp;
  // the matrices twice (the packed copies the small-batch products use).
  const int64_t matrices = (3 * d * d + d * d + 2 * d * ff) / tp;
  const int64_t vectors = 4 * d + 3 * d / tp + d + ff / tp + d;
  const int64_t layer_bytes = kFloat * (2 * matrices + vectors);
  const int64_t vocab_rows = CeilDiv(model.vocab, tp);
  const int64_t max_layers = StageLayers(model.layers, pp, 0);  // the first stage has the most
  const int64_t block_bytes = 2 * max_layers * limits.block_size * (d / tp) * kFloat;
  const int64_t blocks_per_context = CeilDiv(model.max_seq_len, limits.block_size);

  ServeMemory fullest;
  for (int stage = 0; stage < pp; ++stage) {
    int64_t weights = StageLayers(model.layers, pp, stage) * layer_bytes;
    if (stage == 0) weights += kFloat * (vocab_rows * d + model.max_seq_len * d);
    if (stage == pp - 1) {
      weights += kFloat * 2 * d;  // the final LayerNorm
      // A tied head is the embedding's rows: the first stage's when that is this one.
      if (!model.tied_embeddings || pp > 1) weights += kFloat * vocab_rows * d;
    }
    fullest.weights_bytes = std::max(fullest.weights_bytes, weights);
  }
  fullest.min_kv_cache_bytes = blocks_per_context * block_bytes;
  if (limits.kv_cache_bytes > 0) {
    fullest.kv_cache_bytes = limits.kv_cache_bytes / block_bytes * block_bytes;
    if (fullest.kv_cache_bytes < fullest.min_kv_cache_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "limits.kv_cache ", FormatByteSize(limits.kv_cache_bytes), " holds ",
          limits.kv_cache_bytes / block_bytes, " blocks of ", block_bytes, " bytes at tp ", tp,
          ", pp ", pp, "; one whole context of ", model.max_seq_len, " positions needs ",
          blocks_per_context, " (", FormatApproxByteSize(static_cast<double>(
                                        fullest.min_kv_cache_bytes)),
          ")"));
    }
  } else {
    fullest.kv_cache_bytes = limits.max_running * fullest.min_kv_cache_bytes;
  }
  // A step's rows through the widest layer, and the sampled rows' logits.
  const int64_t rows = limits.max_tokens_per_step;
  fullest.workspace_bytes =
      kFloat * (rows * (6 * d + 3 * d / tp + ff / tp) + int64_t{limits.max_running} * vocab_rows);
  return fullest;
}

absl::StatusOr<ParallelSpec> PlanServeLayout(const model::ModelConfig& model,
                                             const ServeLimits& limits, int64_t device_memory,
                                             int devices, int devices_per_node) {
  std::optional<std::pair<ParallelSpec, ServeMemory>> closest;
  for (int world = 1; world <= devices; ++world) {
    for (int tp = std::min(world, std::max(devices_per_node, 1)); tp >= 1; --tp) {
      if (world % tp != 0) continue;
      const int pp = world / tp;
      auto memory = EstimateServeMemory(model, tp, pp, limits);
      if (!memory.ok()) continue;
      ParallelSpec layout;
      layout.tp = tp;
      layout.pp = pp;
      if (memory->total() <= device_memory) return layout;
      if (!closest || memory->total() < closest->second.total()) closest = {layout, *memory};
    }
  }
  if (!closest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no layout of at most ", devices, " devices cuts the model (", model.heads, " heads, ",
        model.layers, " layers)"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no layout of at most ", devices, " devices fits: the closest, tp ", closest->first.tp,
      " x pp ", closest->first.pp, ", needs ", closest->second.Describe(), " per device, ",
      FormatApproxByteSize(static_cast<double>(closest->second.total() - device_memory)),
      " more than the ", FormatApproxByteSize(static_cast<double>(device_memory)), " of one"));
}

}  // namespace shardline::placement
