#include "model/model_config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::model {
namespace {

absl::Status Invalid(std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("model config: ", std::string(message)));
}

// GPT-2's and Llama's choices, for FamilyName and the presets.
bool HasGptChoices(const ModelConfig& c) {
  return c.norm == NormKind::kLayerNorm && c.mlp == MlpKind::kGelu &&
         c.positions == PositionKind::kLearned && c.bias;
}
bool HasLlamaChoices(const ModelConfig& c) {
  return c.norm == NormKind::kRmsNorm && c.mlp == MlpKind::kSwiGlu &&
         c.positions == PositionKind::kRotary && !c.bias;
}

}  // namespace

std::string_view NormKindName(NormKind kind) {
  return kind == NormKind::kLayerNorm ? "layernorm" : "rmsnorm";
}
std::string_view MlpKindName(MlpKind kind) { return kind == MlpKind::kGelu ? "gelu" : "swiglu"; }
std::string_view PositionKindName(PositionKind kind) {
  return kind == PositionKind::kLearned ? "learned" : "rotary";
}

ModelConfig ModelConfig::Gpt(ModelConfig sizes) {
  const ModelConfig gpt;
  sizes.norm = gpt.norm;
  sizes.norm_eps = gpt.norm_eps;
  sizes.mlp = gpt.mlp;
  sizes.positions = gpt.positions;
  sizes.rope_theta = gpt.rope_theta;
  sizes.rope_scaling = gpt.rope_scaling;
  sizes.bias = gpt.bias;
  return sizes;
}

ModelConfig ModelConfig::Llama(ModelConfig sizes) {
  sizes.norm = NormKind::kRmsNorm;
  sizes.norm_eps = 1e-5;
  sizes.mlp = MlpKind::kSwiGlu;
  sizes.positions = PositionKind::kRotary;
  sizes.rope_theta = 10000.0;
  sizes.bias = false;
  sizes.tied_embeddings = false;
  return sizes;
}

bool ModelConfig::operator==(const ModelConfig& o) const {
  const bool rotary = positions == PositionKind::kRotary;
  return layers == o.layers && heads == o.heads && kv() == o.kv() && d_model == o.d_model &&
         ff() == o.ff() && head_size() == o.head_size() && vocab == o.vocab &&
         max_seq_len == o.max_seq_len && tied_embeddings == o.tied_embeddings && norm == o.norm &&
         norm_eps == o.norm_eps && mlp == o.mlp && positions == o.positions &&
         (!rotary || (rope_theta == o.rope_theta && rope_scaling == o.rope_scaling)) &&
         bias == o.bias;
}

std::string_view ModelConfig::FamilyName() const {
  if (HasGptChoices(*this)) return "gpt";
  if (HasLlamaChoices(*this)) return "llama";
  return "custom";
}

