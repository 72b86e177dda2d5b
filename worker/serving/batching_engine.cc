#include "worker/serving/batching_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/inference.h"

namespace shardline::serving {
namespace {

// One step on this rank: the stage's forward, then, on the last stage, the sampling over its
// tensor-parallel group; with pipeline stages the last stage's first rank sends the tokens to the
// leader. Returns the tokens where they are known (the last stage, and the leader), else none.
absl::StatusOr<std::vector<int32_t>> ForwardAndSample(model::PagedGptForward& forward,
                                                      const model::PagedStep& step,
                                                      std::span<const model::RowSampling> sampling,
                                                      const ServingGroups& groups, bool leader) {
  const model::InferenceWeights& w = forward.weights();
  ASSIGN_OR_RETURN(const std::span<const float> logits, forward.Forward(step));
  std::vector<int32_t> tokens(sampling.size(), 0);
  if (w.last_stage()) {
    ASSIGN_OR_RETURN(tokens, model::SampleVocabParallel(logits, w.vocab_begin, w.vocab_end,
                                                        w.config.vocab, sampling, groups.tp));
  }
  if (w.pp_size == 1 || tokens.empty()) return tokens;
  const bool first_of_stage = groups.tp == nullptr || groups.tp->rank() == 0;
  if (w.last_stage() && first_of_stage) {
    RETURN_IF_ERROR(Annotate(groups.pp->Send(tokens.data(), tokens.size(), DType::kInt32, 0),
                             "serving: sending the sampled tokens to the leader"));
  } else if (leader) {
    RETURN_IF_ERROR(
        Annotate(groups.pp->Recv(tokens.data(), tokens.size(), DType::kInt32, w.pp_size - 1),
                 "serving: receiving the sampled tokens from the last stage"));
  }
  return tokens;
}

}  // namespace

absl::StatusOr<model::PagedCacheOptions> CacheOptionsFor(const model::GptConfig& c,
                                                         const BatchingEngineOptions& options,
                                                         int tp_size, int pp_size) {
  if (options.max_running < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_running must be >= 1, got ", options.max_running));
  }
  if (options.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be >= 1, got ", options.block_size));
  }
  if (options.kv_cache_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_bytes must be >= 0, got ", options.kv_cache_bytes));
  }
  const int blocks_per_context = (c.max_seq_len + options.block_size - 1) / options.block_size;
  const int64_t block_bytes =
      model::PagedGptForward::BytesPerBlock(c, options.block_size, tp_size, pp_size);
  const int64_t blocks = options.kv_cache_bytes == 0
                             ? int64_t{options.max_running} * blocks_per_context
                             : options.kv_cache_bytes / block_bytes;
  if (blocks < blocks_per_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache_bytes ", options.kv_cache_bytes, " holds ", blocks, " blocks of ", block_bytes,
        " bytes; one whole context of ", c.max_seq_len, " positions needs ", blocks_per_context,
        " (", blocks_per_context * block_bytes, " bytes)"));
  }
  if (blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_bytes ", options.kv_cache_bytes, " is more blocks than an int"));
  }
  return model::PagedCacheOptions{.num_blocks = static_cast<int>(blocks),
                                  .block_size = options.block_size,
                                  .max_tokens_per_step = options.max_tokens_per_step,
                                  .max_seqs_per_step = options.max_running};
}

absl::StatusOr<std::unique_ptr<BatchingEngine>> BatchingEngine::Create(
    const model::InferenceWeights& weights, BatchingEngineOptions options,
    kernels::Allocator& allocator, ServingGroups groups) {
  const model::GptConfig& c = weights.config;
  if (groups.world != nullptr && groups.world->rank() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the serving engine runs on rank 0 of its group, not on rank ", groups.world->rank()));
  }
  if ((groups.tp != nullptr || groups.pp != nullptr) && groups.world == nullptr) {
    return absl::InvalidArgumentError("a serving group needs its world communicator");
  }
  ASSIGN_OR_RETURN(const model::PagedCacheOptions cache,
                   CacheOptionsFor(c, options, weights.tp_size, weights.pp_size));
  ASSIGN_OR_RETURN(BatchScheduler scheduler, BatchScheduler::Create(SchedulerLimits{
                                                 .max_running = options.max_running,
                                                 .max_tokens_per_step = options.max_tokens_per_step,
                                                 .block_size = options.block_size,
                                                 .num_blocks = cache.num_blocks,
                                                 .max_queue = options.max_queue,
                                                 .max_context = c.max_seq_len,
                                             }));
  ASSIGN_OR_RETURN(auto forward,
                   model::PagedGptForward::Create(weights, cache, allocator, groups.tp, groups.pp));
  return std::unique_ptr<BatchingEngine>(
      new BatchingEngine(options, std::move(forward), std::move(scheduler), groups));
}

