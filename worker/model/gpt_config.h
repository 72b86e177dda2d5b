// The shape of a GPT-2-style decoder: what every other piece of worker/model/ is sized by.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"

namespace shardline::model {

struct GptConfig {
  int layers = 0;
  int heads = 0;
  int d_model = 0;      // C; every head has d_model / heads channels
  int d_ff = 0;         // F, the MLP's hidden width; 0 means 4·d_model, as GPT-2
  int vocab = 0;        // V
  int max_seq_len = 0;  // rows of the position table wpe; the longest sequence Forward accepts
  // The output head reuses wte (GPT-2). When false the model has its own lm_head.w (V,C).
  bool tied_embeddings = true;

  // F with the default resolved.
  int ff() const { return d_ff > 0 ? d_ff : 4 * d_model; }
  int head_size() const { return heads > 0 ? d_model / heads : 0; }

  // OK, or InvalidArgument naming the field and the numbers ("d_model 100 is not divisible by
  // heads 3"). Also rejects sizes whose products would not fit the kernels' int dimensions.
  absl::Status Validate() const;

  // "layers=2 heads=4 d_model=16 d_ff=64 vocab=32 max_seq_len=8 tied"
  std::string DebugString() const;

  // OK when a batch of B sequences of T tokens can run: B, T >= 1, T within the position table,
  // and the largest activation (the logits) within the kernels' sizes. InvalidArgument otherwise.
  absl::Status CheckBatch(int B, int T) const;
  // The checks every model makes of a batch before any work (the kernels trust their indices):
  // CheckBatch, B·T tokens each in [0, vocab); B·T targets, each negative (the position is
  // ignored) or below vocab. InvalidArgument naming the count or the first bad position.
  absl::Status CheckTokens(std::span<const int32_t> tokens, int B, int T) const;
  absl::Status CheckTargets(std::span<const int32_t> targets, int B, int T) const;
};

}  // namespace shardline::model
