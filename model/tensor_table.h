// The table of a model's tensors: for a ModelConfig, every parameter tensor's name, role, shape,
// how tensor parallelism cuts it, whether AdamW decays it and how it is initialised. Everything
// that names, lays out, shards, saves or prices parameters reads it: the engine's buffers
// (worker/model/param_layout.h, shard_layout.h), checkpoints and the Hugging Face import, ZeRO's
// units, the planner's parameter counts. A family adds rows here, not branches there (llama.cpp
// keeps its architectures' tensors in one table for the same reason).
//
// GPT-2's rows, per block (our checkpoint names, docs/checkpoint-format.md; linear weights are
// nn.Linear's (out, in)):
//   ln1.w/.b (C), qkv.w (3C, C)/.b (3C), attn_proj.w (C, C)/.b (C), ln2.w/.b (C),
//   fc.w (F, C)/.b (F), fc_proj.w (C, F)/.b (C)
// and around the blocks wte (V, C), wpe (max_seq_len, C), lnf.w/.b (C), lm_head.w (V, C) when the
// head is untied. Other choices add or drop rows: RMSNorm has no .b, grouped-query attention has
// q.w, k.w and v.w instead of the fused qkv, SwiGLU has gate.w, up.w and down.w, rotary positions
// no wpe, no biases no .b of a linear.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace shardline::model {

// What a tensor is for; the engine finds a block's tensors by role. Absent roles (another
// family's) have no row.
enum class TensorRole : int {
  // Before the blocks (the first pipeline stage).
  kTokenEmbedding,     // wte (V, C)
  kPositionEmbedding,  // wpe (max_seq_len, C)
  // A block.
  kNorm1,        // ln1.w (C)
  kNorm1Bias,    // ln1.b (C)
  kQkv,          // qkv.w (3·C, C): all heads' q rows, then k rows, then v rows
  kQkvBias,      // qkv.b (3·C)
  kQuery,        // q.w (heads·hd, C)           grouped-query attention
  kKey,          // k.w (kv_heads·hd, C)
  kValue,        // v.w (kv_heads·hd, C)
  kAttnOut,      // attn_proj.w (C, heads·hd)
  kAttnOutBias,  // attn_proj.b (C)
  kNorm2,        // ln2.w (C)
  kNorm2Bias,    // ln2.b (C)
  kMlpUp,        // fc.w (F, C) (GELU), up.w (F, C) (SwiGLU)
  kMlpUpBias,    // fc.b (F)
  kMlpGate,      // gate.w (F, C) (SwiGLU)
  kMlpDown,      // fc_proj.w (C, F) (GELU), down.w (C, F) (SwiGLU)
  kMlpDownBias,  // fc_proj.b (C)
  // After the blocks (the last pipeline stage).
  kFinalNorm,      // lnf.w (C)
  kFinalNormBias,  // lnf.b (C)
  kLmHead,         // lm_head.w (V, C), only when untied
  kCount,
};
inline constexpr int kTensorRoles = static_cast<int>(TensorRole::kCount);

// How tensor parallelism cuts a tensor's sharded_shape among tp ranks (Megatron-LM's cut).
enum class TpCut {
  kReplicated,     // every rank holds all of it (norms, row-parallel biases, wpe)
  kSplit,          // dimension tp_dim in tp equal parts (column- and row-parallel linears, by heads
                   // or by MLP columns); tp must divide it
  kVocab,          // dimension 0, the vocabulary, in parts [V·r/tp, V·(r+1)/tp), unevenly when tp
                   // does not divide V (vocab-parallel embedding and head)
  kKeyValueHeads,  // dimension 0 by key/value heads; when tp exceeds kv_heads each head is held
                   // by tp / kv_heads ranks (vLLM's rule)
};

enum class InitKind {
  kOnes,            // norm gains
  kZeros,           // biases
  kNormal,          // N(0, 0.02²)
  kResidualNormal,  // N(0, (0.02 / sqrt(2·layers))²): the projections into the residual (GPT-2)
};

struct TensorRow {
  std::string name;  // "ln1.w" for a block row (the model's tensor is "h.{l}.ln1.w"), "wte"
  TensorRole role = TensorRole::kCount;
  std::vector<int64_t> shape;  // as a single-file checkpoint stores it
  // The global shape a sharded checkpoint's manifest gives, whose boxes the ranks hold: `shape`,
  // except the fused QKV, viewed (3, C, C) and (3, C) so that a range of heads is a box. The same
  // bytes in the same order either way.
  std::vector<int64_t> sharded_shape;
  TpCut cut = TpCut::kReplicated;
  int tp_dim = 0;      // the dimension of sharded_shape that kSplit cuts
  bool decay = false;  // AdamW's weight decay applies (matrices, not biases or gains)
  InitKind init = InitKind::kZeros;

  int64_t numel() const;
};

// One block's rows in buffer order (norm 1, attention, norm 2, MLP), without the "h.{l}." prefix.
std::vector<TensorRow> BlockRows(const ModelConfig& config);
// The rows before the blocks (wte, wpe) and after them (lnf.w, lnf.b, lm_head.w), by config.
std::vector<TensorRow> EmbeddingRows(const ModelConfig& config);
std::vector<TensorRow> HeadRows(const ModelConfig& config);
// Every tensor of the model in buffer order — embedding rows, each layer's block rows named
// "h.{l}.NAME", head rows: what a single-file checkpoint holds.
std::vector<TensorRow> ModelRows(const ModelConfig& config);
// "h.{layer}.{name}".
std::string BlockTensorName(int64_t layer, const std::string& name);

// A box of a tensor's sharded_shape: offsets and sizes per dimension.
struct TensorBox {
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  int64_t numel() const;
};
// The box of `row` that tensor-parallel rank `tp_index` of `tp_size` holds. The caller has checked
// that the config can be cut tp_size ways (CheckTensorParallel).
TensorBox TpBox(const TensorRow& row, const ModelConfig& config, int64_t tp_size, int64_t tp_index);
// OK when every row of `config` can be cut tp_size ways: tp divides heads and d_ff, and kv_heads
// or is a multiple of it, and tp is at most the vocabulary. InvalidArgument naming both numbers.
absl::Status CheckTensorParallel(const ModelConfig& config, int64_t tp_size);

// The parameters one tensor-parallel rank holds of one block (replicated rows counted whole).
int64_t BlockParamsPerRank(const ModelConfig& config, int64_t tp_size);
// The forward FLOPs per token of one whole block over sequences of seq_len tokens: 2 per
// multiply-accumulate of every weight matrix, plus attention's QKᵀ and AV, each 2·T·C per token
// (Narayanan et al. 2021, eq. 3's 24·B·s·h² + 4·B·s²·h per layer; no causal halving, as Megatron-LM
// and PaLM count). The planner's cost model and the actors' calibration both count with it, so the
// measured rate and the predicted FLOPs agree by construction.
double BlockForwardFlopsPerToken(const ModelConfig& config, int64_t seq_len);

}  // namespace shardline::model
