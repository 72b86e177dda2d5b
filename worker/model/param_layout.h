// Where every parameter tensor of a GPT lives inside one contiguous f32 buffer, by the names our
// checkpoints use (docs/checkpoint-format.md, worker/checkpoint/gpt2_checkpoint.h):
//   wte (V,C), wpe (maxT,C),
//   h.{l}.ln1.w/.b (C), h.{l}.qkv.w (3C,C)/.b (3C), h.{l}.attn_proj.w (C,C)/.b (C),
//   h.{l}.ln2.w/.b (C), h.{l}.fc.w (F,C)/.b (F), h.{l}.fc_proj.w (C,F)/.b (C),
//   lnf.w/.b (C), and lm_head.w (V,C) only when the embeddings are not tied.
// Linear weights are nn.Linear's (out, in), row-major. The buffer holds them in exactly this order,
// so one layer's tensors are one contiguous range (what a pipeline stage owns) and the gradient
// buffer, laid out the same way, can be all-reduced or sharded (ZeRO) as flat spans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/gpt_config.h"

namespace shardline::kernels::cpu {
class PackedWeight;
}  // namespace shardline::kernels::cpu

namespace shardline::model {

struct ParamTensorInfo {
  std::string name;
  int64_t offset = 0;  // in floats from the start of the buffer
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

// Pointers to one block's tensors inside a parameter buffer, or inside a gradient buffer with the
// same layout. Sizes are for what this device holds: on one device NH = heads and F = d_ff.
struct BlockParams {
  float* ln1_w = nullptr;        // (C)
  float* ln1_b = nullptr;        // (C)
  float* qkv_w = nullptr;        // (3·NH·HS, C): all heads' q rows, then k rows, then v rows
  float* qkv_b = nullptr;        // (3·NH·HS)
  float* attn_proj_w = nullptr;  // (C, NH·HS)
  float* attn_proj_b = nullptr;  // (C)
  float* ln2_w = nullptr;        // (C)
  float* ln2_b = nullptr;        // (C)
  float* fc_w = nullptr;         // (F, C)
  float* fc_b = nullptr;         // (F)
  float* fc_proj_w = nullptr;    // (C, F)
  float* fc_proj_b = nullptr;    // (C)
  // Optional MKL-packed copies of the four matrices, which products of few rows use (inference:
  // PagedGptForward packs them; null everywhere else).
  const kernels::cpu::PackedWeight* qkv_w_packed = nullptr;
  const kernels::cpu::PackedWeight* attn_proj_w_packed = nullptr;
  const kernels::cpu::PackedWeight* fc_w_packed = nullptr;
  const kernels::cpu::PackedWeight* fc_proj_w_packed = nullptr;
};

// The non-block tensors: embeddings, the final LayerNorm and the output head.
struct OuterParams {
  float* wte = nullptr;      // (V, C)
  float* wpe = nullptr;      // (maxT, C)
  float* lnf_w = nullptr;    // (C)
  float* lnf_b = nullptr;    // (C)
  float* lm_head = nullptr;  // (V, C): wte itself when tied
};

// The layout of a validated config. Cheap to copy.
class ParamLayout {
 public:
  explicit ParamLayout(const GptConfig& config);

  // Every tensor in buffer order.
  const std::vector<ParamTensorInfo>& tensors() const { return tensors_; }
  int64_t total() const { return total_; }
  // nullptr when there is no tensor of that name.
  const ParamTensorInfo* Find(const std::string& name) const;
  // [begin, end) in floats of layer l's tensors.
  int64_t LayerBegin(int layer) const { return layer_begin_[layer]; }
  int64_t LayerEnd(int layer) const { return layer_begin_[layer + 1]; }

  // Views into `base`, a buffer of total() floats (the parameters or the gradients).
  BlockParams Block(float* base, int layer) const;
  OuterParams Outer(float* base) const;

 private:
  int64_t Add(std::string name, std::vector<int64_t> shape);

  std::vector<ParamTensorInfo> tensors_;
  std::vector<int64_t> layer_begin_;  // layers + 1 entries
  // Offsets of a block's 12 tensors from its layer's start, in buffer order; every layer repeats
  // them.
  std::vector<int64_t> block_offsets_;
  int64_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0, lm_head_ = 0;
  int64_t total_ = 0;
};

}  // namespace shardline::model