absl::Status ModelConfig::Validate() const {
  for (auto [field, value] :
       {std::pair{"layers", layers}, std::pair{"heads", heads}, std::pair{"d_model", d_model},
        std::pair{"vocab", vocab}, std::pair{"max_seq_len", max_seq_len}}) {
    if (value < 1) return Invalid(absl::StrCat(field, " must be >= 1, got ", value));
    // The engine holds sizes in int; a size past this would wrap where it is multiplied.
    if (value > INT_MAX / 4) return Invalid(absl::StrCat(field, " ", value, " is too large"));
  }
  if (d_ff < 0) return Invalid(absl::StrCat("d_ff must be >= 1 (or 0 for 4·d_model), got ", d_ff));
  if (kv_heads < 0) {
    return Invalid(absl::StrCat("kv_heads must be >= 1 (or 0 for heads), got ", kv_heads));
  }
  if (head_dim < 0 || head_dim > INT_MAX / 4) {
    return Invalid(
        absl::StrCat("head_dim must be >= 1 (or 0 for d_model / heads), got ", head_dim));
  }
  if (head_dim == 0 && d_model % heads != 0) {
    return Invalid(absl::StrCat("d_model ", d_model, " is not divisible by heads ", heads,
                                " (give head_dim to size the heads otherwise)"));
  }
  // Grouped-query attention: every key/value head serves heads / kv_heads query heads.
  if (kv() > heads || heads % kv() != 0) {
    return Invalid(absl::StrCat("heads ", heads, " is not divisible by kv_heads ", kv(),
                                " (every key/value head serves a whole group of query heads)"));
  }
  if (!(norm_eps > 0) || !std::isfinite(norm_eps)) {
    return Invalid(absl::StrCat("norm_eps must be positive, got ", norm_eps));
  }
  if (positions == PositionKind::kRotary && (!(rope_theta > 0) || !std::isfinite(rope_theta))) {
    return Invalid(absl::StrCat("rope_theta must be positive, got ", rope_theta));
  }
  if (positions == PositionKind::kRotary && head_size() % 2 != 0) {
    return Invalid(absl::StrCat("rotary positions rotate pairs of channels: the head size ",
                                head_size(), " must be even"));
  }
  if (positions == PositionKind::kRotary && rope_scaling.enabled()) {
    const RopeScaling& r = rope_scaling;
    if (!std::isfinite(r.factor) || !(r.low_freq_factor > 0) || !std::isfinite(r.low_freq_factor) ||
        !(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor) ||
        r.original_max_positions < 1) {
      return Invalid(absl::StrCat(
          "rope_scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
          "original_max_position_embeddings >= 1; got factor ",
          r.factor, ", low_freq_factor ", r.low_freq_factor, ", high_freq_factor ",
          r.high_freq_factor, ", original_max_position_embeddings ", r.original_max_positions));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::EngineSupports() const {
  // The tensor table (model/tensor_table.h) has no biases for grouped-query attention's separate
  // q/k/v (Qwen2's) nor for SwiGLU's gate: a config asking for them would lose them silently.
  if (bias && kv() != heads) {
    return Invalid(absl::StrCat("bias true with kv_heads ", kv(), " < heads ", heads,
                                ": biases on separate q/k/v projections are not supported"));
  }
  if (bias && mlp == MlpKind::kSwiGlu) {
    return Invalid("bias true with mlp swiglu: biases on SwiGLU's projections are not supported");
  }
  if (!bias && norm == NormKind::kLayerNorm) {
    return Invalid("bias false with norm layernorm: a LayerNorm without its bias is not supported");
  }
  if (positions == PositionKind::kRotary && head_size() > 512) {
    return Invalid(absl::StrCat("head size ", head_size(),
                                ": the rotary kernels take heads of at most 512 channels"));
  }
  // The kernels take int dimensions: 3·C (the QKV width) and 4·C (the default F) must fit, and so
  // must the element count of the largest matrix, which OpenBLAS indexes with int strides.
  const int64_t widest =
      std::max<int64_t>({3 * d_model, 4 * d_model, (heads + 2 * kv()) * head_size(), d_ff, vocab});
  if (widest > INT_MAX / 4) {
    return Invalid(absl::StrCat("a dimension of ", widest, " is too large (", DebugString(), ")"));
  }
  const int64_t largest_matrix = std::max<int64_t>(vocab * d_model, ff() * d_model);
  if (largest_matrix > INT_MAX) {
    return Invalid(absl::StrCat("a weight matrix of ", largest_matrix, " elements is too large (",
                                DebugString(), ")"));
  }
  return absl::OkStatus();
}

std::string ModelConfig::DebugString() const {
  std::string text = absl::StrCat("layers=", layers, " heads=", heads, " d_model=", d_model,
                                  " d_ff=", ff(), " vocab=", vocab, " max_seq_len=", max_seq_len,
                                  tied_embeddings ? " tied" : " untied");
  if (kv() != heads) absl::StrAppend(&text, " kv_heads=", kv());
  if (head_dim > 0 && head_dim * heads != d_model) absl::StrAppend(&text, " head_dim=", head_dim);
  const ModelConfig gpt;
  if (norm != gpt.norm) absl::StrAppend(&text, " norm=", std::string(NormKindName(norm)));
  if (norm_eps != gpt.norm_eps) absl::StrAppend(&text, " norm_eps=", norm_eps);
  if (mlp != gpt.mlp) absl::StrAppend(&text, " mlp=", std::string(MlpKindName(mlp)));
  if (positions != gpt.positions) {
    absl::StrAppend(&text, " positions=", std::string(PositionKindName(positions)),
                    " rope_theta=", rope_theta);
    if (rope_scaling.enabled()) {
      absl::StrAppend(&text, " rope_scaling=llama3(factor=", rope_scaling.factor,
                      " low=", rope_scaling.low_freq_factor,
                      " high=", rope_scaling.high_freq_factor,
                      " original=", rope_scaling.original_max_positions, ")");
    }
  }
  if (!bias) absl::StrAppend(&text, " no-bias");
  return text;
}

absl::Status ModelConfig::CheckBatch(int B, int T) const {
  if (B < 1 || T < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch B=", B, " T=", T, ": both must be >= 1"));
  }
  if (T > max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence length T=", T, " is past the position table (max_seq_len ", max_seq_len, ")"));
  }
  // The kernels index rows with int, and the logits (B·T·V) are the largest activation.
  const int64_t rows = int64_t{B} * T;
  if (rows * std::max(vocab, 4 * d_model) > (int64_t{1} << 40) || rows > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("batch B=", B, " T=", T, " is too large"));
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::CheckTokens(std::span<const int32_t> tokens, int B, int T) const {
  RETURN_IF_ERROR(CheckBatch(B, T));
  if (static_cast<int64_t>(tokens.size()) != int64_t{B} * T) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: ", tokens.size(), " values for a batch of B=", B, " T=", T));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("tokens: token ", tokens[i], " at position ",
                                                     i, " is outside the vocabulary [0, ", vocab,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::CheckTargets(std::span<const int32_t> targets, int B, int T) const {
  if (static_cast<int64_t>(targets.size()) != int64_t{B} * T) {
    return absl::InvalidArgumentError(
        absl::StrCat("targets: ", targets.size(), " values for a batch of B=", B, " T=", T));
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("target ", targets[i], " at position ", i,
                                                     " is outside the vocabulary [0, ", vocab,
                                                     ") (negative targets are ignored)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardline::model
