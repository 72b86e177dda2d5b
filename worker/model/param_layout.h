// Where every parameter tensor of a model lives inside one contiguous f32 buffer: the tensors of
// model/tensor_table.h's ModelRows, by the names our checkpoints use, in exactly that order.
// Linear weights are nn.Linear's (out, in), row-major. Holding them in this order means
// one layer's tensors are one contiguous range (what a pipeline stage owns) and the gradient
// buffer, laid out the same way, can be all-reduced or sharded (ZeRO) as flat spans.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/tensor_table.h"

namespace shardline::kernels::cpu {
class PackedWeight;
}  // namespace shardline::kernels::cpu

namespace shardline::model {

struct ParamTensorInfo {
  std::string name;
  int64_t offset = 0;  // in floats from the start of the buffer
  std::vector<int64_t> shape;
  int64_t numel = 0;
  InitKind init = InitKind::kZeros;
};

// Pointers to one block's tensors inside a parameter buffer, or inside a gradient buffer with the
// same layout, by role (model/tensor_table.h); null for a role the config has no row for. Sizes are
// what this device holds: on one device all heads and d_ff columns.
struct BlockParams {
  float* operator[](TensorRole role) const { return tensors[static_cast<int>(role)]; }
  float*& operator[](TensorRole role) { return tensors[static_cast<int>(role)]; }
  // An MKL-packed copy of a matrix, which products of few rows use (inference: PagedGptForward
  // packs them); null everywhere else.
  const kernels::cpu::PackedWeight* packed(TensorRole role) const {
    return packed_weights[static_cast<int>(role)];
  }
  const kernels::cpu::PackedWeight*& packed(TensorRole role) {
    return packed_weights[static_cast<int>(role)];
  }

  std::array<float*, kTensorRoles> tensors{};
  std::array<const kernels::cpu::PackedWeight*, kTensorRoles> packed_weights{};
};

// Where each role's tensor sits from its layer's first float (-1: none), as both layouts record it.
using BlockOffsets = std::array<int64_t, kTensorRoles>;
// The pointers of a block whose first float is `base`.
BlockParams BlockAt(float* base, const BlockOffsets& offsets);

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
  explicit ParamLayout(const ModelConfig& config);

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
  int64_t Add(std::string name, const TensorRow& row);

  std::vector<ParamTensorInfo> tensors_;
  std::vector<int64_t> layer_begin_;  // layers + 1 entries
  // Offsets of a block's tensors from its layer's start; every layer repeats them.
  BlockOffsets block_offsets_{};
  int64_t wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, lm_head_ = -1;  // -1: none
  int64_t total_ = 0;
};

}  // namespace shardline::model
