// Models and batches the model tests share: random token ids, and GPT-2's initialisation with noise
// on top (a hotter model than GPT-2's init, whose logits lie within ~1e-2 of each other, so that a
// wrong position, cache row or shard shows in the logits and attention patterns).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "model/model_config.h"
#include "worker/model/model_params.h"

namespace shardline::testing {

// n ids uniform in [0, vocab), deterministic in `seed`.
inline std::vector<int32_t> RandomTokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = dist(rng);
  return out;
}

// ModelParams::Gpt2Init(config, init_seed) plus N(0, stddev) noise drawn from `noise_seed` on every
// parameter. Aborts the test binary on a config the engine refuses (a test's own constant).
inline model::ModelParams NoisyGpt2Init(const model::ModelConfig& config, uint64_t init_seed,
                                        uint32_t noise_seed, float stddev) {
  model::ModelParams params = model::ModelParams::Gpt2Init(config, init_seed).value();
  std::mt19937 rng(noise_seed);
  std::normal_distribution<float> noise(0.0f, stddev);
  for (float& p : params.values()) p += noise(rng);
  return params;
}

}  // namespace shardline::testing
