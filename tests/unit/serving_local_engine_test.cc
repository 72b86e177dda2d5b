// worker/serving/local_engine.h over a small random GPT, and the incremental generation under
// it (model::GenerateStreaming).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/allocator.h"
#include "worker/model/inference.h"
#include "worker/serving/local_engine.h"

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

class ServingLocalEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model::GptConfig config{.layers = 2, .heads = 2, .d_model = 16, .vocab = 40, .max_seq_len = 32};
    auto gpt = model::GptModel::Create(config, allocator_);
    ASSERT_TRUE(gpt.ok()) << gpt.status();
    gpt_ = std::move(*gpt);
    gpt_->InitGpt2(11);
  }

  std::vector<int32_t> Reference(const GenerationRequest& r) {
    model::GenerateOptions options;
    options.max_new_tokens = r.max_tokens;
    options.sampling = {.temperature = r.temperature, .top_k = r.top_k, .seed = r.seed};
    auto tokens = model::Generate(*gpt_, r.prompt, options);
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    return tokens.value_or(std::vector<int32_t>{});
  }

  kernels::CpuAllocator allocator_;
  std::unique_ptr<model::GptModel> gpt_;
};

TEST_F(ServingLocalEngineTest, GenerateStreamingGivesGeneratesTokensAndStopsWhenAsked) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  model::GenerateOptions options;
  options.max_new_tokens = 8;
  auto whole = model::Generate(*gpt_, prompt, options);
  ASSERT_TRUE(whole.ok());
  std::vector<int32_t> streamed;
  auto count = model::GenerateStreaming(*gpt_, prompt, options, [&](int32_t t) {
    streamed.push_back(t);
    return streamed.size() < 3;
  });
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 3);
  EXPECT_EQ(streamed, std::vector<int32_t>(whole->begin(), whole->begin() + 3));
  options.use_kv_cache = false;
  streamed.clear();
  count = model::GenerateStreaming(*gpt_, prompt, options, [&](int32_t t) {
    streamed.push_back(t);
    return true;
  });
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(streamed, *whole);
}

TEST_F(ServingLocalEngineTest, StreamsWhatGenerateGives) {
  LocalEngine engine(*gpt_, {});
  EXPECT_TRUE(engine.Ready());
  EXPECT_EQ(engine.max_context(), 32);
  for (float temperature : {0.0f, 0.9f}) {
    GenerationRequest r{.prompt = {5, 6, 7},
                        .max_tokens = 10,
                        .temperature = temperature,
                        .top_k = 5,
                        .seed = 3,
                        .stop_token_ids = {}};
    Outcome out;
    ASSERT_TRUE(engine.Submit(r, out.Callbacks()).ok());
    ASSERT_TRUE(out.Wait());
    EXPECT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.reason, FinishReason::kLength);
    EXPECT_EQ(out.tokens, Reference(r)) << "temperature " << temperature;
  }
  EXPECT_EQ(engine.Stats().tokens_generated, 20);
}

TEST_F(ServingLocalEngineTest, AStopTokenEndsTheRequestUndelivered) {
  LocalEngine engine(*gpt_, {});
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
  ASSERT_TRUE(engine.Submit(r, out.Callbacks()).ok());
  ASSERT_TRUE(out.Wait());
  EXPECT_TRUE(out.status.ok());
  EXPECT_EQ(out.reason, FinishReason::kStop);
  EXPECT_EQ(out.tokens, std::vector<int32_t>(reference.begin(), reference.begin() + at));
}

TEST_F(ServingLocalEngineTest, OneAtATimeWithABoundedQueueAndCancel) {
  LocalEngine engine(*gpt_, LocalEngineOptions{.max_queue = 1});
  // The first request holds the worker in its first token until released (bounded wait).
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = false;
  std::atomic<bool> in_first_token{false};
  Outcome first;
  auto first_id = engine.Submit(
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
  auto second_id = engine.Submit(
      GenerationRequest{.prompt = {2}, .max_tokens = 2, .stop_token_ids = {}}, second.Callbacks());
  ASSERT_TRUE(second_id.ok());
  EXPECT_EQ(engine.Stats().running, 1);
  EXPECT_EQ(engine.Stats().waiting, 1);
  Outcome third;
  auto full = engine.Submit(GenerationRequest{.prompt = {3}, .max_tokens = 2, .stop_token_ids = {}},
                            third.Callbacks());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();

  engine.Cancel(*second_id);  // queued: finishes at once
  ASSERT_TRUE(second.Wait());
  EXPECT_EQ(second.status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(second.tokens.empty());

  engine.Cancel(*first_id);  // running: ends after its current token
  {
    std::lock_guard<std::mutex> lock(gate_mu);
    open = true;
  }
  gate_cv.notify_all();
  ASSERT_TRUE(first.Wait());
  EXPECT_EQ(first.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(first.tokens.size(), 1u);
}

TEST_F(ServingLocalEngineTest, RefusesWhatItCannotRunAndStopsCleanly) {
  LocalEngine engine(*gpt_, {});
  Outcome unused;
  EXPECT_EQ(engine
                .Submit(
                    GenerationRequest{
                        .prompt = {1}, .max_tokens = 2, .top_p = 0.5f, .stop_token_ids = {}},
                    unused.Callbacks())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine
                .Submit(GenerationRequest{.prompt = {1, 2}, .max_tokens = 31, .stop_token_ids = {}},
                        unused.Callbacks())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine
                .Submit(GenerationRequest{.prompt = {99}, .max_tokens = 1, .stop_token_ids = {}},
                        unused.Callbacks())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine
                .Submit(GenerationRequest{.prompt = {}, .max_tokens = 1, .stop_token_ids = {}},
                        unused.Callbacks())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  engine.Shutdown();
  EXPECT_FALSE(engine.Ready());
  EXPECT_EQ(engine
                .Submit(GenerationRequest{.prompt = {1}, .max_tokens = 1, .stop_token_ids = {}},
                        unused.Callbacks())
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  engine.Shutdown();
}

}  // namespace
}  // namespace shardline::serving
