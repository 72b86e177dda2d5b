// What one rank of a sharded GPT holds: which box of which global tensor, where it sits in the
// rank's flat parameter buffer, and how the buffer divides into units (the pieces ZeRO shards and
// gathers, and data parallelism reduces, one at a time).
//
// The cut is Megatron-LM's:
//   tensor parallel (tp ranks): qkv and fc are column-parallel — a rank holds the rows of its
//     heads (qkv.w is viewed as (3, C, C), Q/K/V × rows × columns, so a head range is a box) and
//     of its F/tp MLP columns; attn_proj and fc_proj are row-parallel — a rank holds the matching
//     columns (dim 1); their biases, the LayerNorms and wpe are replicated; wte (and an untied
//     lm_head.w) are split by vocabulary rows, [tp_index·V/tp, (tp_index+1)·V/tp), unevenly when
//     tp does not divide V.
//   pipeline parallel: a stage holds layers [first_layer, last_layer); the first stage also wte and
//     wpe, the last lnf and the head. With tied embeddings and more than one stage, the last stage
//     holds a copy of its wte rows for the head; the copies' gradients are summed between the two
//     stages every step, so they stay equal (Megatron's embedding group).
//
// Units, in buffer order: "wte", "wpe" (first stage), "h.{l}" per layer held (ascending), "lnf",
// "lm_head" (last
// stage; "lm_head" holds lm_head.w, or the wte copy when tied and not also the first stage).
// The tied copy is its own unit so that its ZeRO partition lines up with the first stage's "wte".
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "placement/parallel_layout.h"
#include "worker/model/param_layout.h"

namespace shardline::model {

// Where a rank sits in the model's cut.
struct ShardPlace {
  int tp_size = 1;
  int tp_index = 0;
  // The stage's chunks of layers [first, last), ascending and disjoint: one under 1F1B.
  std::vector<placement::StageRange> chunks;
  bool first_stage = true;  // holds the embedding (before chunk 0)
  bool last_stage = true;   // holds the final LayerNorm and the head (after the last chunk)
};

struct ShardTensor {
  std::string name;                   // the global name (docs/checkpoint-format.md)
  std::vector<int64_t> global_shape;  // the manifest's view: qkv.w (3,C,C), qkv.b (3,C)
  std::vector<int64_t> box_offsets;   // this rank's box in global_shape
  std::vector<int64_t> box_shape;
  int unit = 0;        // index into units()
  int64_t offset = 0;  // in floats from the start of its unit
  int64_t numel = 0;
  // A lower tensor-parallel rank holds the same box (norms, row-parallel biases, wpe on every
  // rank but 0; a key/value head on all but the first of the ranks sharing it): that rank saves it
  // and counts it in the gradient norm.
  bool tp_replica = false;
  bool tied_copy = false;   // the last stage's copy of wte rows
  bool decay = false;       // AdamW's weight decay applies (matrices, not biases or gains)
  TensorRole role = TensorRole::kCount;
  InitKind init = InitKind::kZeros;
};

struct ShardUnit {
  std::string name;    // "wte", "wpe", "h.3", "lnf", "lm_head"
  int64_t begin = 0;   // in floats in the rank's flat buffer
  int64_t size = 0;
};

class ShardLayout {
 public:
  // InvalidArgument when `config` is invalid or `place` does not fit it (CheckTensorParallel; the
  // chunks must be non-empty, ascending, disjoint ranges inside the model).
  static absl::StatusOr<ShardLayout> Create(const ModelConfig& config, const ShardPlace& place);

  const ModelConfig& config() const { return config_; }
  const ShardPlace& place() const { return place_; }
  const std::vector<ShardTensor>& tensors() const { return tensors_; }
  const std::vector<ShardUnit>& units() const { return units_; }
  int64_t total() const { return total_; }

  int heads() const { return config_.heads / place_.tp_size; }  // query heads held here
  // Key/value heads held here: kv_heads / tp, or one shared by tp / kv_heads ranks (vLLM's rule).
  int kv_heads() const {
    return static_cast<int>(std::max<int64_t>(config_.kv() / place_.tp_size, 1));
  }
  // How many tensor-parallel ranks hold each of this rank's key/value heads (1: none shared).
  int kv_replicas() const {
    return static_cast<int>(std::max<int64_t>(place_.tp_size / config_.kv(), 1));
  }
  int ff() const { return config_.ff() / place_.tp_size; }      // MLP columns held here
  int vocab_begin() const { return vocab_begin_; }              // vocabulary rows [begin, end)
  int vocab_end() const { return vocab_end_; }
  int vocab_shard() const { return vocab_end_ - vocab_begin_; }

  // Unit indices; -1 when this stage has no such unit. layer_unit(l) for l in the stage.
  int wte_unit() const { return wte_unit_; }
  int wpe_unit() const { return wpe_unit_; }
  int lnf_unit() const { return lnf_unit_; }
  int head_unit() const { return head_unit_; }  // "lm_head", or -1: the head reads "wte"
  int layer_unit(int layer) const { return layer_units_[layer]; }

  // Pointers to layer `layer`'s tensors inside a buffer holding its unit (unit_base = the unit's
  // first float); the same for a gradient buffer.
  BlockParams Block(float* unit_base) const;

 private:
  ShardLayout() = default;
  void AddUnit(std::string name);
  void Add(ShardTensor tensor);

  ModelConfig config_;
  ShardPlace place_;
  std::vector<ShardTensor> tensors_;
  std::vector<ShardUnit> units_;
  int64_t total_ = 0;
  int vocab_begin_ = 0, vocab_end_ = 0;
  int wte_unit_ = -1, wpe_unit_ = -1, lnf_unit_ = -1, head_unit_ = -1;
  std::vector<int> layer_units_;        // per model layer: its unit, -1 when not held here
  BlockOffsets block_offsets_{};        // a layer's tensors from its unit's start, by role
};

}  // namespace shardline::model
