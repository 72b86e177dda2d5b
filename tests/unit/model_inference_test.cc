// KV-cache inference: generation with the cache equals generation without it. The paged forward of
// a batched serving step (paged_inference.h) gives the full forward's logits too, for sequences
// interleaved over steps in chunks, with scattered cache blocks; and it refuses a bad step naming
// what is wrong.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/support/test_models.h"
#include "tests/support/whole_forward.h"
#include "worker/model/inference.h"
#include "worker/model/paged_inference.h"

namespace shardline::model {
namespace {

using ::testing::HasSubstr;

constexpr float kLogitTolerance = 1e-5f;

ModelConfig SmallConfig() {
  ModelConfig c;
  c.layers = 2;
  c.heads = 4;
  c.d_model = 32;
  c.vocab = 48;
  c.max_seq_len = 24;
  return c;
}

// The same sizes as a Llama: 4 query heads over 2 key/value heads (the cache holds 2), rotary
// positions with Llama 3's rescaling (its original context shorter than the test's positions).
ModelConfig SmallLlama() {
  ModelConfig c = ModelConfig::Llama(SmallConfig());
  c.kv_heads = 2;
  c.rope_theta = 500000.0;
  c.rope_scaling = {.factor = 8.0, .original_max_positions = 8};
  return c;
}

// The cached forward's tests, for either family.
class FamilyTest : public ::testing::TestWithParam<bool> {
 protected:
  ModelConfig Config() const { return GetParam() ? SmallLlama() : SmallConfig(); }
};

// A hotter init than GPT-2's (tests/support/test_models.h says why).
ModelParams HotModel(const ModelConfig& config, uint32_t seed) {
  return testing::NoisyGpt2Init(config, seed, seed, 0.2f);
}

using testing::RandomTokens;

void ExpectRowClose(std::span<const float> got, const float* want, int V, const std::string& what) {
  ASSERT_EQ(got.size(), static_cast<size_t>(V)) << what;
  int misses = 0;
  for (int v = 0; v < V && misses < 5; ++v) {
    if (!(std::fabs(got[v] - want[v]) <= kLogitTolerance)) {
      ADD_FAILURE() << what << " logit " << v << ": cached " << got[v] << ", full " << want[v];
      ++misses;
    }
  }
}

TEST_P(FamilyTest, GreedyGenerationWithAndWithoutCacheAgree) {
  kernels::CpuAllocator allocator;
  const ModelConfig c = Config();
  const ModelParams model = HotModel(c, 8);
  kernels::cpu::CpuBackend backend(allocator);
  const std::vector<int32_t> prompt = RandomTokens(5, c.vocab, 9);
  GenerateOptions options;
  options.max_new_tokens = c.max_seq_len - 5 + 1;  // exactly fills the positions
  options.use_kv_cache = true;
  auto cached = Generate(InferenceWeights::Of(model), backend, prompt, options);
  ASSERT_TRUE(cached.ok()) << cached.status();
  options.use_kv_cache = false;
  auto uncached = Generate(InferenceWeights::Of(model), backend, prompt, options);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  EXPECT_EQ(*cached, *uncached);
  EXPECT_EQ(cached->size(), static_cast<size_t>(options.max_new_tokens));

  // And both are the greedy tokens of the training forward's layers over the whole sequence.
  std::vector<int32_t> sequence = prompt;
  for (size_t k = 0; k < cached->size(); ++k) {
    const int T = static_cast<int>(sequence.size());
    auto logits = testing::WholeForwardLogits(model, backend, sequence, 1, T);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const auto last = logits->begin() + int64_t{T - 1} * c.vocab;
    const auto best = static_cast<int32_t>(std::max_element(last, last + c.vocab) - last);
    EXPECT_EQ((*cached)[k], best) << "token " << k;
    sequence.push_back(best);
  }
}

TEST(InferenceTest, SampledGenerationIsSeededAndRespectsTopK) {
  kernels::CpuAllocator allocator;
  const ModelConfig c = SmallConfig();
  const ModelParams model = HotModel(c, 10);
  kernels::cpu::CpuBackend backend(allocator);
  const std::vector<int32_t> prompt = {1, 2, 3};
  GenerateOptions options;
  options.max_new_tokens = 12;
  options.sampling.temperature = 1.0f;
  options.sampling.top_k = 5;
  options.sampling.seed = 42;
  const auto a = Generate(InferenceWeights::Of(model), backend, prompt, options).value();
  const auto b = Generate(InferenceWeights::Of(model), backend, prompt, options).value();
  EXPECT_EQ(a, b);
  options.use_kv_cache = false;
  EXPECT_EQ(Generate(InferenceWeights::Of(model), backend, prompt, options).value(), a);
  options.use_kv_cache = true;
  options.sampling.seed = 43;
  EXPECT_NE(Generate(InferenceWeights::Of(model), backend, prompt, options).value(), a);

  // top_k = 1 is greedy whatever the temperature.
  options.sampling.top_k = 1;
  options.sampling.temperature = 5.0f;
  const auto top1 = Generate(InferenceWeights::Of(model), backend, prompt, options).value();
  options.sampling = SamplingOptions{};
  EXPECT_EQ(top1, Generate(InferenceWeights::Of(model), backend, prompt, options).value());

  // Every draw lies among the k largest logits.
  std::vector<float> logits(c.vocab);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  for (float& l : logits) l = dist(rng);
  std::vector<float> sorted = logits;
  std::sort(sorted.rbegin(), sorted.rend());
  SamplingOptions s{.temperature = 2.0f, .top_k = 3, .seed = 7};
  for (uint64_t draw = 0; draw < 200; ++draw) {
    const int32_t token = SampleToken(logits, s, draw).value();
    EXPECT_GE(logits[token], sorted[2]);
  }
}

TEST(InferenceTest, GenerateRejectsBadRequestsBeforeAnyWork) {
  kernels::CpuAllocator allocator;
  const ModelConfig c = SmallConfig();
  const ModelParams model = HotModel(c, 1);
  kernels::cpu::CpuBackend backend(allocator);
  GenerateOptions options;
  options.max_new_tokens = 20;
  auto r = Generate(InferenceWeights::Of(model), backend, RandomTokens(10, c.vocab, 1), options);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("a prompt of 10 tokens plus 20 new tokens needs 29 positions, past "
                        "max_seq_len 24"));
  EXPECT_EQ(Generate(InferenceWeights::Of(model), backend, {}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad = {1, 99};
  EXPECT_THAT(
      std::string(Generate(InferenceWeights::Of(model), backend, bad, options).status().message()),
      HasSubstr("token 99 at position 1"));
  options.sampling.top_k = -1;
  EXPECT_THAT(
      std::string(Generate(InferenceWeights::Of(model), backend, std::span(bad).first(1), options)
                      .status()
                      .message()),
      HasSubstr("top_k"));
}

// Nucleus sampling on a known distribution (0.5, 0.3, 0.15, 0.05): top_p 0.75 keeps the first
// two (0.8 >= 0.75) in the ratio 5:3; a tiny top_p keeps the best only; top_p after top_k
// renormalises over the k kept.
TEST(InferenceTest, TopPKeepsTheNucleus) {
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                     std::log(0.3f)};
  std::vector<int> counts(4, 0);
  const int draws = 20000;
  for (int d = 0; d < draws; ++d) {
    auto t = SampleToken(logits, {.temperature = 1.0f, .top_p = 0.75f, .seed = 4}, d);
    ASSERT_TRUE(t.ok()) << t.status();
    ++counts[*t];
  }
  EXPECT_EQ(counts[0] + counts[2], 0);
  EXPECT_NEAR(double(counts[1]) / draws, 0.625, 0.015);
  for (int d = 0; d < 200; ++d) {
    EXPECT_EQ(*SampleToken(logits, {.temperature = 1.0f, .top_p = 1e-6f, .seed = 4}, d), 1);
  }
  // top_k 3 keeps (0.5, 0.3, 0.15), renormalised to (0.526, 0.316, 0.158): top_p 0.9 needs all
  // three (the first two make 0.842), so token 0 appears; token 2 never.
  counts.assign(4, 0);
  for (int d = 0; d < draws; ++d) {
    ++counts[*SampleToken(logits, {.temperature = 1.0f, .top_k = 3, .top_p = 0.9f, .seed = 4}, d)];
  }
  EXPECT_EQ(counts[2], 0);
  EXPECT_NEAR(double(counts[0]) / draws, 0.15 / 0.95, 0.015);
  EXPECT_EQ(SampleToken(logits, {.temperature = 1.0f, .top_p = 0.0f}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleToken(logits, {.temperature = 1.0f, .top_p = 1.5f}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Three sequences fed over four steps in chunks of different sizes (a chunked prefill, decodes,
// a sequence joining late), with their cache blocks scattered through the pool: every row's
// logits are the full forward's at that position of its sequence.
TEST_P(FamilyTest, PagedStepsOfInterleavedChunksGiveTheFullForwardsLogits) {
  kernels::CpuAllocator allocator;
  const ModelConfig c = Config();
  const ModelParams model = HotModel(c, 8);
  kernels::cpu::CpuBackend backend(allocator);
  const std::vector<int> lengths = {24, 11, 5};
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<float>> full;
  for (size_t s = 0; s < lengths.size(); ++s) {
    seqs.push_back(RandomTokens(lengths[s], c.vocab, 20 + s));
    auto logits = testing::WholeForwardLogits(model, backend, seqs[s], 1, lengths[s]);
    ASSERT_TRUE(logits.ok()) << logits.status();
    full.push_back(std::move(*logits));
  }
  const int block_size = 4, max_blocks = 6;  // 24 positions
  auto paged = PagedGptForward::Create(InferenceWeights::Of(model),
                                       {.num_blocks = 20,
                                        .block_size = block_size,
                                        .max_tokens_per_step = 16,
                                        .max_seqs_per_step = 16},
                                       backend)
                   .value();
  // Blocks handed out out of order and interleaved between the sequences.
  const std::vector<int32_t> tables = {17, 3,  9, 0, 12, 5,   // sequence 0
                                       2,  19, 8, 0, 0,  0,   // sequence 1 (3 blocks)
                                       11, 6,  0, 0, 0,  0};  // sequence 2 (2 blocks)
  // Each step: (sequence, first position, count).
  struct Chunk {
    int seq, start, count;
  };
  const std::vector<std::vector<Chunk>> steps = {
      {{0, 0, 7}, {1, 0, 3}},
      {{0, 7, 9}, {1, 3, 1}, {2, 0, 5}},
      {{1, 4, 7}, {0, 16, 1}},
      {{0, 17, 7}},
  };
  std::vector<int> done(lengths.size(), 0);
  for (size_t k = 0; k < steps.size(); ++k) {
    std::vector<int32_t> tokens, positions, token_seq, rows;
    for (const Chunk& ch : steps[k]) {
      for (int p = ch.start; p < ch.start + ch.count; ++p) {
        rows.push_back(static_cast<int32_t>(tokens.size()));
        tokens.push_back(seqs[ch.seq][p]);
        positions.push_back(p);
        token_seq.push_back(ch.seq);
      }
      done[ch.seq] += ch.count;
    }
    auto logits = paged->Forward({.tokens = tokens,
                                  .positions = positions,
                                  .token_seq = token_seq,
                                  .block_tables = tables,
                                  .num_seqs = 3,
                                  .max_blocks_per_seq = max_blocks,
                                  .logit_rows = rows});
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->size(), rows.size() * c.vocab);
    for (size_t r = 0; r < rows.size(); ++r) {
      const int seq = token_seq[r], pos = positions[r];
      ExpectRowClose(logits->subspan(r * c.vocab, c.vocab),
                     full[seq].data() + int64_t{pos} * c.vocab, c.vocab,
                     "step " + std::to_string(k) + " sequence " + std::to_string(seq) +
                         " position " + std::to_string(pos));
    }
  }
  EXPECT_EQ(done, lengths);
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Llama") : std::string("Gpt2");
                         });

TEST(PagedInferenceTest, RefusesABadStepNamingWhatIsWrong) {
  kernels::CpuAllocator allocator;
  const ModelConfig c = SmallConfig();
  const ModelParams model = HotModel(c, 9);
  kernels::cpu::CpuBackend backend(allocator);
  EXPECT_THAT(
      std::string(PagedGptForward::Create(
                      InferenceWeights::Of(model),
                      {.num_blocks = 0, .max_tokens_per_step = 4, .max_seqs_per_step = 2}, backend)
                      .status()
                      .message()),
      HasSubstr("num_blocks"));
  auto paged =
      PagedGptForward::Create(
          InferenceWeights::Of(model),
          {.num_blocks = 4, .block_size = 4, .max_tokens_per_step = 4, .max_seqs_per_step = 2},
          backend)
          .value();
  std::vector<int32_t> tokens = {1, 2}, positions = {0, 1}, token_seq = {0, 0}, rows = {1};
  std::vector<int32_t> tables = {3, 1};
  auto step = [&] {
    return paged->Forward({.tokens = tokens,
                           .positions = positions,
                           .token_seq = token_seq,
                           .block_tables = tables,
                           .num_seqs = 1,
                           .max_blocks_per_seq = 2,
                           .logit_rows = rows});
  };
  ASSERT_TRUE(step().ok()) << step().status();
  auto refused = [&](const std::string& needle) {
    auto result = step();
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(needle));
  };
  tokens[1] = c.vocab;
  refused("outside the vocabulary");
  tokens[1] = 2;
  positions[1] = c.max_seq_len;
  refused("position 24");
  positions[1] = 5;
  tables[1] = 4;
  refused("block 1 is 4");
  tables[1] = 1;
  positions[1] = 9;
  refused("needs block 2");
  positions[1] = 1;
  rows = {2};
  refused("logit row 2");
  rows = {1};
  token_seq[0] = 1;
  refused("of sequence 1");
  token_seq[0] = 0;
  tokens = {1, 2, 3, 4, 5};
  positions = {0, 1, 2, 3, 4};
  token_seq = {0, 0, 0, 0, 0};
  refused("5 tokens, more than the 4");
}

}  // namespace
}  // namespace shardline::model
