// worker/serving/batching_engine.h over a small random GPT: every request's output equals the
// single-sequence generator's (model::Generate), whatever else shares its batch, through chunked
// prefill and preemption; and the request lifecycle (stop tokens, cancel, a full queue, refusals,
// shutdown). Also the incremental generation (model::GenerateStreaming).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "worker/model/inference.h"
#include "worker/model/paged_inference.h"
#include "worker/serving/batching_engine.h"

namespace shardline::serving {
namespace {

using Clock = std::chrono::steady_clock;

// What a request delivered, filled on the engine's thread.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  bool finished = false;
  absl::Status status;
  FinishReason reason = FinishReason::kStop;

  StreamCallbacks Callbacks(std::function<void(int32_t)> also = nullptr) {
    return StreamCallbacks{.on_token =
                               [this, also](int32_t token) {
                                 {
                                   std::lock_guard<std::mutex> lock(mu);
                                   tokens.push_back(token);
                                 }
                                 if (also) also(token);
                               },
                           .on_finish =
                               [this](absl::Status s, FinishReason r) {
                                 std::lock_guard<std::mutex> lock(mu);
                                 finished = true;
                                 status = std::move(s);
                                 reason = r;
                                 cv.notify_all();
                               }};
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [this] { return finished; });
  }
};

class ServingBatchingEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model::ModelConfig config{
        .layers = 2, .heads = 2, .d_model = 16, .vocab = 40, .max_seq_len = 32};
    auto gpt = model::ModelParams::Gpt2Init(config, 11);
    ASSERT_TRUE(gpt.ok()) << gpt.status();
    gpt_ = std::make_unique<model::ModelParams>(std::move(*gpt));
  }

  std::vector<int32_t> Reference(const GenerationRequest& r) {
    model::GenerateOptions options;
    options.max_new_tokens = r.max_tokens;
    options.sampling = {
        .temperature = r.temperature, .top_k = r.top_k, .top_p = r.top_p, .seed = r.seed};
    auto tokens = model::Generate(model::InferenceWeights::Of(*gpt_), backend_, r.prompt, options);
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    return tokens.value_or(std::vector<int32_t>{});
  }

  std::unique_ptr<BatchingEngine> Engine(BatchingEngineOptions options) {
    auto engine = BatchingEngine::Create(model::InferenceWeights::Of(*gpt_), options, backend_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  kernels::CpuAllocator allocator_;
  kernels::cpu::CpuBackend backend_{allocator_};
  std::unique_ptr<model::ModelParams> gpt_;
};

TEST_F(ServingBatchingEngineTest, GenerateStreamingGivesGeneratesTokensAndStopsWhenAsked) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  model::GenerateOptions options;
  options.max_new_tokens = 8;
  auto whole = model::Generate(model::InferenceWeights::Of(*gpt_), backend_, prompt, options);
  ASSERT_TRUE(whole.ok());
  std::vector<int32_t> streamed;
  auto count = model::GenerateStreaming(model::InferenceWeights::Of(*gpt_), backend_, prompt,
                                        options, [&](int32_t t) {
                                          streamed.push_back(t);
                                          return streamed.size() < 3;
                                        });
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 3);
  EXPECT_EQ(streamed, std::vector<int32_t>(whole->begin(), whole->begin() + 3));
  options.use_kv_cache = false;
  streamed.clear();
  count = model::GenerateStreaming(model::InferenceWeights::Of(*gpt_), backend_, prompt, options,
                                   [&](int32_t t) {
                                     streamed.push_back(t);
                                     return true;
                                   });
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(streamed, *whole);
}

TEST_F(ServingBatchingEngineTest, StreamsWhatGenerateGives) {
  auto engine = Engine({});
  ASSERT_NE(engine, nullptr);
  EXPECT_TRUE(engine->Ready());
  EXPECT_EQ(engine->max_context(), 32);
  for (float temperature : {0.0f, 0.9f}) {
    GenerationRequest r{.prompt = {5, 6, 7},
                        .max_tokens = 10,
                        .temperature = temperature,
                        .top_k = 5,
                        .seed = 3,
                        .stop_token_ids = {}};
    Outcome out;
    ASSERT_TRUE(engine->Submit(r, out.Callbacks()).ok());
    ASSERT_TRUE(out.Wait());
    EXPECT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.reason, FinishReason::kLength);
    EXPECT_EQ(out.tokens, Reference(r)) << "temperature " << temperature;
  }
  EXPECT_EQ(engine->Stats().tokens_generated, 20);
}