BatchingEngine::BatchingEngine(BatchingEngineOptions options,
                               std::unique_ptr<model::PagedGptForward> forward,
                               BatchScheduler scheduler, ServingGroups groups)
    : options_(options),
      config_(forward->config()),
      forward_(std::move(forward)),
      groups_(groups),
      scheduler_(std::move(scheduler)) {
  batching_.kv_blocks = batching_.kv_blocks_free = scheduler_.free_blocks();
  worker_ = std::thread([this] { Run(); });
}

BatchingEngine::~BatchingEngine() { Shutdown(); }

void BatchingEngine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

absl::StatusOr<RequestId> BatchingEngine::Submit(GenerationRequest request,
                                                 StreamCallbacks callbacks) {
  const model::GptConfig& c = config_;
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt: no tokens");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= c.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: token ", i, " (", request.prompt[i],
                                                     ") is outside the vocabulary of ", c.vocab));
    }
  }
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be >= 1, got ", request.max_tokens));
  }
  if (static_cast<int64_t>(request.prompt.size()) + request.max_tokens > c.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens: the prompt (", request.prompt.size(), " tokens) plus ",
                     request.max_tokens, " new tokens is past the context of ", c.max_seq_len));
  }
  if (!(request.top_p > 0.0f && request.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", request.top_p));
  }
  if (request.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", request.top_k));
  }
  Sequence seq;
  seq.tokens = request.prompt;
  seq.request = std::move(request);
  seq.callbacks = std::move(callbacks);
  RequestId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the engine is shutting down");
    if (static_cast<int64_t>(arrivals_.size()) + in_scheduler_waiting_ >= options_.max_queue) {
      return absl::ResourceExhaustedError(absl::StrCat("the queue is full (", options_.max_queue,
                                                       " requests wait); try again later"));
    }
    id = seq.id = next_id_++;
    arrivals_.push_back(std::move(seq));
  }
  cv_.notify_all();
  return id;
}

void BatchingEngine::Cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

bool BatchingEngine::Ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !stopping_;
}

EngineStats BatchingEngine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return EngineStats{.running = in_scheduler_running_,
                     .waiting = in_scheduler_waiting_ + static_cast<int64_t>(arrivals_.size()),
                     .tokens_generated = tokens_generated_.load(),
                     .kv_blocks = batching_.kv_blocks,
                     .kv_blocks_used = batching_.kv_blocks - batching_.kv_blocks_free,
                     .preemptions = batching_.preemptions};
}

BatchingStats BatchingEngine::Batching() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batching_;
}

void BatchingEngine::Finish(RequestId id, absl::Status status, FinishReason reason) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  scheduler_.Finish(id);
  StreamCallbacks callbacks = std::move(it->second.callbacks);
  sequences_.erase(it);
  callbacks.on_finish(std::move(status), reason);
}

void BatchingEngine::TakeArrivals() {
  std::deque<Sequence> arrived;
  std::vector<RequestId> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    arrived.swap(arrivals_);
    cancels.swap(cancels_);
  }
  for (Sequence& seq : arrived) {
    const RequestId id = seq.id;
    const absl::Status added =
        scheduler_.Add(id, static_cast<int>(seq.tokens.size()), seq.request.max_tokens);
    if (!added.ok()) {
      // Submit checked the same limits, so this is a request the pool can never hold.
      seq.callbacks.on_finish(added, FinishReason::kStop);
      continue;
    }
    sequences_.emplace(id, std::move(seq));
  }
  for (RequestId id : cancels) Finish(id, absl::CancelledError("cancelled"), FinishReason::kStop);
}

