#include "worker/model/shard_layout.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"

namespace shardline::model {

absl::StatusOr<ShardLayout> ShardLayout::Create(const ModelConfig& config,
                                                const ShardPlace& place) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(config.EngineSupports());
  const int tp = place.tp_size;
  if (tp < 1 || place.tp_index < 0 || place.tp_index >= tp) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel index ", place.tp_index,
                                                   " of ", tp, " is out of range"));
  }
  RETURN_IF_ERROR(CheckTensorParallel(config, tp));
  if (place.chunks.empty()) {
    return absl::InvalidArgumentError("a stage needs at least one chunk of layers");
  }
  int previous_end = 0;
  for (const placement::StageRange& chunk : place.chunks) {
    if (chunk.first < previous_end || chunk.first >= chunk.last || chunk.last > config.layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage layers [", chunk.first, ", ", chunk.last, ") are not a non-empty range inside [",
          previous_end, ", ", config.layers, ") after the stage's earlier chunks"));
    }
    previous_end = chunk.last;
  }
  ShardLayout layout;
  layout.config_ = config;
  layout.place_ = place;
  const int64_t V = config.vocab;
  const int64_t r = place.tp_index;
  layout.vocab_begin_ = static_cast<int>(V * r / tp);
  layout.vocab_end_ = static_cast<int>(V * (r + 1) / tp);
  layout.block_offsets_.fill(-1);

  // A row's box on this rank, in the unit last added.
  const auto add = [&](const TensorRow& row, std::string name, bool tied_copy = false) {
    const TensorBox box = TpBox(row, config, tp, r);
    ShardTensor t;
    t.name = std::move(name);
    t.role = row.role;
    t.global_shape = row.sharded_shape;
    t.box_offsets = box.offsets;
    t.box_shape = box.shape;
    const int64_t sharing = config.kv() < tp ? tp / config.kv() : 1;
    t.tp_replica = (row.cut == TpCut::kReplicated && r != 0) ||
                   (row.cut == TpCut::kKeyValueHeads && r % sharing != 0);
    t.decay = row.decay;
    t.init = row.init;
    t.tied_copy = tied_copy;
    layout.Add(std::move(t));
  };
  if (place.first_stage) {
    // One unit per embedding tensor, so that the last stage's tied copy lines up with "wte".
    for (const TensorRow& row : EmbeddingRows(config)) {
      const int unit = static_cast<int>(layout.units_.size());
      if (row.role == TensorRole::kTokenEmbedding) layout.wte_unit_ = unit;
      if (row.role == TensorRole::kPositionEmbedding) layout.wpe_unit_ = unit;
      layout.AddUnit(row.name);
      add(row, row.name);
    }
  }
  layout.layer_units_.assign(config.layers, -1);
  const std::vector<TensorRow> block = BlockRows(config);
  for (const placement::StageRange& chunk : place.chunks) {
    for (int l = chunk.first; l < chunk.last; ++l) {
      layout.layer_units_[l] = static_cast<int>(layout.units_.size());
      layout.AddUnit(absl::StrCat("h.", l));
      const int64_t unit_begin = layout.total_;
      for (const TensorRow& row : block) {
        layout.block_offsets_[static_cast<int>(row.role)] = layout.total_ - unit_begin;
        add(row, BlockTensorName(l, row.name));
      }
    }
  }
  if (place.last_stage) {
    layout.lnf_unit_ = static_cast<int>(layout.units_.size());
    layout.AddUnit("lnf");
    for (const TensorRow& row : HeadRows(config)) {
      if (row.role == TensorRole::kLmHead) {
        layout.head_unit_ = static_cast<int>(layout.units_.size());
        layout.AddUnit("lm_head");
      }
      add(row, row.name);
    }
    if (config.tied_embeddings && !place.first_stage) {
      // The head reads its own copy of this rank's wte rows (Megatron's embedding group).
      layout.head_unit_ = static_cast<int>(layout.units_.size());
      layout.AddUnit("lm_head");
      for (const TensorRow& row : EmbeddingRows(config)) {
        if (row.role == TensorRole::kTokenEmbedding) add(row, row.name, /*tied_copy=*/true);
      }
    }
  }
  return layout;
}

void ShardLayout::AddUnit(std::string name) {
  units_.push_back(ShardUnit{std::move(name), total_, 0});
}

void ShardLayout::Add(ShardTensor tensor) {
  int64_t numel = 1;
  for (int64_t d : tensor.box_shape) numel *= d;
  ShardUnit& unit = units_.back();
  tensor.unit = static_cast<int>(units_.size()) - 1;
  tensor.offset = total_ - unit.begin;
  tensor.numel = numel;
  total_ += numel;
  unit.size += numel;
  tensors_.push_back(std::move(tensor));
}

BlockParams ShardLayout::Block(float* unit_base) const {
  return BlockAt(unit_base, block_offsets_);
}

}  // namespace shardline::model
