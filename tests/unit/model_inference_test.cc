// KV-cache inference: the cached path's logits equal the full forward's at every position, and
// generation with the cache equals generation without it.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/allocator.h"
#include "worker/model/gpt.h"
#include "worker/model/inference.h"

namespace shardline::model {
namespace {

using ::testing::HasSubstr;

constexpr float kLogitTolerance = 1e-5f;

GptConfig SmallConfig() {
  GptConfig c;
  c.layers = 2;
  c.heads = 4;
  c.d_model = 32;
  c.vocab = 48;
  c.max_seq_len = 24;
  return c;
}

// GPT-2's init gives logits within ~1e-2 of each other; a hotter random init makes the logits
// (and the attention patterns) vary enough that a wrong position or cache row would show.
std::unique_ptr<GptModel> HotModel(const GptConfig& config, kernels::Allocator& allocator,
                                   uint32_t seed) {
  auto model = GptModel::Create(config, allocator).value();
  model->InitGpt2(seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.2f);
  for (float& p : model->params()) p += noise(rng);
  return model;
}

std::vector<int32_t> RandomTokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = dist(rng);
  return out;
}

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

TEST(InferenceTest, CachedLogitsEqualTheFullForwardAtEveryPosition) {
  kernels::CpuAllocator allocator;
  const GptConfig c = SmallConfig();
  auto model = HotModel(c, allocator, 3);
  const int T = c.max_seq_len;
  const std::vector<int32_t> tokens = RandomTokens(T, c.vocab, 5);
  ASSERT_TRUE(model->ForwardLogits(tokens, 1, T).ok());
  const std::vector<float> full(model->Logits().begin(), model->Logits().end());

  // Prefill lengths 1 (Step does everything), a middle one, and T (Prefill does everything).
  for (int prefill : {1, 7, T}) {
    SCOPED_TRACE("prefill " + std::to_string(prefill));
    auto session = InferenceSession::Create(*model).value();
    auto logits = session.Prefill(std::span(tokens).first(prefill));
    ASSERT_TRUE(logits.ok()) << logits.status();
    ExpectRowClose(*logits, full.data() + int64_t{prefill - 1} * c.vocab, c.vocab,
                   "position " + std::to_string(prefill - 1));
    for (int t = prefill; t < T; ++t) {
      auto step = session.Step(tokens[t]);
      ASSERT_TRUE(step.ok()) << step.status();
      ExpectRowClose(*step, full.data() + int64_t{t} * c.vocab, c.vocab,
                     "position " + std::to_string(t));
    }
    EXPECT_EQ(session.position(), T);
    auto past = session.Step(0);
    EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(std::string(past.status().message()), HasSubstr("max_seq_len 24"));
  }
}

TEST(InferenceTest, PrefillAfterStepsStepsThroughTheCache) {
  kernels::CpuAllocator allocator;
  const GptConfig c = SmallConfig();
  auto model = HotModel(c, allocator, 4);
  const std::vector<int32_t> tokens = RandomTokens(10, c.vocab, 6);
  ASSERT_TRUE(model->ForwardLogits(tokens, 1, 10).ok());
  const std::vector<float> full(model->Logits().begin(), model->Logits().end());
  auto session = InferenceSession::Create(*model).value();
  ASSERT_TRUE(session.Prefill(std::span(tokens).first(4)).ok());
  auto logits = session.Prefill(std::span(tokens).subspan(4));
  ASSERT_TRUE(logits.ok());
  ExpectRowClose(*logits, full.data() + 9 * c.vocab, c.vocab, "position 9");
  session.Reset();
  EXPECT_EQ(session.position(), 0);
  EXPECT_EQ(session.Step(c.vocab).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session.Prefill({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InferenceTest, GreedyGenerationWithAndWithoutCacheAgree) {
  kernels::CpuAllocator allocator;
  const GptConfig c = SmallConfig();
  auto model = HotModel(c, allocator, 8);
  const std::vector<int32_t> prompt = RandomTokens(5, c.vocab, 9);
  GenerateOptions options;
  options.max_new_tokens = c.max_seq_len - 5 + 1;  // exactly fills the positions
  options.use_kv_cache = true;
  auto cached = Generate(*model, prompt, options);
  ASSERT_TRUE(cached.ok()) << cached.status();
  options.use_kv_cache = false;
  auto uncached = Generate(*model, prompt, options);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  EXPECT_EQ(*cached, *uncached);
  EXPECT_EQ(cached->size(), static_cast<size_t>(options.max_new_tokens));
}

TEST(InferenceTest, SampledGenerationIsSeededAndRespectsTopK) {
  kernels::CpuAllocator allocator;
  const GptConfig c = SmallConfig();
  auto model = HotModel(c, allocator, 10);
  const std::vector<int32_t> prompt = {1, 2, 3};
  GenerateOptions options;
  options.max_new_tokens = 12;
  options.sampling.temperature = 1.0f;
  options.sampling.top_k = 5;
  options.sampling.seed = 42;
  const auto a = Generate(*model, prompt, options).value();
  const auto b = Generate(*model, prompt, options).value();
  EXPECT_EQ(a, b);
  options.use_kv_cache = false;
  EXPECT_EQ(Generate(*model, prompt, options).value(), a);
  options.use_kv_cache = true;
  options.sampling.seed = 43;
  EXPECT_NE(Generate(*model, prompt, options).value(), a);

  // top_k = 1 is greedy whatever the temperature.
  options.sampling.top_k = 1;
  options.sampling.temperature = 5.0f;
  const auto top1 = Generate(*model, prompt, options).value();
  options.sampling = SamplingOptions{};
  EXPECT_EQ(top1, Generate(*model, prompt, options).value());

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
  const GptConfig c = SmallConfig();
  auto model = HotModel(c, allocator, 1);
  GenerateOptions options;
  options.max_new_tokens = 20;
  auto r = Generate(*model, RandomTokens(10, c.vocab, 1), options);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("a prompt of 10 tokens plus 20 new tokens needs 29 positions, past "
                        "max_seq_len 24"));
  EXPECT_EQ(Generate(*model, {}, options).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad = {1, 99};
  EXPECT_THAT(std::string(Generate(*model, bad, options).status().message()),
              HasSubstr("token 99 at position 1"));
  options.sampling.top_k = -1;
  EXPECT_THAT(std::string(Generate(*model, std::span(bad).first(1), options).status().message()), HasSubstr("top_k"));
}

}  // namespace
}  // namespace shardline::model
