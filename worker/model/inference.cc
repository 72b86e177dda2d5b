#include "worker/model/inference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/vector_math.h"
#include "worker/model/counter_rng.h"
#include "worker/model/paged_inference.h"

namespace shardline::model {
namespace cpu = kernels::cpu;

namespace {

// A stream id of its own, so sampling draws never coincide with initialisation draws.
constexpr uint64_t kSamplingStream = NameHash("sampling");

}  // namespace

double SamplingUniform(uint64_t seed, uint64_t draw) {
  return UniformOpen(Hash3(seed, kSamplingStream, draw));
}

double SamplingWeight(float logit, float max, float temperature) {
  return std::exp((double{logit} - double{max}) / temperature);
}

absl::StatusOr<int32_t> SampleToken(std::span<const float> logits, const SamplingOptions& options,
                                    uint64_t draw) {
  if (logits.empty()) return absl::InvalidArgumentError("SampleToken: empty logits");
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", options.top_k));
  }
  if (!(options.top_p > 0.0f && options.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", options.top_p));
  }
  const int V = static_cast<int>(logits.size());
  if (!(options.temperature > 0.0f)) {
    return static_cast<int32_t>(kernels::cpu::ArgMax(logits.data(), V));
  }
  const bool whole = options.top_k == 0 || options.top_k >= V;
  const float max = logits[kernels::cpu::ArgMax(logits.data(), V)];
  if (whole && options.top_p == 1.0f) {
    // The whole vocabulary, in id order: no sort, and the order a vocab-parallel sampler can
    // follow rank by rank.
    std::vector<double> weights(V);
    double sum = 0.0;
    for (int v = 0; v < V; ++v) {
      weights[v] = SamplingWeight(logits[v], max, options.temperature);
      sum += weights[v];
    }
    const double u = SamplingUniform(options.seed, draw) * sum;
    double acc = 0.0;
    for (int v = 0; v < V; ++v) {
      acc += weights[v];
      if (u < acc) return v;
    }
    return V - 1;  // u rounded past the last partial sum
  }
  // Candidates by descending logit, ties by ascending id, so the order (and the draw) is fixed.
  const int k = whole ? V : options.top_k;
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<float> values(k);
  for (int i = 0; i < k; ++i) values[i] = logits[ids[i]];
  // The nucleus of the whole vocabulary is cut against its total in id order (what the
  // vocab-parallel sampler adds up); among the top k, against theirs.
  double total = -1.0;
  if (whole) {
    total = 0.0;
    for (int v = 0; v < V; ++v) total += SamplingWeight(logits[v], max, options.temperature);
  }
  return ids[DrawAmongCandidates(values, options.temperature, options.top_p, total,
                                 SamplingUniform(options.seed, draw))];
}

int DrawAmongCandidates(std::span<const float> values, float temperature, float top_p, double total,
                        double uniform) {
  int k = static_cast<int>(values.size());
  const float max = values[0];
  std::vector<double> weights(k);
  double sum = 0.0;
  for (int i = 0; i < k; ++i) {
    weights[i] = SamplingWeight(values[i], max, temperature);
    sum += weights[i];
  }
  if (top_p < 1.0f) {
    const double target = double{top_p} * (total < 0.0 ? sum : total);
    double acc = 0.0;
    for (int i = 0; i < k; ++i) {
      acc += weights[i];
      if (acc >= target) {
        k = i + 1;
        sum = acc;
        break;
      }
    }
  }
  const double u = uniform * sum;
  double acc = 0.0;
  for (int i = 0; i < k; ++i) {
    acc += weights[i];
    if (u < acc) return i;
  }
  return k - 1;  // u rounded past the last partial sum
}

absl::StatusOr<int> GenerateStreaming(const InferenceWeights& weights, kernels::Backend& backend,
                                      std::span<const int32_t> prompt,
                                      const GenerateOptions& options, const TokenSink& sink) {
  const ModelConfig& c = weights.config;
  if (weights.tp_size != 1 || weights.pp_size != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: weights of tp ", weights.tp_size, " pp ", weights.pp_size,
                     " (one rank generates with the whole model; a sharded one serves)"));
  }
  if (prompt.empty()) return absl::InvalidArgumentError("Generate: the prompt is empty");
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: max_new_tokens must be >= 0, got ", options.max_new_tokens));
  }
  if (options.sampling.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: top_k must be >= 0, got ", options.sampling.top_k));
  }
  if (!(options.sampling.top_p > 0.0f && options.sampling.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: top_p must be in (0, 1], got ", options.sampling.top_p));
  }
  RETURN_IF_ERROR(
      Annotate(cpu::ValidateTokens(prompt.data(), prompt.size(), c.vocab), "Generate: prompt"));
  // The last new token is returned, never fed, so it needs no position.
  const int64_t positions = static_cast<int64_t>(prompt.size()) + options.max_new_tokens - 1;
  if (positions > c.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Generate: a prompt of ", prompt.size(), " tokens plus ", options.max_new_tokens,
        " new tokens needs ", positions, " positions, past max_seq_len ", c.max_seq_len));
  }
  if (options.max_new_tokens == 0) return 0;

  // The serving engine's paged forward with one sequence, its cache blocks in order. With the
  // cache: the whole prompt in one step, then one token per step. Without: every step runs the
  // whole sequence again from position 0 (writing every key and value anew), the reference the
  // cache's reuse is tested against.
  const int block_size = 16;
  const int blocks = (c.max_seq_len + block_size - 1) / block_size;
  ASSIGN_OR_RETURN(auto paged,
                   PagedGptForward::Create(weights,
                                           {.num_blocks = blocks,
                                            .block_size = block_size,
                                            .max_tokens_per_step = static_cast<int>(c.max_seq_len),
                                            .max_seqs_per_step = 1},
                                           backend));
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> sequence(prompt.begin(), prompt.end());
  std::vector<int32_t> tokens = sequence;  // this step's
  std::vector<int32_t> at(tokens.size());  // their positions
  std::iota(at.begin(), at.end(), 0);
  for (int i = 0; i < options.max_new_tokens; ++i) {
    const std::vector<int32_t> token_seq(tokens.size(), 0);
    const int32_t last_row = static_cast<int32_t>(tokens.size()) - 1;
    ASSIGN_OR_RETURN(std::span<const float> logits,
                     paged->Forward({.tokens = tokens,
                                     .positions = at,
                                     .token_seq = token_seq,
                                     .block_tables = table,
                                     .num_seqs = 1,
                                     .max_blocks_per_seq = blocks,
                                     .logit_rows = std::span(&last_row, 1)}));
    ASSIGN_OR_RETURN(int32_t next, SampleToken(logits, options.sampling, i));
    if (!sink(next)) return i + 1;
    sequence.push_back(next);
    if (options.use_kv_cache) {
      at = {at.back() + 1};
      tokens = {next};
    } else {
      tokens = sequence;
      at.resize(sequence.size());
      std::iota(at.begin(), at.end(), 0);
    }
  }
  return options.max_new_tokens;
}

absl::StatusOr<std::vector<int32_t>> Generate(const InferenceWeights& weights,
                                              kernels::Backend& backend,
                                              std::span<const int32_t> prompt,
                                              const GenerateOptions& options) {
  std::vector<int32_t> out;
  out.reserve(std::max(options.max_new_tokens, 0));
  RETURN_IF_ERROR(GenerateStreaming(weights, backend, prompt, options, [&out](int32_t token) {
                    out.push_back(token);
                    return true;
                  }).status());
  return out;
}

}  // namespace shardline::model
