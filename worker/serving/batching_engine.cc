#include "worker/serving/batching_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/inference.h"

namespace shardline::serving {
namespace {

// A step's work on this rank: the stage's forward of the step in `in` (its residual into the
// stage's input first, past the first stage), then on the last stage the sampling over its
// tensor-parallel group. Returns what goes on: the step with the residual after this stage's
// layers, or from the last stage the tokens of its logit rows in row order. Other kinds pass
// through unchanged.
absl::StatusOr<Slot> Process(model::PagedGptForward& forward, comm::Communicator* tp,
                             const Slot& in) {
  if (in.kind != StepKind::kStep) return in;
  const model::InferenceWeights& w = forward.weights();
  ASSIGN_OR_RETURN(const StepMessage step, DecodeStep(in.payload, forward.options()));
  const int N = static_cast<int>(step.tokens.size());
  if (!w.first_stage()) {
    const std::span<float> input = forward.StageInput(N);
    if (in.residual.size() != input.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "serving pipeline: a residual of ", in.residual.size(), " floats for a step of ", N,
          " tokens of d_model ", w.config.d_model));
    }
    std::copy(in.residual.begin(), in.residual.end(), input.begin());
  } else if (!in.residual.empty()) {
    return absl::InvalidArgumentError("serving pipeline: a residual sent to the first stage");
  }
  ASSIGN_OR_RETURN(const std::span<const float> out, forward.Forward(step.View()));
  Slot next;
  if (!w.last_stage()) {
    next.kind = StepKind::kStep;
    next.payload = in.payload;
    next.residual.assign(out.begin(), out.end());
    return next;
  }
  next.kind = StepKind::kTokens;
  ASSIGN_OR_RETURN(next.payload, model::SampleVocabParallel(out, w.vocab_begin, w.vocab_end,
                                                            w.config.vocab, step.sampling, tp));
  return next;
}

// The tensor-parallel group to broadcast a stage's slots over (none for one rank).
comm::Communicator* StageGroup(const ServingGroups& groups) {
  return groups.tp != nullptr && groups.tp->size() > 1 ? groups.tp : nullptr;
}

// The pipeline ring (none without stages).
comm::Communicator* Ring(const ServingGroups& groups) {
  return groups.pp != nullptr && groups.pp->size() > 1 ? groups.pp : nullptr;
}

// After a stop went into the ring at the last turn: turns with idle slots until the stop comes
// back around (a rank of the first stage), or this stage's remaining `turns` (another stage: the
// stop reached stage s at the turn that ends P - s turns before the first stage's last). What
// arrives meanwhile is dropped: every request has ended.
absl::Status DrainRing(comm::Communicator& ring, const SlotLimits& limits, bool first_stage,
                       int turns) {
  for (int t = 0; first_stage || t < turns; ++t) {
    ASSIGN_OR_RETURN(const Slot in, TurnRing(ring, Slot{.kind = StepKind::kIdle}, limits));
    if (first_stage && in.kind == StepKind::kStop) return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<model::PagedCacheOptions> CacheOptionsFor(const model::ModelConfig& c,
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
    kernels::Backend& backend, ServingGroups groups) {
  const model::ModelConfig& c = weights.config;
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
                                                 .max_context = static_cast<int>(c.max_seq_len),
                                                 // A step in flight per pipeline stage.
                                                 .max_in_flight = weights.pp_size,
                                             }));
  if (weights.pp_size > 1 && (groups.pp == nullptr || groups.pp->size() != weights.pp_size ||
                              groups.pp->rank() != weights.stage)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the serving engine holds stage ", weights.stage, " of ", weights.pp_size,
        " but its pipeline group has ", groups.pp == nullptr ? 0 : groups.pp->size(), " ranks"));
  }
  ASSIGN_OR_RETURN(auto forward,
                   model::PagedGptForward::Create(weights, cache, backend, groups.ForwardTp()));
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
      slot_limits_(SlotLimits::For(forward_->options(), config_.d_model)),
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

void BatchingEngine::StopNow(absl::Status reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    stop_reason_ = std::move(reason);
  }
  cv_.notify_all();
  for (comm::Communicator* c : {groups_.world, groups_.tp, groups_.pp}) {
    if (c != nullptr) c->Abort();
  }
  if (worker_.joinable()) worker_.join();
}

