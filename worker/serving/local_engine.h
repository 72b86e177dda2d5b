// A CompletionEngine over the single-process generator (model::GenerateStreaming): one worker
// thread runs the requests one at a time, in arrival order, each to its end. Batching is OFF:
// a request waits in a bounded queue until every one before it has finished. (Continuous
// batching over the block KV cache is the serving scheduler's job, a later piece.)
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "worker/model/gpt.h"
#include "worker/serving/engine.h"

namespace shardline::serving {

struct LocalEngineOptions {
  int max_queue = 64;        // requests waiting behind the running one; past it Submit is 429
  bool use_kv_cache = true;  // false: the full-forward reference path
};

class LocalEngine final : public CompletionEngine {
 public:
  // `model` must outlive the engine and not change while it runs. Starts the worker thread.
  LocalEngine(const model::GptModel& model, LocalEngineOptions options);
  // Shutdown().
  ~LocalEngine() override;

  // Stops taking requests, cancels the running one (it ends after its current token), fails the
  // queued ones with Unavailable and joins the worker. Idempotent.
  void Shutdown();

  absl::StatusOr<RequestId> Submit(GenerationRequest request, StreamCallbacks callbacks) override;
  void Cancel(RequestId id) override;
  bool Ready() const override;
  EngineStats Stats() const override;
  int32_t max_context() const override { return model_.config().max_seq_len; }

 private:
  struct Job {
    RequestId id = 0;
    GenerationRequest request;
    StreamCallbacks callbacks;
    std::atomic<bool> cancelled{false};
  };

  void Run();
  void RunJob(Job& job);

  const model::GptModel& model_;
  const LocalEngineOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // guarded by mu_
  std::shared_ptr<Job> running_;            // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  RequestId next_id_ = 1;                   // guarded by mu_
  std::atomic<int64_t> tokens_generated_{0};
  std::thread worker_;
};

}  // namespace shardline::serving