void BatchingEngine::RunStep(const StepPlan& plan) {
  // The step's tokens, flattened; one block-table row per sequence.
  int max_blocks = 1;
  for (const StepEntry& e : plan.entries) {
    max_blocks = std::max(max_blocks, static_cast<int>(scheduler_.BlockTable(e.id).size()));
  }
  step_tokens_.clear();
  step_positions_.clear();
  step_seq_.clear();
  step_rows_.clear();
  step_sampling_.clear();
  step_tables_.assign(plan.entries.size() * max_blocks, 0);
  int64_t prompt_tokens = 0;  // positions of the prompts (recomputed ones too)
  for (size_t s = 0; s < plan.entries.size(); ++s) {
    const StepEntry& e = plan.entries[s];
    const Sequence& seq = sequences_.at(e.id);
    const std::span<const int32_t> table = scheduler_.BlockTable(e.id);
    std::copy(table.begin(), table.end(), step_tables_.begin() + s * max_blocks);
    for (int p = e.start; p < e.start + e.count; ++p) {
      step_tokens_.push_back(seq.tokens[p]);
      step_positions_.push_back(p);
      step_seq_.push_back(static_cast<int32_t>(s));
      if (p < static_cast<int>(seq.request.prompt.size())) ++prompt_tokens;
    }
    if (e.sample) {
      step_rows_.push_back(static_cast<int32_t>(step_tokens_.size()) - 1);
      const GenerationRequest& r = seq.request;
      step_sampling_.push_back(model::RowSampling{.options = {.temperature = r.temperature,
                                                              .top_k = r.top_k,
                                                              .top_p = r.top_p,
                                                              .seed = r.seed},
                                                  .draw = static_cast<uint64_t>(seq.generated)});
    }
  }
  const model::PagedStep step{
      .tokens = step_tokens_,
      .positions = step_positions_,
      .token_seq = step_seq_,
      .block_tables = step_tables_,
      .num_seqs = static_cast<int>(plan.entries.size()),
      .max_blocks_per_seq = max_blocks,
      .logit_rows = step_rows_,
  };
  if (groups_.world != nullptr) {
    if (absl::Status sent = Broadcast(StepKind::kStep, EncodeStep(step, step_sampling_));
        !sent.ok()) {
      scheduler_.Complete(plan);
      Fail(sent);
      return;
    }
  }
  absl::StatusOr<std::vector<int32_t>> tokens =
      ForwardAndSample(*forward_, step, step_sampling_, groups_, /*leader=*/true);
  scheduler_.Complete(plan);
  if (!tokens.ok()) {
    // A collective failed (the group is gone), or the scheduler planned a step the model refuses
    // (a bug): either way these requests cannot go on, and with a group neither can the others.
    if (groups_.world != nullptr) {
      Fail(tokens.status());
      return;
    }
    for (const StepEntry& e : plan.entries) {
      Finish(e.id, absl::InternalError(absl::StrCat("serving step: ", tokens.status().message())),
             FinishReason::kStop);
    }
    return;
  }
  int row = 0;
  for (const StepEntry& e : plan.entries) {
    if (!e.sample) continue;
    Sequence& seq = sequences_.at(e.id);
    const GenerationRequest& r = seq.request;
    const int32_t token = (*tokens)[row++];
    ++seq.generated;
    tokens_generated_.fetch_add(1);
    if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) !=
        r.stop_token_ids.end()) {
      Finish(e.id, absl::OkStatus(), FinishReason::kStop);
      continue;
    }
    seq.callbacks.on_token(token);
    if (seq.generated >= r.max_tokens) {
      Finish(e.id, absl::OkStatus(), FinishReason::kLength);
      continue;
    }
    seq.tokens.push_back(token);
    scheduler_.AppendToken(e.id);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++batching_.steps;
  batching_.prompt_tokens += prompt_tokens;
  batching_.preemptions += static_cast<int64_t>(plan.preempted.size());
  batching_.max_batch = std::max<int64_t>(batching_.max_batch, plan.entries.size());
  batching_.kv_blocks_free = scheduler_.free_blocks();
}

absl::Status BatchingEngine::Broadcast(StepKind kind, std::vector<int32_t> payload) {
  int32_t header[kHeaderInts] = {static_cast<int32_t>(kind), static_cast<int32_t>(payload.size())};
  RETURN_IF_ERROR(Annotate(groups_.world->Broadcast(header, kHeaderInts, DType::kInt32, 0),
                           "serving group: broadcast of a step header"));
  if (payload.empty()) return absl::OkStatus();
  return Annotate(groups_.world->Broadcast(payload.data(), payload.size(), DType::kInt32, 0),
                  "serving group: broadcast of a step");
}