absl::StatusOr<RequestId> BatchingEngine::Submit(GenerationRequest request,
                                                 StreamCallbacks callbacks) {
  const model::ModelConfig& c = config_;
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

Slot BatchingEngine::StepSlot(const StepPlan& plan) {
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
  std::lock_guard<std::mutex> lock(mu_);
  ++batching_.steps;
  batching_.prompt_tokens += prompt_tokens;
  batching_.preemptions += static_cast<int64_t>(plan.preempted.size());
  batching_.max_batch = std::max<int64_t>(batching_.max_batch, plan.entries.size());
  return Slot{.kind = StepKind::kStep, .payload = EncodeStep(step, step_sampling_)};
}

absl::Status BatchingEngine::Deliver(const StepPlan& plan, std::span<const int32_t> tokens) {
  scheduler_.Complete(plan);
  const auto sampled = std::count_if(plan.entries.begin(), plan.entries.end(),
                                     [](const StepEntry& e) { return e.sample; });
  if (static_cast<int64_t>(tokens.size()) != sampled) {
    return absl::InvalidArgumentError(absl::StrCat("serving: ", tokens.size(),
                                                   " tokens back for a step of ", sampled,
                                                   " sampled rows"));
  }
  int row = 0;
  for (const StepEntry& e : plan.entries) {
    if (!e.sample) continue;
    const int32_t token = tokens[row++];
    auto it = sequences_.find(e.id);
    if (it == sequences_.end()) continue;  // cancelled while its step was in flight
    Sequence& seq = it->second;
    if (token < 0 || token >= config_.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("serving: sampled token ", token,
                                                     " is outside the vocabulary of ",
                                                     config_.vocab));
    }
    const GenerationRequest& r = seq.request;
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
  return absl::OkStatus();
}

absl::Status BatchingEngine::Turn(Slot slot, StepPlan plan) {
  comm::Communicator* stage = StageGroup(groups_);
  comm::Communicator* ring = Ring(groups_);
  if (stage != nullptr) RETURN_IF_ERROR(BroadcastSlot(*stage, slot, slot_limits_));
  absl::StatusOr<Slot> out = Process(*forward_, groups_.tp, slot);
  if (!out.ok()) {
    if (ring != nullptr || stage != nullptr) return out.status();  // the group cannot go on
    // One rank: only these requests fail (the scheduler planned a step the model refuses: a bug).
    scheduler_.Complete(plan);
    for (const StepEntry& e : plan.entries) {
      Finish(e.id, absl::InternalError(absl::StrCat("serving step: ", out.status().message())),
             FinishReason::kStop);
    }
    return absl::OkStatus();
  }
  if (ring == nullptr) {  // one stage: the tokens are here
    if (plan.empty()) return absl::OkStatus();
    {
      std::lock_guard<std::mutex> lock(mu_);
      batching_.max_in_flight = 1;
    }
    return Deliver(plan, out->payload);
  }
  if (!plan.empty()) {
    in_flight_.push_back(std::move(plan));
    std::lock_guard<std::mutex> lock(mu_);
    batching_.max_in_flight =
        std::max<int64_t>(batching_.max_in_flight, static_cast<int64_t>(in_flight_.size()));
  }
  ASSIGN_OR_RETURN(const Slot back, TurnRing(*ring, *out, slot_limits_));
  if (back.kind == StepKind::kIdle) return absl::OkStatus();
  if (back.kind != StepKind::kTokens || in_flight_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "serving pipeline: the last stage sent a message of kind ", static_cast<int>(back.kind),
        " with ", in_flight_.size(), " steps in flight"));
  }
  const StepPlan done = std::move(in_flight_.front());
  in_flight_.pop_front();
  return Deliver(done, back.payload);
}

