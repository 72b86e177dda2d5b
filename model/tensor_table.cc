#include "model/tensor_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardline::model {
namespace {

using enum TensorRole;

TensorRow Row(std::string name, TensorRole role, std::vector<int64_t> shape, TpCut cut, int tp_dim,
              InitKind init) {
  TensorRow row;
  row.name = std::move(name);
  row.role = role;
  row.sharded_shape = shape;
  row.shape = std::move(shape);
  row.cut = cut;
  row.tp_dim = tp_dim;
  row.decay = row.shape.size() >= 2;
  row.init = init;
  return row;
}

// A norm's gain, and its bias when the norm is a LayerNorm of a config with biases.
void AddNorm(const ModelConfig& c, const std::string& prefix, TensorRole gain, TensorRole bias,
             std::vector<TensorRow>& rows) {
  rows.push_back(Row(prefix + ".w", gain, {c.d_model}, TpCut::kReplicated, 0, InitKind::kOnes));
  if (c.norm == NormKind::kLayerNorm && c.bias) {
    rows.push_back(Row(prefix + ".b", bias, {c.d_model}, TpCut::kReplicated, 0, InitKind::kZeros));
  }
}

}  // namespace

int64_t TensorRow::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorBox::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorRow> BlockRows(const ModelConfig& c) {
  const int64_t C = c.d_model;
  const int64_t F = c.ff();
  const int64_t hd = c.head_size();
  const int64_t q_width = c.heads * hd;
  const int64_t kv_width = c.kv() * hd;
  std::vector<TensorRow> rows;
  AddNorm(c, "ln1", kNorm1, kNorm1Bias, rows);
  if (c.kv() == c.heads) {
    // One fused product for q, k and v; its sharded view (3, heads·hd, C) makes a rank's heads a
    // box.
    TensorRow qkv = Row("qkv.w", kQkv, {3 * q_width, C}, TpCut::kSplit, 1, InitKind::kNormal);
    qkv.sharded_shape = {3, q_width, C};
    rows.push_back(std::move(qkv));
    if (c.bias) {
      TensorRow qkv_b = Row("qkv.b", kQkvBias, {3 * q_width}, TpCut::kSplit, 1, InitKind::kZeros);
      qkv_b.sharded_shape = {3, q_width};
      rows.push_back(std::move(qkv_b));
    }
  } else {
    rows.push_back(Row("q.w", kQuery, {q_width, C}, TpCut::kSplit, 0, InitKind::kNormal));
    rows.push_back(Row("k.w", kKey, {kv_width, C}, TpCut::kKeyValueHeads, 0, InitKind::kNormal));
    rows.push_back(Row("v.w", kValue, {kv_width, C}, TpCut::kKeyValueHeads, 0, InitKind::kNormal));
  }
  rows.push_back(
      Row("attn_proj.w", kAttnOut, {C, q_width}, TpCut::kSplit, 1, InitKind::kResidualNormal));
  if (c.bias) {
    rows.push_back(Row("attn_proj.b", kAttnOutBias, {C}, TpCut::kReplicated, 0, InitKind::kZeros));
  }
  AddNorm(c, "ln2", kNorm2, kNorm2Bias, rows);
  if (c.mlp == MlpKind::kGelu) {
    rows.push_back(Row("fc.w", kMlpUp, {F, C}, TpCut::kSplit, 0, InitKind::kNormal));
    if (c.bias) rows.push_back(Row("fc.b", kMlpUpBias, {F}, TpCut::kSplit, 0, InitKind::kZeros));
    rows.push_back(Row("fc_proj.w", kMlpDown, {C, F}, TpCut::kSplit, 1, InitKind::kResidualNormal));
  } else {
    rows.push_back(Row("gate.w", kMlpGate, {F, C}, TpCut::kSplit, 0, InitKind::kNormal));
    rows.push_back(Row("up.w", kMlpUp, {F, C}, TpCut::kSplit, 0, InitKind::kNormal));
    if (c.bias) rows.push_back(Row("up.b", kMlpUpBias, {F}, TpCut::kSplit, 0, InitKind::kZeros));
    rows.push_back(Row("down.w", kMlpDown, {C, F}, TpCut::kSplit, 1, InitKind::kResidualNormal));
  }
  if (c.bias) {
    const std::string name = c.mlp == MlpKind::kGelu ? "fc_proj.b" : "down.b";
    rows.push_back(Row(name, kMlpDownBias, {C}, TpCut::kReplicated, 0, InitKind::kZeros));
  }
  return rows;
}

