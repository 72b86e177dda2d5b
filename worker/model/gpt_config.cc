#include "worker/model/gpt_config.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

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

}  // namespace shardline::model
