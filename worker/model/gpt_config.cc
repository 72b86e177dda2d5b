#include "worker/model/gpt_config.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/embedding.h"

namespace shardline::model {
namespace {

absl::Status Positive(const char* field, int value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("GptConfig: ", field, " must be >= 1, got ", value));
}

}  // namespace

absl::Status GptConfig::Validate() const {
  for (auto [field, value] : {std::pair{"layers", layers}, std::pair{"heads", heads},
                              std::pair{"d_model", d_model}, std::pair{"vocab", vocab},
                              std::pair{"max_seq_len", max_seq_len}}) {
    if (absl::Status s = Positive(field, value); !s.ok()) return s;
  }
  if (d_ff < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptConfig: d_ff must be >= 1 (or 0 for 4·d_model), got ", d_ff));
  }
  if (d_model % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig: d_model ", d_model,
                                                   " is not divisible by heads ", heads));
  }
  // The kernels take int dimensions: 3·C (the QKV width) and 4·C (the default F) must fit, and so
  // must the element count of the largest matrix, which OpenBLAS indexes with int strides.
  const int64_t widest = std::max<int64_t>({int64_t{3} * d_model, int64_t{4} * d_model,
                                            int64_t{d_ff}, int64_t{vocab}});
  if (widest > INT_MAX / 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptConfig: a dimension of ", widest, " is too large (", DebugString(), ")"));
  }
  const int64_t largest_matrix =
      std::max<int64_t>(int64_t{vocab} * d_model, int64_t{ff()} * d_model);
  if (largest_matrix > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig: a weight matrix of ", largest_matrix,
                                                   " elements is too large (", DebugString(), ")"));
  }
  return absl::OkStatus();
}

std::string GptConfig::DebugString() const {
  return absl::StrCat("layers=", layers, " heads=", heads, " d_model=", d_model, " d_ff=", ff(),
                      " vocab=", vocab, " max_seq_len=", max_seq_len,
                      tied_embeddings ? " tied" : " untied");
}

absl::Status GptConfig::CheckBatch(int B, int T) const {
  if (B < 1 || T < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch B=", B, " T=", T, ": both must be >= 1"));
  }
  if (T > max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("sequence length T=", T,
                                                   " is past the position table (max_seq_len ",
                                                   max_seq_len, ")"));
  }
  // The kernels index rows with int, and the logits (B·T·V) are the largest activation.
  const int64_t rows = int64_t{B} * T;
  if (rows * std::max(vocab, 4 * d_model) > (int64_t{1} << 40) || rows > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("batch B=", B, " T=", T, " is too large"));
  }
  return absl::OkStatus();
}

absl::Status GptConfig::CheckTokens(std::span<const int32_t> tokens, int B, int T) const {
  RETURN_IF_ERROR(CheckBatch(B, T));
  if (static_cast<int64_t>(tokens.size()) != int64_t{B} * T) {
    return absl::InvalidArgumentError(absl::StrCat("tokens: ", tokens.size(),
                                                   " values for a batch of B=", B, " T=", T));
  }
  return Annotate(kernels::cpu::ValidateTokens(tokens.data(), tokens.size(), vocab), "tokens");
}

absl::Status GptConfig::CheckTargets(std::span<const int32_t> targets, int B, int T) const {
  if (static_cast<int64_t>(targets.size()) != int64_t{B} * T) {
    return absl::InvalidArgumentError(absl::StrCat("targets: ", targets.size(),
                                                   " values for a batch of B=", B, " T=", T));
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
