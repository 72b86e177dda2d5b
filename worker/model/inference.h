// Autoregressive inference: token sampling, and Generate (greedy, or temperature with top-k and
// top-p) of one sequence with the whole model's inference weights (one rank: a checkpoint's
// ShardWeights at tp = pp = 1), through the serving engine's paged KV-cache forward
// (paged_inference.h) on a backend.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/tensor.h"
#include "worker/model/paged_inference.h"

namespace shardline::model {

struct SamplingOptions {
  // <= 0 picks the most likely token (greedy, first on ties); otherwise logits are divided by it
  // and a token drawn from their softmax.
  float temperature = 0.0f;
  // With temperature > 0: draw only among the k most likely tokens; 0 means all.
  int top_k = 0;
  // With temperature > 0: then only among the most likely of those whose probabilities (at the
  // temperature, renormalised over the top k) add up to at least top_p (nucleus sampling; the
  // most likely token always stays). In (0, 1]; 1 keeps them all.
  float top_p = 1.0f;
  // The draws are a pure function of (seed, index of the generated token).
  uint64_t seed = 0;
};

// The token chosen from `logits` (V) for the `draw`-th generated token. InvalidArgument for a
// negative top_k, a top_p outside (0, 1], or empty logits. With temperature > 0, top_k 0 (or
// >= V) and top_p 1 the draw walks the vocabulary in id order; otherwise it walks the candidates
// by descending logit, ties by id.
absl::StatusOr<int32_t> SampleToken(std::span<const float> logits, const SamplingOptions& options,
                                    uint64_t draw);

// The uniform number in (0, 1) that the `draw`-th token of a request with `seed` is drawn with.
double SamplingUniform(uint64_t seed, uint64_t draw);

// The index in `values` (candidate logits, best first, not empty) that `uniform` picks from
// their softmax at `temperature` (> 0), after keeping only the nucleus of `top_p`: the shortest
// prefix whose weights reach top_p of `total` (the weights' sum over every candidate the
// distribution had, each weighed against values[0]; a negative total means the sum of `values`'
// own weights). SampleToken's draw among sorted candidates.
int DrawAmongCandidates(std::span<const float> values, float temperature, float top_p, double total,
                        double uniform);
// The weight SampleToken gives a logit: exp((logit - max) / temperature), in double.
double SamplingWeight(float logit, float max, float temperature);

struct GenerateOptions {
  int max_new_tokens = 16;
  SamplingOptions sampling;
  // false re-runs the forward over the whole sequence for every token (every key and value
  // computed anew): slower, and the reference the cache's reuse is tested against.
  bool use_kv_cache = true;
};

// The `max_new_tokens` tokens generated after `prompt` (not including it). InvalidArgument, before
// any work, for an empty prompt, tokens outside the vocabulary, or a prompt plus new tokens that
// would need more than max_seq_len positions.
// InvalidArgument too for weights cut for more than one rank.
absl::StatusOr<std::vector<int32_t>> Generate(const InferenceWeights& weights,
                                              kernels::Backend& backend,
                                              std::span<const int32_t> prompt,
                                              const GenerateOptions& options);

// Receives each generated token as soon as it is chosen, before the next one is computed; returns
// false to stop generating (the token just given still counts as generated).
using TokenSink = std::function<bool(int32_t token)>;

// Generate, one token at a time: `sink` sees every token as it is chosen, so a server can stream
// it and stop early (a cancelled request, a stop sequence). Returns how many tokens the sink was
// given. The same checks, before any work, and the same tokens as Generate (which is built on it).
absl::StatusOr<int> GenerateStreaming(const InferenceWeights& weights, kernels::Backend& backend,
                                      std::span<const int32_t> prompt,
                                      const GenerateOptions& options, const TokenSink& sink);

}  // namespace shardline::model