absl::Status BatchingEngine::StopReason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_reason_;
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
  const bool group = StageGroup(groups_) != nullptr || Ring(groups_) != nullptr;
  auto last_turn = Clock::now();
  bool stalled = false;  // the last plan was empty although sequences were there, none in flight
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A bounded wait, so a missed notification costs at most this long. With work in hand, or
      // steps in flight to move along the pipeline, the next turn starts at once.
      cv_.wait_for(lock, std::chrono::milliseconds(200), [this, stalled] {
        return stopping_ || !arrivals_.empty() || !cancels_.empty() || !in_flight_.empty() ||
               (!sequences_.empty() && !stalled);
      });
      if (stopping_) break;
    }
    TakeArrivals();
    StepPlan plan;
    if (scheduler_.in_flight() < scheduler_.limits().max_in_flight) plan = scheduler_.Schedule();
    stalled = plan.empty() && !sequences_.empty() && in_flight_.empty();
    absl::Status turned = absl::OkStatus();
    if (!plan.empty()) {
      Slot slot = StepSlot(plan);
      turned = Turn(std::move(slot), std::move(plan));
      last_turn = Clock::now();
    } else if (!in_flight_.empty() || (group && Clock::now() - last_turn >= kHeartbeat)) {
      turned = Turn(Slot{.kind = StepKind::kIdle}, StepPlan{});
      last_turn = Clock::now();
    }
    if (!turned.ok()) {
      // After StopNow the failure is its own abort: the requests get StopNow's reason below.
      if (StopReason().ok()) Fail(turned);
      group_failed_ = true;
      break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    in_scheduler_running_ = scheduler_.running();
    in_scheduler_waiting_ = scheduler_.waiting();
    batching_.kv_blocks_free = scheduler_.free_blocks();
  }
  // Stopping: every request still here or still arriving ends now, then the followers stop.
  std::deque<Sequence> arrived;
  {
    std::lock_guard<std::mutex> lock(mu_);
    arrived.swap(arrivals_);
  }
  const absl::Status stop_reason = StopReason();
  const absl::Status ending =
      stop_reason.ok() ? absl::UnavailableError("the engine is shutting down") : stop_reason;
  for (Sequence& seq : arrived) seq.callbacks.on_finish(ending, FinishReason::kStop);
  std::vector<RequestId> ids;
  for (const auto& [id, seq] : sequences_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (RequestId id : ids) Finish(id, ending, FinishReason::kStop);
  // After StopNow the communicators are aborted: no stop message can go.
  if (group_failed_ || !group || !stop_reason.ok()) return;
  Slot stop{.kind = StepKind::kStop};
  if (comm::Communicator* stage = StageGroup(groups_); stage != nullptr) {
    if (!BroadcastSlot(*stage, stop, slot_limits_).ok()) return;
  }
  if (comm::Communicator* ring = Ring(groups_); ring != nullptr) {
    if (TurnRing(*ring, stop, slot_limits_).ok()) {
      DrainRing(*ring, slot_limits_, /*first_stage=*/true, 0).IgnoreError();
    }
  }
}

absl::Status RunServingFollower(const model::InferenceWeights& weights,
                                const BatchingEngineOptions& options, kernels::Backend& backend,
                                ServingGroups groups) {
  if (groups.world == nullptr || groups.world->rank() == 0) {
    return absl::InvalidArgumentError(
        "a serving follower is a rank other than 0 of a group; rank 0 runs the engine");
  }
  ASSIGN_OR_RETURN(const model::PagedCacheOptions cache,
                   CacheOptionsFor(weights.config, options, weights.tp_size, weights.pp_size));
  ASSIGN_OR_RETURN(auto forward,
                   model::PagedGptForward::Create(weights, cache, backend, groups.ForwardTp()));
  const SlotLimits limits = SlotLimits::For(cache, weights.config.d_model);
  comm::Communicator* stage = StageGroup(groups);
  comm::Communicator* ring = Ring(groups);
  if (weights.pp_size > 1 &&
      (ring == nullptr || ring->size() != weights.pp_size || ring->rank() != weights.stage)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "serving follower: stage ", weights.stage, " of ", weights.pp_size,
        " without its pipeline group"));
  }
  if (weights.first_stage()) {
    // A rank of the leader's stage: each slot comes from the leader, then turns the ring.
    if (stage == nullptr) {
      return absl::InvalidArgumentError(
          "serving follower: a rank of the first stage needs the leader's tensor-parallel group");
    }
    for (;;) {
      Slot slot;
      RETURN_IF_ERROR(BroadcastSlot(*stage, slot, limits));
      ASSIGN_OR_RETURN(const Slot out, Process(*forward, groups.tp, slot));
      if (ring != nullptr) {
        // What comes back (the tokens) is the leader's; its counterpart here is not needed.
        RETURN_IF_ERROR(TurnRing(*ring, out, limits).status());
        if (slot.kind == StepKind::kStop) return DrainRing(*ring, limits, true, 0);
      } else if (slot.kind == StepKind::kStop) {
        return absl::OkStatus();
      }
    }
  }
  // A later stage: each turn it passes on what it computed of the slot the turn before brought.
  Slot held;
  for (;;) {
    ASSIGN_OR_RETURN(const Slot out, Process(*forward, groups.tp, held));
    ASSIGN_OR_RETURN(held, TurnRing(*ring, out, limits));
    if (held.kind == StepKind::kStop) {
      // Pass the stop on, then turn until the first stage has it back: P - s turns in all.
      RETURN_IF_ERROR(TurnRing(*ring, held, limits).status());
      return DrainRing(*ring, limits, false, weights.pp_size - weights.stage - 1);
    }
  }
}

}  // namespace shardline::serving
