// A CompletionEngine with continuous (iteration-level) batching, as vLLM's: one engine thread
// runs steps; before each, new requests join the running batch and finished ones have left.
// The BatchScheduler (batch_scheduler.h, I/O-free) decides what each step computes — decodes of
// the running sequences first, then chunks of waiting prompts within a per-step token budget,
// admitted while the block KV cache has room (the newest running sequence is preempted and
// recomputed when it runs dry) — and the model's paged forward (model/paged_inference.h)
// computes it in one batch. Each sampled token is a pure function of the request's seed, its
// index and the logits, so a request's output does not depend on what else is in the batch.
//
// This engine runs the model in this process (tp = pp = 1). The sharded engine of a serve job
// is the same scheduler driving the ranks of a tp × pp group (not built yet).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/gpt.h"
#include "worker/model/paged_inference.h"
#include "worker/serving/batch_scheduler.h"
#include "worker/serving/engine.h"

namespace shardline::serving {

struct BatchingEngineOptions {
  int max_running = 8;            // sequences in the running batch
  int max_tokens_per_step = 256;  // prefill + decode tokens per step
  int block_size = 16;            // KV-cache positions per block
  // Bytes of KV cache (keys and values of every layer). 0: room for max_running sequences of the
  // whole context.
  int64_t kv_cache_bytes = 0;
  int max_queue = 64;  // requests waiting; past it Submit is ResourceExhausted (429)
};

// What the engine has done since it started, beyond EngineStats.
struct BatchingStats {
  int64_t steps = 0;
  int64_t prompt_tokens = 0;  // prompt positions computed (recomputed ones included)
  int64_t preemptions = 0;
  int64_t max_batch = 0;   // the most sequences one step has run
  int kv_blocks = 0;       // blocks in the cache
  int kv_blocks_free = 0;  // after the last step
};

class BatchingEngine final : public CompletionEngine {
 public:
  // InvalidArgument names a bad option (or a cache too small for one whole context);
  // ResourceExhausted when the cache does not fit in memory. `model` must outlive the engine and
  // not change while it runs. Starts the engine thread.
  static absl::StatusOr<std::unique_ptr<BatchingEngine>> Create(const model::GptModel& model,
                                                                BatchingEngineOptions options);
  // Shutdown().
  ~BatchingEngine() override;

  // Stops taking requests, ends every request with Unavailable (after the step in flight) and
  // joins the engine thread. Idempotent.
  void Shutdown();

  absl::StatusOr<RequestId> Submit(GenerationRequest request, StreamCallbacks callbacks) override;
  void Cancel(RequestId id) override;
  bool Ready() const override;
  EngineStats Stats() const override;
  BatchingStats Batching() const;
  int32_t max_context() const override { return model_.config().max_seq_len; }

 private:
  struct Sequence {
    RequestId id = 0;
    GenerationRequest request;
    StreamCallbacks callbacks;
    std::vector<int32_t> tokens;  // the prompt, then every generated token
    int generated = 0;
  };

  BatchingEngine(const model::GptModel& model, BatchingEngineOptions options,
                 std::unique_ptr<model::PagedGptForward> forward, BatchScheduler scheduler);
  void Run();
  // Moves submitted requests into the scheduler and drops cancelled ones. Engine thread.
  void TakeArrivals();
  // Runs one planned step and delivers its tokens. Engine thread.
  void RunStep(const StepPlan& plan);
  // Ends a request: on_finish and out of the scheduler. Engine thread.
  void Finish(RequestId id, absl::Status status, FinishReason reason);

  const model::GptModel& model_;
  const BatchingEngineOptions options_;
  std::unique_ptr<model::PagedGptForward> forward_;    // engine thread only
  BatchScheduler scheduler_;                           // engine thread only
  std::unordered_map<RequestId, Sequence> sequences_;  // engine thread only: in the scheduler

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Sequence> arrivals_;     // guarded by mu_: submitted, not yet scheduled
  std::vector<RequestId> cancels_;    // guarded by mu_
  bool stopping_ = false;             // guarded by mu_
  RequestId next_id_ = 1;             // guarded by mu_
  int64_t in_scheduler_running_ = 0;  // guarded by mu_: the scheduler's counts, per step
  int64_t in_scheduler_waiting_ = 0;  // guarded by mu_
  BatchingStats batching_;            // guarded by mu_
  std::atomic<int64_t> tokens_generated_{0};

  // Step buffers, reused (engine thread only).
  std::vector<int32_t> step_tokens_, step_positions_, step_seq_, step_tables_, step_rows_;
  std::thread worker_;
};

}  // namespace shardline::serving