// Requests of many lengths at once, more than a batch holds, with a token budget smaller than the
// longer prompts: they share steps (continuous batching), long prompts are prefilled in chunks,
// and every output is the one the request gets alone.
TEST_F(ServingBatchingEngineTest, ConcurrentRequestsGetWhatEachGetsAlone) {
  auto engine = Engine({.max_running = 4, .max_tokens_per_step = 8, .block_size = 4});
  ASSERT_NE(engine, nullptr);
  std::mt19937 rng(7);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 12; ++i) {
    GenerationRequest r;
    const int prompt_len = 1 + static_cast<int>(rng() % 19);  // up to 19: past the budget of 8
    for (int j = 0; j < prompt_len; ++j) r.prompt.push_back(static_cast<int32_t>(rng() % 40));
    r.max_tokens = 1 + static_cast<int>(rng() % (32 - prompt_len));
    r.temperature = i % 3 == 0 ? 0.0f : 0.8f;
    r.top_k = i % 2 == 0 ? 0 : 7;
    r.top_p = i % 4 == 1 ? 0.8f : (i % 4 == 2 ? 0.5f : 1.0f);
    r.seed = 100 + i;
    requests.push_back(r);
  }
  std::vector<Outcome> outcomes(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(engine->Submit(requests[i], outcomes[i].Callbacks()).ok());
  }
  int64_t generated = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(outcomes[i].Wait()) << "request " << i;
    EXPECT_TRUE(outcomes[i].status.ok()) << outcomes[i].status;
    EXPECT_EQ(outcomes[i].reason, FinishReason::kLength);
    EXPECT_EQ(outcomes[i].tokens, Reference(requests[i])) << "request " << i;
    generated += requests[i].max_tokens;
  }
  const BatchingStats stats = engine->Batching();
  EXPECT_GT(stats.max_batch, 1) << "the requests never shared a step";
  EXPECT_LE(stats.max_batch, 4);
  int64_t prompt_tokens = 0;
  for (const auto& r : requests) prompt_tokens += static_cast<int64_t>(r.prompt.size());
  EXPECT_EQ(stats.prompt_tokens, prompt_tokens);  // nothing preempted: each prompt computed once
  EXPECT_EQ(stats.preemptions, 0);
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks);  // every block back in the pool
  EXPECT_EQ(engine->Stats().tokens_generated, generated);
  EXPECT_EQ(engine->Stats().kv_blocks, stats.kv_blocks);
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
}

// A cache too small for every running sequence's whole context: the scheduler preempts, the
// preempted sequences recompute their prompt and generated tokens, and outputs do not change.
TEST_F(ServingBatchingEngineTest, PreemptedRequestsRecomputeAndGiveTheSameTokens) {
  const int64_t block_bytes = model::PagedGptForward::BytesPerBlock(gpt_->config(), 4);
  // 10 blocks of 4: one whole context (8 blocks) and a little; four sequences of 20+ positions.
  auto engine = Engine({.max_running = 4,
                        .max_tokens_per_step = 16,
                        .block_size = 4,
                        .kv_cache_bytes = 10 * block_bytes});
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->Batching().kv_blocks, 10);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(GenerationRequest{.prompt = {int32_t(1 + i), int32_t(2 + i), 3, 4, 5},
                                         .max_tokens = 16 + i,
                                         .temperature = i % 2 == 0 ? 0.0f : 1.0f,
                                         .seed = uint64_t(9 + i),
                                         .stop_token_ids = {}});
  }
  std::vector<Outcome> outcomes(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(engine->Submit(requests[i], outcomes[i].Callbacks()).ok());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(outcomes[i].Wait()) << "request " << i;
    EXPECT_TRUE(outcomes[i].status.ok()) << outcomes[i].status;
    EXPECT_EQ(outcomes[i].tokens, Reference(requests[i])) << "request " << i;
  }
  const BatchingStats stats = engine->Batching();
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_EQ(engine->Stats().preemptions, stats.preemptions);
  EXPECT_EQ(stats.kv_blocks_free, 10);
}

TEST_F(ServingBatchingEngineTest, AStopTokenEndsTheRequestUndelivered) {
  auto engine = Engine({});
  ASSERT_NE(engine, nullptr);
  // Sampled: a small random model's greedy text repeats one token.
  GenerationRequest r{
      .prompt = {5, 6, 7}, .max_tokens = 10, .temperature = 1.0f, .seed = 3, .stop_token_ids = {}};
  const std::vector<int32_t> reference = Reference(r);
  // The first place where a token differs from all before it, so it stops exactly there.
  size_t at = 1;
  while (at < reference.size() && std::find(reference.begin(), reference.begin() + at,
                                            reference[at]) != reference.begin() + at) {
    ++at;
  }
  ASSERT_LT(at, reference.size()) << "a run of one token only";
  r.stop_token_ids = {reference[at]};
  Outcome out;
  ASSERT_TRUE(engine->Submit(r, out.Callbacks()).ok());
  ASSERT_TRUE(out.Wait());
  EXPECT_TRUE(out.status.ok());
  EXPECT_EQ(out.reason, FinishReason::kStop);
  EXPECT_EQ(out.tokens, std::vector<int32_t>(reference.begin(), reference.begin() + at));
}

