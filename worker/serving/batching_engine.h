// A CompletionEngine with continuous (iteration-level) batching, as vLLM's: one engine thread
// runs steps; before each, new requests join the running batch and finished ones have left.
// The BatchScheduler (batch_scheduler.h, I/O-free) decides what each step computes — decodes of
// the running sequences first, then chunks of waiting prompts within a per-step token budget,
// admitted while the block KV cache has room (the newest running sequence is preempted and
// recomputed when it runs dry) — and the model's paged forward (model/paged_inference.h)
// computes it in one batch. Each sampled token is a pure function of the request's seed, its
// index and the logits, so a request's output does not depend on what else is in the batch.
//
// Tensor and pipeline parallelism: the engine runs on rank 0 of a tp × pp group (the first
// stage's first rank); the other ranks run RunServingFollower. Every rank computes each step on
// its own shard (its stage's layers; its heads, MLP columns and vocabulary rows); the last
// stage's ranks sample together from their vocabulary slices (SampleVocabParallel); no rank holds
// the whole model or the whole logits. The leader broadcasts each step to its stage, and the
// stages form a ring (step_message.h): each turn every stage passes the step it computed, with
// its residual, to the next, and the last stage passes the tokens back to the first. So with pp
// stages, pp steps are in flight, each over its own sequences (the scheduler's max_in_flight),
// and every stage computes at every turn while there is work. While idle the leader sends a
// heartbeat each second, so the followers' waits keep a deadline; a failed collective ends every
// request with the error and the engine stops being Ready.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "worker/comm/communicator.h"
#include "worker/model/paged_inference.h"
#include "worker/model/vocab_parallel_sampling.h"
#include "worker/serving/batch_scheduler.h"
#include "worker/serving/engine.h"
#include "worker/serving/step_message.h"

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
  int64_t max_in_flight = 0;  // the most steps in the pipeline at once (pp of them when full)
  int kv_blocks = 0;       // blocks in the cache
  int kv_blocks_free = 0;  // after the last step
};

// The communicators of a serving group (null: a group of one). `world` holds every rank (tp × pp,
// rank 0 the leader); `tp` the ranks of this rank's stage; `pp` the ranks of this rank's
// tensor-parallel index, one per stage, in stage order.
struct ServingGroups {
  comm::Communicator* world = nullptr;
  comm::Communicator* tp = nullptr;
  comm::Communicator* pp = nullptr;
  // The tensor-parallel group as the forward's all-reduces use it, over the backend's memory: on
  // a GPU, `tp` staged through host memory (comm::StagedCommunicator); null: `tp` itself (the
  // CPU's). Every other use of the groups (steps, residuals, sampling) moves host memory.
  comm::Communicator* tp_forward = nullptr;
  comm::Communicator* ForwardTp() const { return tp_forward != nullptr ? tp_forward : tp; }
  // Tensor parallelism only: the world is the tensor-parallel group.
  static ServingGroups TensorParallel(comm::Communicator* tp) { return {tp, tp, nullptr}; }
};

// The cache options every rank of a group derives from the same engine options (the followers
// size theirs the same way: the same number of blocks on every rank, each `kv_cache_bytes`
// holding the most layers a stage has). InvalidArgument names a bad option, or a cache too small
// for one whole context.
absl::StatusOr<model::PagedCacheOptions> CacheOptionsFor(const model::ModelConfig& config,
                                                         const BatchingEngineOptions& options,
                                                         int tp_size, int pp_size = 1);

class BatchingEngine final : public CompletionEngine {
 public:
  // The leader of `groups` (rank 0 of its world; no groups: one rank). InvalidArgument names a
  // bad option; ResourceExhausted when the cache does not fit in memory. The steps run on
  // `backend` (its allocator holds the cache). `weights`, `backend` and the communicators must
  // outlive the engine. Starts the engine thread.
  static absl::StatusOr<std::unique_ptr<BatchingEngine>> Create(
      const model::InferenceWeights& weights, BatchingEngineOptions options,
      kernels::Backend& backend, ServingGroups groups = {});
  // Shutdown().
  ~BatchingEngine() override;

