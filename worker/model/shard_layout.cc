#include "worker/model/shard_layout.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::model {

absl::StatusOr<ShardLayout> ShardLayout::Create(const GptConfig& config, const ShardPlace& place) {
  RETURN_IF_ERROR(config.Validate());
  const int tp = place.tp_size;
  if (tp < 1 || place.tp_index < 0 || place.tp_index >= tp) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel index ", place.tp_index,
                                                   " of ", tp, " is out of range"));
  }
  if (config.heads % tp != 0 || config.ff() % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tp ", tp, " must divide heads ", config.heads,
                                                   " and d_ff ", config.ff()));
  }
  if (tp > config.vocab) {
    return absl::InvalidArgumentError(absl::StrCat("tp ", tp, " is larger than the vocabulary ",
                                                   config.vocab));
  }
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
  const int64_t C = config.d_model;
  const int64_t F = config.ff();
  const int64_t V = config.vocab;
  const int64_t r = place.tp_index;
  const int64_t Cs = C / tp;  // attention width held here (heads/tp · head_size)
  const int64_t Fs = F / tp;
  layout.vocab_begin_ = static_cast<int>(V * r / tp);
  layout.vocab_end_ = static_cast<int>(V * (r + 1) / tp);
  const int64_t v0 = layout.vocab_begin_;
  const int64_t Vs = layout.vocab_end_ - layout.vocab_begin_;

  // A tensor of `unit`: global shape, box offsets, box shape.
  auto add = [&](std::string name, std::vector<int64_t> global, std::vector<int64_t> offsets,
                 std::vector<int64_t> shape, bool replica, bool decay, bool tied_copy = false) {
    ShardTensor t;
    t.name = std::move(name);
    t.global_shape = std::move(global);
    t.box_offsets = std::move(offsets);
    t.box_shape = std::move(shape);
    t.tp_replica = replica;
    t.decay = decay;
    t.tied_copy = tied_copy;
    layout.Add(std::move(t));
  };
  if (place.first_stage) {
    layout.wte_unit_ = static_cast<int>(layout.units_.size());
    layout.AddUnit("wte");
    add("wte", {V, C}, {v0, 0}, {Vs, C}, false, true);
    layout.wpe_unit_ = static_cast<int>(layout.units_.size());
    layout.AddUnit("wpe");
    add("wpe", {config.max_seq_len, C}, {0, 0}, {config.max_seq_len, C}, true, true);
  }
  layout.layer_units_.assign(config.layers, -1);
  for (const placement::StageRange& chunk : place.chunks) {
    for (int l = chunk.first; l < chunk.last; ++l) {
      layout.layer_units_[l] = static_cast<int>(layout.units_.size());
      layout.AddUnit(absl::StrCat("h.", l));
      const int64_t unit_begin = layout.total_;
      const std::string p = absl::StrCat("h.", l, ".");
      std::vector<int64_t> offsets;
      auto add_block = [&](std::string name, std::vector<int64_t> global,
                           std::vector<int64_t> box_offsets, std::vector<int64_t> shape,
                           bool replica, bool decay) {
        offsets.push_back(layout.total_ - unit_begin);
        add(p + name, std::move(global), std::move(box_offsets), std::move(shape), replica, decay);
      };
      // The order is BlockParams' order (ParamLayout::Block relies on the same one).
      add_block("ln1.w", {C}, {0}, {C}, true, false);
      add_block("ln1.b", {C}, {0}, {C}, true, false);
      add_block("qkv.w", {3, C, C}, {0, r * Cs, 0}, {3, Cs, C}, false, true);
      add_block("qkv.b", {3, C}, {0, r * Cs}, {3, Cs}, false, false);
      add_block("attn_proj.w", {C, C}, {0, r * Cs}, {C, Cs}, false, true);
      add_block("attn_proj.b", {C}, {0}, {C}, true, false);
      add_block("ln2.w", {C}, {0}, {C}, true, false);
      add_block("ln2.b", {C}, {0}, {C}, true, false);
      add_block("fc.w", {F, C}, {r * Fs, 0}, {Fs, C}, false, true);
      add_block("fc.b", {F}, {r * Fs}, {Fs}, false, false);
      add_block("fc_proj.w", {C, F}, {0, r * Fs}, {C, Fs}, false, true);
      add_block("fc_proj.b", {C}, {0}, {C}, true, false);
      if (layout.block_offsets_.empty()) layout.block_offsets_ = offsets;
    }
  }
  if (place.last_stage) {
    layout.lnf_unit_ = static_cast<int>(layout.units_.size());
    layout.AddUnit("lnf");
    add("lnf.w", {C}, {0}, {C}, true, false);
    add("lnf.b", {C}, {0}, {C}, true, false);
    if (!config.tied_embeddings) {
      layout.head_unit_ = static_cast<int>(layout.units_.size());
      layout.AddUnit("lm_head");
      add("lm_head.w", {V, C}, {v0, 0}, {Vs, C}, false, true);
    } else if (!place.first_stage) {
      layout.head_unit_ = static_cast<int>(layout.units_.size());
      layout.AddUnit("lm_head");
      add("wte", {V, C}, {v0, 0}, {Vs, C}, false, true, /*tied_copy=*/true);
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
  const std::vector<int64_t>& o = block_offsets_;
  float* p = unit_base;
  return BlockParams{p + o[0], p + o[1], p + o[2],  p + o[3],  p + o[4],  p + o[5],
                     p + o[6], p + o[7], p + o[8],  p + o[9],  p + o[10], p + o[11]};
}

}  // namespace shardline::model