std::vector<TensorRow> EmbeddingRows(const ModelConfig& c) {
  std::vector<TensorRow> rows;
  rows.push_back(
      Row("wte", kTokenEmbedding, {c.vocab, c.d_model}, TpCut::kVocab, 0, InitKind::kNormal));
  if (c.positions == PositionKind::kLearned) {
    rows.push_back(Row("wpe", kPositionEmbedding, {c.max_seq_len, c.d_model}, TpCut::kReplicated, 0,
                       InitKind::kNormal));
  }
  return rows;
}

std::vector<TensorRow> HeadRows(const ModelConfig& c) {
  std::vector<TensorRow> rows;
  AddNorm(c, "lnf", kFinalNorm, kFinalNormBias, rows);
  if (!c.tied_embeddings) {
    rows.push_back(
        Row("lm_head.w", kLmHead, {c.vocab, c.d_model}, TpCut::kVocab, 0, InitKind::kNormal));
  }
  return rows;
}

std::string BlockTensorName(int64_t layer, const std::string& name) {
  return absl::StrCat("h.", layer, ".", name);
}

std::vector<TensorRow> ModelRows(const ModelConfig& config) {
  std::vector<TensorRow> rows = EmbeddingRows(config);
  const std::vector<TensorRow> block = BlockRows(config);
  for (int64_t l = 0; l < config.layers; ++l) {
    for (TensorRow row : block) {
      row.name = BlockTensorName(l, row.name);
      rows.push_back(std::move(row));
    }
  }
  for (TensorRow& row : HeadRows(config)) rows.push_back(std::move(row));
  return rows;
}

TensorBox TpBox(const TensorRow& row, const ModelConfig& config, int64_t tp_size,
                int64_t tp_index) {
  TensorBox box{std::vector<int64_t>(row.sharded_shape.size(), 0), row.sharded_shape};
  switch (row.cut) {
    case TpCut::kReplicated:
      break;
    case TpCut::kSplit: {
      const int64_t part = row.sharded_shape[row.tp_dim] / tp_size;
      box.offsets[row.tp_dim] = part * tp_index;
      box.shape[row.tp_dim] = part;
      break;
    }
    case TpCut::kVocab: {
      const int64_t V = row.sharded_shape[0];
      box.offsets[0] = V * tp_index / tp_size;
      box.shape[0] = V * (tp_index + 1) / tp_size - box.offsets[0];
      break;
    }
    case TpCut::kKeyValueHeads: {
      const int64_t kv = config.kv();
      const int64_t hd = config.head_size();
      // Fewer key/value heads than ranks: tp / kv consecutive ranks share one head.
      const int64_t heads_here = kv >= tp_size ? kv / tp_size : 1;
      const int64_t first = kv >= tp_size ? tp_index * heads_here : tp_index / (tp_size / kv);
      box.offsets[0] = first * hd;
      box.shape[0] = heads_here * hd;
      break;
    }
  }
  return box;
}

absl::Status CheckTensorParallel(const ModelConfig& config, int64_t tp) {
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("tp ", tp, " must be >= 1"));
  if (config.heads % tp != 0 || config.ff() % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp ", tp, " must divide heads ", config.heads, " and d_ff ", config.ff()));
  }
  const int64_t kv = config.kv();
  if (kv != config.heads && (kv >= tp ? kv % tp != 0 : tp % kv != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp ", tp, " and kv_heads ", kv,
                     ": one must divide the other (each rank holds whole key/value heads, or "
                     "tp / kv_heads ranks share one)"));
  }
  if (tp > config.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp ", tp, " is larger than the vocabulary ", config.vocab));
  }
  return absl::OkStatus();
}

int64_t BlockParamsPerRank(const ModelConfig& config, int64_t tp_size) {
  int64_t total = 0;
  for (const TensorRow& row : BlockRows(config)) total += TpBox(row, config, tp_size, 0).numel();
  return total;
}

double BlockForwardFlopsPerToken(const ModelConfig& config, int64_t seq_len) {
  int64_t matrix_params = 0;
  for (const TensorRow& row : BlockRows(config)) {
    if (row.shape.size() >= 2) matrix_params += row.numel();
  }
  // QKᵀ and AV run over the query heads' width (d_model unless head_dim says otherwise).
  const double attention_width = static_cast<double>(config.heads * config.head_size());
  return 2.0 * static_cast<double>(matrix_params) +
         4.0 * static_cast<double>(seq_len) * attention_width;
}

}  // namespace shardline::model
