#include "worker/model/param_layout.h"

#include "absl/strings/str_cat.h"

namespace shardline::model {

ParamLayout::ParamLayout(const GptConfig& config) {
  const int64_t C = config.d_model;
  const int64_t F = config.ff();
  const int64_t V = config.vocab;
  wte_ = Add("wte", {V, C});
  wpe_ = Add("wpe", {config.max_seq_len, C});
  for (int l = 0; l < config.layers; ++l) {
    const int64_t begin = total_;
    layer_begin_.push_back(begin);
    const std::string p = absl::StrCat("h.", l, ".");
    const int64_t offsets[] = {
        Add(p + "ln1.w", {C}),         Add(p + "ln1.b", {C}),
        Add(p + "qkv.w", {3 * C, C}),  Add(p + "qkv.b", {3 * C}),
        Add(p + "attn_proj.w", {C, C}), Add(p + "attn_proj.b", {C}),
        Add(p + "ln2.w", {C}),         Add(p + "ln2.b", {C}),
        Add(p + "fc.w", {F, C}),       Add(p + "fc.b", {F}),
        Add(p + "fc_proj.w", {C, F}),  Add(p + "fc_proj.b", {C}),
    };
    if (l == 0) {
      for (int64_t offset : offsets) block_offsets_.push_back(offset - begin);
    }
  }
  layer_begin_.push_back(total_);
  lnf_w_ = Add("lnf.w", {C});
  lnf_b_ = Add("lnf.b", {C});
  lm_head_ = config.tied_embeddings ? wte_ : Add("lm_head.w", {V, C});
}

int64_t ParamLayout::Add(std::string name, std::vector<int64_t> shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int64_t offset = total_;
  tensors_.push_back({std::move(name), offset, std::move(shape), numel});
  total_ += numel;
  return offset;
}

const ParamTensorInfo* ParamLayout::Find(const std::string& name) const {
  for (const ParamTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

BlockParams ParamLayout::Block(float* base, int layer) const {
  float* p = base + layer_begin_[layer];
  const std::vector<int64_t>& o = block_offsets_;
  return BlockParams{p + o[0], p + o[1], p + o[2],  p + o[3],  p + o[4],  p + o[5],
                     p + o[6], p + o[7], p + o[8],  p + o[9],  p + o[10], p + o[11]};
}

OuterParams ParamLayout::Outer(float* base) const {
  return OuterParams{base + wte_, base + wpe_, base + lnf_w_, base + lnf_b_, base + lm_head_};
}

}  // namespace shardline::model
