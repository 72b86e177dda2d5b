// ModelConfig: a decoder-only transformer family described as data — which norm, which MLP, which
// positions, how many heads and key/value heads, biases, tied embeddings — and its sizes. GPT-2 and
// Llama are two settings of it (Megatron-Core's layer specs, llama.cpp's architecture table). The
// planner prices it, checkpoints record it, the engine runs it: one struct, read from YAML by
// placement/train_spec.h, written into checkpoint metadata by checkpoint/model_config.h. Which
// tensors a config has, their shapes and how tensor parallelism cuts them: model/tensor_table.h.
//
// A config describes more than the engine runs today; EngineSupports says what it runs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace shardline::model {

enum class NormKind {
  kLayerNorm,  // (x - mean) / std · w + b (b when the config has biases)
  kRmsNorm,    // x / rms · w
};
enum class MlpKind {
  kGelu,    // fc (F, C) → GELU (tanh approximation) → fc_proj (C, F)
  kSwiGlu,  // silu(gate (F, C) x) · up (F, C) x → down (C, F)
};
enum class PositionKind {
  kLearned,  // a position table wpe (max_seq_len, C) added to the token embedding
  kRotary,   // rotary embedding of queries and keys (rope_theta); no table
};

// Llama 3's rescaling of the rotary frequencies for contexts past the one it was trained on
// (transformers' rope_type "llama3"): wavelengths shorter than original_max_positions /
// high_freq_factor keep their frequency, those longer than original_max_positions /
// low_freq_factor are divided by factor, and those between are blended smoothly.
struct RopeScaling {
  double factor = 0;  // 0: no scaling (rope_type "default")
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
  bool enabled() const { return factor > 0; }
  bool operator==(const RopeScaling&) const = default;
};

// "layernorm", "rmsnorm"; "gelu", "swiglu"; "learned", "rotary".
std::string_view NormKindName(NormKind kind);
std::string_view MlpKindName(MlpKind kind);
std::string_view PositionKindName(PositionKind kind);

struct ModelConfig {
  // Sizes, in the order designated initialisers give them.
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // key/value heads (grouped-query attention); 0: heads
  int64_t d_model = 0;   // C
  int64_t d_ff = 0;      // F, the MLP's hidden width; 0: 4·d_model
  int64_t head_dim = 0;  // channels per attention head; 0: d_model / heads
  int64_t vocab = 0;     // V
  // The longest sequence the model runs; with learned positions also the rows of wpe.
  int64_t max_seq_len = 0;
  // The output head reuses the token embedding wte; when false it has its own lm_head.w (V, C).
  bool tied_embeddings = true;

  // The family's choices; the defaults are GPT-2's.
  NormKind norm = NormKind::kLayerNorm;
  double norm_eps = 1e-5;
  MlpKind mlp = MlpKind::kGelu;
  PositionKind positions = PositionKind::kLearned;
  double rope_theta = 10000.0;  // rotary positions only
  RopeScaling rope_scaling;     // rotary positions only
  bool bias = true;             // biases on the linear layers and the LayerNorms

  // The presets a spec's `arch:` names: GPT-2's choices (the defaults above), and Llama's (RMSNorm
  // eps 1e-5, SwiGLU, rotary with theta 10000, no biases, untied). Sizes stay as they are.
  static ModelConfig Gpt(ModelConfig sizes);
  static ModelConfig Llama(ModelConfig sizes);

  // With the defaults resolved.
  int64_t ff() const { return d_ff > 0 ? d_ff : 4 * d_model; }
  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : heads > 0 ? d_model / heads : 0; }

  // "gpt" or "llama" when the choices are one of the presets', else "custom"; for messages only
  // (nothing computes from a name).
  std::string_view FamilyName() const;

  // OK, or InvalidArgument "model config: ..." naming the field and the numbers ("d_model 100 is
  // not divisible by heads 3" when head_dim is not given): sizes positive and below 2^29, heads a
  // multiple of kv_heads, norm_eps and rope_theta positive, an even head size under rotary
  // positions, rope scaling factors positive with low_freq_factor < high_freq_factor.
  absl::Status Validate() const;
  // OK when the engine can run this config, else InvalidArgument naming the first field it cannot
  // run. Every norm, MLP and position choice runs; biases only where the table has them (not with
  // grouped-query attention's separate q/k/v, nor with SwiGLU's gate); a rotary head size within
  // the kernels' (512); every dimension and weight matrix within the kernels' int sizes.
  absl::Status EngineSupports() const;

  // "layers=2 heads=4 d_model=16 d_ff=64 vocab=32 max_seq_len=8 tied", then the choices where they
  // differ from GPT-2's.
  std::string DebugString() const;

  // OK when a batch of B sequences of T tokens can run: B, T >= 1, T within max_seq_len, and the
  // largest activation (the logits) within the kernels' sizes. InvalidArgument otherwise.
  absl::Status CheckBatch(int B, int T) const;
  // The checks every model makes of a batch before any work (the kernels trust their indices):
  // CheckBatch, B·T tokens each in [0, vocab); B·T targets, each negative (the position is
  // ignored) or below vocab. InvalidArgument naming the count or the first bad position.
  absl::Status CheckTokens(std::span<const int32_t> tokens, int B, int T) const;
  absl::Status CheckTargets(std::span<const int32_t> targets, int B, int T) const;

  // Equal when they describe the same model: d_ff, kv_heads and head_dim compared resolved (0 and
  // 4·d_model are one width), rope_theta and rope_scaling only under rotary positions.
  bool operator==(const ModelConfig& other) const;
};

}  // namespace shardline::model