  // Stops taking requests, ends every request with Unavailable (after the step in flight) and
  // joins the engine thread; the followers get a stop message and return OK. Idempotent.
  void Shutdown();
  // Ends every request with `reason` at once: aborts the group's communicators (a step in flight
  // fails at once, and so do the followers' waits) and joins the engine thread. For a leader
  // whose group is being torn down (its agent's SIGTERM). Callable from any thread; after
  // Shutdown or StopNow, a no-op.
  void StopNow(absl::Status reason);

  absl::StatusOr<RequestId> Submit(GenerationRequest request, StreamCallbacks callbacks) override;
  void Cancel(RequestId id) override;
  bool Ready() const override;
  EngineStats Stats() const override;
  BatchingStats Batching() const;
  int32_t max_context() const override { return config_.max_seq_len; }

 private:
  struct Sequence {
    RequestId id = 0;
    GenerationRequest request;
    StreamCallbacks callbacks;
    std::vector<int32_t> tokens;  // the prompt, then every generated token
    int generated = 0;
  };

  BatchingEngine(BatchingEngineOptions options, std::unique_ptr<model::PagedGptForward> forward,
                 BatchScheduler scheduler, ServingGroups groups);
  void Run();
  // The group failed: every request ends with `status`, and the engine stops. Engine thread.
  void Fail(const absl::Status& status);
  // StopNow's reason; OK when it was not called.
  absl::Status StopReason() const;
  // Moves submitted requests into the scheduler and drops cancelled ones. Engine thread.
  void TakeArrivals();
  // The message of a planned step. Engine thread.
  Slot StepSlot(const StepPlan& plan);
  // One turn: `slot` to this stage's ranks and through this stage's forward; with one stage the
  // tokens of `plan` are delivered at once, with several the result goes into the ring and the
  // tokens of the oldest step in flight are delivered when they come back. An error means the
  // group cannot go on. Engine thread.
  absl::Status Turn(Slot slot, StepPlan plan);
  // `plan` ran and sampled `tokens` (one per sampled entry, in order): Complete, then each
  // sequence gets its token, or ends. Engine thread.
  absl::Status Deliver(const StepPlan& plan, std::span<const int32_t> tokens);
  // Ends a request: on_finish and out of the scheduler. Engine thread.
  void Finish(RequestId id, absl::Status status, FinishReason reason);

  const BatchingEngineOptions options_;
  const model::ModelConfig config_;
  std::unique_ptr<model::PagedGptForward> forward_;    // engine thread only
  const ServingGroups groups_;                         // engine thread only
  const SlotLimits slot_limits_;
  BatchScheduler scheduler_;                           // engine thread only
  std::deque<StepPlan> in_flight_;  // engine thread only: steps in the ring, oldest first
  std::unordered_map<RequestId, Sequence> sequences_;  // engine thread only: in the scheduler
  bool group_failed_ = false;                          // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Sequence> arrivals_;     // guarded by mu_: submitted, not yet scheduled
  std::vector<RequestId> cancels_;    // guarded by mu_
  bool stopping_ = false;             // guarded by mu_
  absl::Status stop_reason_;          // guarded by mu_: StopNow's, for every request left
  RequestId next_id_ = 1;             // guarded by mu_
  int64_t in_scheduler_running_ = 0;  // guarded by mu_: the scheduler's counts, per step
  int64_t in_scheduler_waiting_ = 0;  // guarded by mu_
  BatchingStats batching_;            // guarded by mu_
  std::atomic<int64_t> tokens_generated_{0};

  // Step buffers, reused (engine thread only).
  std::vector<int32_t> step_tokens_, step_positions_, step_seq_, step_tables_, step_rows_;
  std::vector<model::RowSampling> step_sampling_;
  std::thread worker_;
};

// A rank other than 0 of a serving group (groups.world not null): runs every step rank 0's engine
// broadcasts, on this rank's `weights`, until the engine stops. OK after the leader's stop; the
// error of a failed collective (a dead leader: within the communicator's timeout) or a malformed
// message otherwise.
absl::Status RunServingFollower(const model::InferenceWeights& weights,
                                const BatchingEngineOptions& options, kernels::Backend& backend,
                                ServingGroups groups);

}  // namespace shardline::serving
