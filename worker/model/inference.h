// Autoregressive inference over a GptModel: a session with a KV cache, token sampling, and
// Generate (greedy, or temperature with top-k).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/model/gpt.h"

namespace shardline::model {

// Decodes one sequence (batch 1) position by position, keeping every layer's keys and values so
// that a step costs one token's worth of work plus attention over the cache.
//
// Prefill on an empty session runs the model's batched forward (the same kernels as training) and
// copies each layer's keys and values out of its qkv activations. Step has its own attention loop:
// the attention kernel computes T queries against the same T keys from position 0, while a decode
// step is one query against pos+1 cached keys; feeding the kernel would mean re-packing the whole
// cache into its (B,T,3,NH,HS) layout on every token. Everything else in Step is the same kernels
// with one row. The logits of both paths equal the full forward's (tested within 1e-5).
//
// The model must outlive the session and its parameters must not change while it is used (the
// cached keys and values were computed with them). Not thread-safe.
class InferenceSession {
 public:
  static absl::StatusOr<InferenceSession> Create(const GptModel& model);

  // Move-only: the scratch pointers below point into buffers a copy would share.
  InferenceSession(InferenceSession&&) = default;
  InferenceSession& operator=(InferenceSession&&) = default;
  InferenceSession(const InferenceSession&) = delete;
  InferenceSession& operator=(const InferenceSession&) = delete;

  // Feeds `tokens` and returns the logits (V) for the token after the last one. On an empty
  // session this is one batched forward; otherwise it steps token by token. InvalidArgument for an
  // empty list or a token outside the vocabulary, OutOfRange when the cache would pass max_seq_len;
  // nothing is fed then.
  absl::StatusOr<std::span<const float>> Prefill(std::span<const int32_t> tokens);
  // Feeds one token at position(); returns the logits (V) for the next one. Same errors.
  absl::StatusOr<std::span<const float>> Step(int32_t token);

  // Tokens in the cache: the position the next token will take.
  int position() const { return position_; }
  // Empties the cache (the buffers stay allocated).
  void Reset() { position_ = 0; }

 private:
  explicit InferenceSession(const GptModel& model) : model_(&model) {}
  absl::Status CheckRoom(int64_t count) const;
  float* KCache(int layer, int pos);
  float* VCache(int layer, int pos);

  const GptModel* model_;
  kernels::Tensor cache_;    // keys then values: 2 × (layers, max_seq_len, C), heads side by side
  kernels::Tensor scratch_;  // one token's activations, carved below
  float* x_ = nullptr;       // (C): the residual stream
  float* ln_ = nullptr;      // (C)
  float* stats_ = nullptr;   // (2): LayerNorm mean and rstd, unused afterwards
  float* qkv_ = nullptr;     // (3C)
  float* atty_ = nullptr;    // (C)
  float* proj_ = nullptr;    // (C)
  float* fch_ = nullptr;     // (F)
  float* fch_gelu_ = nullptr;  // (F)
  float* scores_ = nullptr;  // (max_seq_len)
  float* logits_ = nullptr;  // (V)
  int position_ = 0;
};

struct SamplingOptions {
  // <= 0 picks the most likely token (greedy, first on ties); otherwise logits are divided by it
  // and a token drawn from their softmax.
  float temperature = 0.0f;
  // With temperature > 0: draw only among the k most likely tokens; 0 means all.
  int top_k = 0;
  // The draws are a pure function of (seed, index of the generated token).
  uint64_t seed = 0;
};

// The token chosen from `logits` (V) for the `draw`-th generated token. InvalidArgument for a
// negative top_k or empty logits.
absl::StatusOr<int32_t> SampleToken(std::span<const float> logits, const SamplingOptions& options,
                                    uint64_t draw);

struct GenerateOptions {
  int max_new_tokens = 16;
  SamplingOptions sampling;
  // false re-runs the full forward over the whole sequence for every token: slower, and the
  // reference the KV-cache path is tested against.
  bool use_kv_cache = true;
};

// The `max_new_tokens` tokens generated after `prompt` (not including it). InvalidArgument, before
// any work, for an empty prompt, tokens outside the vocabulary, or a prompt plus new tokens that
// would need more than max_seq_len positions.
absl::StatusOr<std::vector<int32_t>> Generate(const GptModel& model,
                                              std::span<const int32_t> prompt,
                                              const GenerateOptions& options);

// Receives each generated token as soon as it is chosen, before the next one is computed; returns
// false to stop generating (the token just given still counts as generated).
using TokenSink = std::function<bool(int32_t token)>;

// Generate, one token at a time: `sink` sees every token as it is chosen, so a server can stream
// it and stop early (a cancelled request, a stop sequence). Returns how many tokens the sink was
// given. The same checks, before any work, and the same tokens as Generate (which is built on it).
absl::StatusOr<int> GenerateStreaming(const GptModel& model, std::span<const int32_t> prompt,
                                      const GenerateOptions& options, const TokenSink& sink);

}  // namespace shardline::model
