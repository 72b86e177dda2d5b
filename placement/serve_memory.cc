#include "placement/serve_memory.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "model/tensor_table.h"
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
  if (const absl::Status cut = model::CheckTensorParallel(model, tp); !cut.ok()) return cut;
  if (pp < 1 || pp > model.layers) {
    return absl::InvalidArgumentError(absl::StrCat("pp ", pp, ": a model of ", model.layers,
                                                   " layers has 1 to ", model.layers,
                                                   " pipeline stages"));
  }
  // One layer's share on a rank, from the tensor table (model/tensor_table.h) as ShardWeights
  // loads it: every row's box on tensor-parallel rank 0, the matrices twice (the packed copies the
  // small-batch products use). GPT-2's and Llama's rows alike.
  int64_t layer_elements = 0;
  for (const model::TensorRow& row : model::BlockRows(model)) {
    const int64_t n = model::TpBox(row, model, tp, 0).numel();
    layer_elements += row.shape.size() >= 2 ? 2 * n : n;
  }
  const int64_t layer_bytes = kFloat * layer_elements;
  int64_t position_table = 0, final_norm = 0;
  for (const model::TensorRow& row : model::EmbeddingRows(model)) {
    if (row.role == model::TensorRole::kPositionEmbedding) position_table = row.numel();
  }
  for (const model::TensorRow& row : model::HeadRows(model)) {
    if (row.role != model::TensorRole::kLmHead) final_norm += row.numel();
  }
  const int64_t vocab_rows = CeilDiv(model.vocab, tp);
  const int64_t max_layers = StageLayers(model.layers, pp, 0);  // the first stage has the most
  // The cache holds the rank's key/value heads only (grouped-query attention's smaller cache): one
  // at least, shared by tp / kv_heads ranks past kv_heads.
  const int64_t kv_width = std::max<int64_t>(model.kv() / tp, 1) * model.head_size();
  const int64_t block_bytes = 2 * max_layers * limits.block_size * kv_width * kFloat;
  const int64_t blocks_per_context = CeilDiv(model.max_seq_len, limits.block_size);

  ServeMemory fullest;
  for (int stage = 0; stage < pp; ++stage) {
    int64_t weights = StageLayers(model.layers, pp, stage) * layer_bytes;
    if (stage == 0) weights += kFloat * (vocab_rows * d + position_table);
    if (stage == pp - 1) {
      weights += kFloat * final_norm;
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
  // As PagedGptForward::Create carves it: the residuals, norms' outputs and statistics, q/k/v,
  // the attention output, the MLP's pre-activations and activation; the head's rows and logits.
  const int64_t attention = heads / tp * model.head_size();
  const int64_t mlp = (model.mlp == model::MlpKind::kSwiGlu ? 3 : 2) * (ff / tp);
  fullest.workspace_bytes =
      kFloat * (rows * (5 * d + 4 + (attention + 2 * kv_width) + attention + mlp) +
                int64_t{limits.max_running} * (2 * d + 2 + vocab_rows));
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