TEST_F(ServingBatchingEngineTest, ABoundedQueueAndCancel) {
  auto engine = Engine({.max_queue = 1});
  ASSERT_NE(engine, nullptr);
  // The first request holds the engine thread in its first token until released (bounded wait).
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = false;
  std::atomic<bool> in_first_token{false};
  Outcome first;
  auto first_id = engine->Submit(
      GenerationRequest{.prompt = {1}, .max_tokens = 20, .temperature = 0, .stop_token_ids = {}},
      first.Callbacks([&](int32_t) {
        in_first_token = true;
        std::unique_lock<std::mutex> lock(gate_mu);
        gate_cv.wait_for(lock, std::chrono::seconds(20), [&] { return open; });
      }));
  ASSERT_TRUE(first_id.ok());
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!in_first_token && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(in_first_token);
  Outcome second;
  auto second_id = engine->Submit(
      GenerationRequest{.prompt = {2}, .max_tokens = 2, .stop_token_ids = {}}, second.Callbacks());
  ASSERT_TRUE(second_id.ok());
  EXPECT_EQ(engine->Stats().waiting, 1);
  Outcome third;
  auto full = engine->Submit(
      GenerationRequest{.prompt = {3}, .max_tokens = 2, .stop_token_ids = {}}, third.Callbacks());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();

  engine->Cancel(*second_id);  // not yet scheduled: ends before it runs
  engine->Cancel(*first_id);   // running: ends after its current token
  {
    std::lock_guard<std::mutex> lock(gate_mu);
    open = true;
  }
  gate_cv.notify_all();
  ASSERT_TRUE(second.Wait());
  EXPECT_EQ(second.status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(second.tokens.empty());
  ASSERT_TRUE(first.Wait());
  EXPECT_EQ(first.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(first.tokens.size(), 1u);
  engine->Cancel(*first_id);  // finished: a no-op
  engine->Cancel(12345);      // unknown: a no-op
}

TEST_F(ServingBatchingEngineTest, RefusesWhatItCannotRunAndStopsCleanly) {
  EXPECT_EQ(BatchingEngine::Create(model::InferenceWeights::Of(*gpt_), {.max_running = 0}, backend_)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Less than one whole context of 32 positions.
  EXPECT_EQ(BatchingEngine::Create(
                model::InferenceWeights::Of(*gpt_),
                {.block_size = 4,
                 .kv_cache_bytes = 7 * model::PagedGptForward::BytesPerBlock(gpt_->config(), 4)},
                backend_)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto engine = Engine({});
  ASSERT_NE(engine, nullptr);
  Outcome unused;
  for (const GenerationRequest& bad : {
           GenerationRequest{.prompt = {1}, .max_tokens = 2, .top_p = 0.0f, .stop_token_ids = {}},
           GenerationRequest{.prompt = {1}, .max_tokens = 2, .top_p = 1.5f, .stop_token_ids = {}},
           GenerationRequest{.prompt = {1, 2}, .max_tokens = 31, .stop_token_ids = {}},
           GenerationRequest{.prompt = {99}, .max_tokens = 1, .stop_token_ids = {}},
           GenerationRequest{.prompt = {}, .max_tokens = 1, .stop_token_ids = {}},
           GenerationRequest{.prompt = {1}, .max_tokens = 0, .stop_token_ids = {}},
       }) {
    EXPECT_EQ(engine->Submit(bad, unused.Callbacks()).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // Requests in flight at shutdown each end exactly once: done, or Unavailable.
  std::vector<Outcome> outcomes(6);
  for (size_t i = 0; i < outcomes.size(); ++i) {
    ASSERT_TRUE(engine
                    ->Submit(
                        GenerationRequest{
                            .prompt = {int32_t(i + 1)}, .max_tokens = 30, .stop_token_ids = {}},
                        outcomes[i].Callbacks())
                    .ok());
  }
  engine->Shutdown();
  EXPECT_FALSE(engine->Ready());
  for (Outcome& out : outcomes) {
    ASSERT_TRUE(out.Wait());
    EXPECT_TRUE(out.status.ok() || out.status.code() == absl::StatusCode::kUnavailable)
        << out.status;
  }
  EXPECT_EQ(engine
                ->Submit(GenerationRequest{.prompt = {1}, .max_tokens = 1, .stop_token_ids = {}},
                         unused.Callbacks())
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  engine->Shutdown();
}

}  // namespace
}  // namespace shardline::serving
