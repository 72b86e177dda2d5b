// A small checkpoint for tests that serve or generate text as a user would: a Hugging Face folder
// of a 2-layer GPT whose greedy text is plain ASCII that still depends on the context.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/gpt2_hf_export.h"
#include "model/tensor_table.h"

namespace shardline::test_support {

// The model's context, in tokens.
inline constexpr int kTinyAsciiGptContext = 64;

// Writes the model into `dir` and returns `dir`. Fixed pseudo-random weights, vocab 257 (the byte
// tokenizer's). Only the rows of 'a'..'z' and ' ' in the tied embedding are non-zero and lean
// positive, and the final LayerNorm's bias is positive: every logit of another token is 0, below
// theirs (all but surely), so the greedy text is 'a'..'z' and spaces, one byte a token, and never
// the end-of-text token.
inline std::string ExportTinyAsciiGpt(const std::string& dir) {
  checkpoint::Gpt2Weights weights;
  weights.config = {.layers = 2,
                    .heads = 2,
                    .d_model = 16,
                    .d_ff = 32,
                    .vocab = 257,
                    .max_seq_len = kTinyAsciiGptContext,
                    .tied_embeddings = true};
  uint64_t state = 12345;
  auto next = [&state] {  // uniform in [-0.5, 0.5)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((state >> 11) * (1.0 / 9007199254740992.0)) - 0.5f;
  };
  for (const model::TensorRow& spec : model::ModelRows(weights.config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    std::vector<float> values(n);
    for (float& v : values) v = 0.6f * next();
    weights.tensors[spec.name] = {spec.shape, std::move(values)};
  }
  for (float& v : weights.tensors["lnf.b"].values) v = 0.3f;
  for (float& v : weights.tensors["lnf.w"].values) v *= 4.0f;  // the context shows through
  std::vector<float>& wte = weights.tensors["wte"].values;
  for (int64_t token = 0; token < 257; ++token) {
    const bool speaks = (token >= 'a' && token <= 'z') || token == ' ';
    for (int64_t c = 0; c < 16; ++c) {
      float& v = wte[token * 16 + c];
      v = speaks ? 0.5f + v : 0.0f;
    }
  }
  const absl::Status status = checkpoint::ExportHfGpt2(weights, dir);
  EXPECT_TRUE(status.ok()) << status;
  return dir;
}

}  // namespace shardline::test_support