void BatchingEngine::Fail(const absl::Status& cause) {
  // Whatever the collective said (a peer gone, a timeout, an abort), for a client the service is
  // unavailable (503) until it is restarted; the reason goes with it.
  const absl::Status status = absl::UnavailableError(
      absl::StrCat("the serving group failed: ", cause.message()));
  group_failed_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  std::vector<RequestId> ids;
  for (const auto& [id, seq] : sequences_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (RequestId id : ids) Finish(id, status, FinishReason::kStop);
}

void BatchingEngine::Run() {
  using Clock = std::chrono::steady_clock;
  // A follower waits for the next message with the communicator's deadline; an idle leader
  // speaks well inside it.
  constexpr auto kHeartbeat = std::chrono::seconds(1);
  auto last_broadcast = Clock::now();
  bool stalled = false;  // the last plan was empty although sequences were there
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A bounded wait, so a missed notification costs at most this long. With work in hand the
      // next step starts at once.
      cv_.wait_for(lock, std::chrono::milliseconds(200), [this, stalled] {
        return stopping_ || !arrivals_.empty() || !cancels_.empty() ||
               (!sequences_.empty() && !stalled);
      });
      if (stopping_) break;
    }
    TakeArrivals();
    const StepPlan plan = scheduler_.Schedule();
    stalled = plan.empty() && !sequences_.empty();
    if (!plan.empty()) {
      RunStep(plan);
      last_broadcast = Clock::now();
    } else if (groups_.world != nullptr && Clock::now() - last_broadcast >= kHeartbeat) {
      if (absl::Status sent = Broadcast(StepKind::kIdle); !sent.ok()) Fail(sent);
      last_broadcast = Clock::now();
    }
    std::lock_guard<std::mutex> lock(mu_);
    in_scheduler_running_ = scheduler_.running();
    in_scheduler_waiting_ = scheduler_.waiting();
  }
  // Stopping: every request still here or still arriving ends now, then the followers stop.
  std::deque<Sequence> arrived;
  {
    std::lock_guard<std::mutex> lock(mu_);
    arrived.swap(arrivals_);
  }
  for (Sequence& seq : arrived) {
    seq.callbacks.on_finish(absl::UnavailableError("the engine is shutting down"),
                            FinishReason::kStop);
  }
  std::vector<RequestId> ids;
  for (const auto& [id, seq] : sequences_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (RequestId id : ids) {
    Finish(id, absl::UnavailableError("the engine is shutting down"), FinishReason::kStop);
  }
  if (groups_.world != nullptr && !group_failed_) Broadcast(StepKind::kStop).IgnoreError();
}

absl::Status RunServingFollower(const model::InferenceWeights& weights,
                                const BatchingEngineOptions& options, kernels::Allocator& allocator,
                                ServingGroups groups) {
  if (groups.world == nullptr || groups.world->rank() == 0) {
    return absl::InvalidArgumentError(
        "a serving follower is a rank other than 0 of a group; rank 0 runs the engine");
  }
  ASSIGN_OR_RETURN(const model::PagedCacheOptions cache,
                   CacheOptionsFor(weights.config, options, weights.tp_size, weights.pp_size));
  ASSIGN_OR_RETURN(auto forward,
                   model::PagedGptForward::Create(weights, cache, allocator, groups.tp, groups.pp));
  comm::Communicator& world = *groups.world;
  std::vector<int32_t> payload;
  for (;;) {
    int32_t header[kHeaderInts] = {0, 0};
    RETURN_IF_ERROR(Annotate(world.Broadcast(header, kHeaderInts, DType::kInt32, 0),
                             "serving follower: waiting for the next step"));
    const StepKind kind = static_cast<StepKind>(header[0]);
    if (kind == StepKind::kStop) return absl::OkStatus();
    if (kind == StepKind::kIdle) continue;
    // The largest step the cache options allow bounds what a header may announce.
    const int64_t most = 4 + 3 * int64_t{cache.max_tokens_per_step} +
                         int64_t{cache.max_seqs_per_step} * cache.num_blocks +
                         8 * int64_t{cache.max_seqs_per_step};
    if (kind != StepKind::kStep || header[1] < 1 || header[1] > most) {
      return absl::InvalidArgumentError(absl::StrCat("serving follower: a header of kind ",
                                                     header[0], " and length ", header[1]));
    }
    payload.resize(header[1]);
    RETURN_IF_ERROR(Annotate(world.Broadcast(payload.data(), payload.size(), DType::kInt32, 0),
                             "serving follower: receiving a step"));
    ASSIGN_OR_RETURN(const StepMessage step, DecodeStep(payload, cache));
    RETURN_IF_ERROR(
        ForwardAndSample(*forward, step.View(), step.sampling, groups, /*leader=*/false).status());
  }
}

}  // namespace shardline::serving
