#include "worker/model/param_layout.h"

#include "absl/strings/str_cat.h"
#include "model/tensor_table.h"

namespace shardline::model {

BlockParams BlockAt(float* base, const BlockOffsets& offsets) {
  BlockParams block;
  for (int role = 0; role < kTensorRoles; ++role) {
    if (offsets[role] >= 0) block.tensors[role] = base + offsets[role];
  }
  return block;
}

ParamLayout::ParamLayout(const ModelConfig& config) {
  block_offsets_.fill(-1);
  BlockOffsets outer;  // the outer tensors' offsets, by role
  outer.fill(-1);
  const auto add_outer = [&](const TensorRow& row) {
    outer[static_cast<int>(row.role)] = Add(row.name, row);
  };
  for (const TensorRow& row : EmbeddingRows(config)) add_outer(row);
  const std::vector<TensorRow> block = BlockRows(config);
  for (int l = 0; l < config.layers; ++l) {
    const int64_t begin = total_;
    layer_begin_.push_back(begin);
    for (const TensorRow& row : block) {
      const int64_t offset = Add(BlockTensorName(l, row.name), row);
      if (l == 0) block_offsets_[static_cast<int>(row.role)] = offset - begin;
    }
  }
  layer_begin_.push_back(total_);
  for (const TensorRow& row : HeadRows(config)) add_outer(row);
  const auto at = [&](TensorRole role) { return outer[static_cast<int>(role)]; };
  wte_ = at(TensorRole::kTokenEmbedding);
  wpe_ = at(TensorRole::kPositionEmbedding);
  lnf_w_ = at(TensorRole::kFinalNorm);
  lnf_b_ = at(TensorRole::kFinalNormBias);
  lm_head_ = config.tied_embeddings ? wte_ : at(TensorRole::kLmHead);
}

int64_t ParamLayout::Add(std::string name, const TensorRow& row) {
  const int64_t offset = total_;
  tensors_.push_back({std::move(name), offset, row.shape, row.numel(), row.init});
  total_ += row.numel();
  return offset;
}

const ParamTensorInfo* ParamLayout::Find(const std::string& name) const {
  for (const ParamTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

BlockParams ParamLayout::Block(float* base, int layer) const {
  return BlockAt(base + layer_begin_[layer], block_offsets_);
}

OuterParams ParamLayout::Outer(float* base) const {
  const auto at = [base](int64_t offset) { return offset >= 0 ? base + offset : nullptr; };
  return OuterParams{at(wte_), at(wpe_), at(lnf_w_), at(lnf_b_), at(lm_head_)};
}

}  // namespace shardline::model
