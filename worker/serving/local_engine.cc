#include "worker/serving/local_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/model/inference.h"

namespace shardline::serving {

LocalEngine::LocalEngine(const model::GptModel& model, LocalEngineOptions options)
    : model_(model), options_(options), worker_([this] { Run(); }) {}

LocalEngine::~LocalEngine() { Shutdown(); }

void LocalEngine::Shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (running_) running_->cancelled = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (const auto& job : dropped) {
    job->callbacks.on_finish(absl::UnavailableError("the engine is shutting down"),
                             FinishReason::kStop);
  }
  if (worker_.joinable()) worker_.join();
}

absl::StatusOr<RequestId> LocalEngine::Submit(GenerationRequest request,
                                              StreamCallbacks callbacks) {
  const model::GptConfig& c = model_.config();
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
  if (request.top_p != 1.0f) {
    return absl::InvalidArgumentError("top_p: only 1 is supported by the local engine");
  }
  if (request.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", request.top_k));
  }
  auto job = std::make_shared<Job>();
  job->request = std::move(request);
  job->callbacks = std::move(callbacks);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the engine is shutting down");
    if (static_cast<int>(queue_.size()) >= options_.max_queue) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the queue is full (", options_.max_queue, " requests wait); try again later"));
    }
    job->id = next_id_++;
    queue_.push_back(job);
  }
  cv_.notify_all();
  return job->id;
}

void LocalEngine::Cancel(RequestId id) {
  std::shared_ptr<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_ && running_->id == id) {
      running_->cancelled = true;
      return;
    }
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [id](const std::shared_ptr<Job>& j) { return j->id == id; });
    if (it == queue_.end()) return;
    dropped = *it;
    queue_.erase(it);
  }
  dropped->callbacks.on_finish(absl::CancelledError("cancelled"), FinishReason::kStop);
}

bool LocalEngine::Ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !stopping_;
}

EngineStats LocalEngine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return EngineStats{.running = running_ ? 1 : 0,
                     .waiting = static_cast<int64_t>(queue_.size()),
                     .tokens_generated = tokens_generated_.load()};
}

void LocalEngine::Run() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A bounded wait, so a missed notification costs at most this long.
      cv_.wait_for(lock, std::chrono::milliseconds(200),
                   [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      if (queue_.empty()) continue;
      job = queue_.front();
      queue_.pop_front();
      running_ = job;
    }
    RunJob(*job);
    std::lock_guard<std::mutex> lock(mu_);
    running_.reset();
  }
}

void LocalEngine::RunJob(Job& job) {
  const GenerationRequest& r = job.request;
  model::GenerateOptions options;
  options.max_new_tokens = r.max_tokens;
  options.sampling.temperature = r.temperature;
  options.sampling.top_k = r.top_k;
  options.sampling.seed = r.seed;
  options.use_kv_cache = options_.use_kv_cache;
  bool hit_stop_token = false;
  const absl::StatusOr<int> generated = model::GenerateStreaming(
      model_, r.prompt, options, [&](int32_t token) {
        if (job.cancelled) return false;
        tokens_generated_.fetch_add(1);
        if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) !=
            r.stop_token_ids.end()) {
          hit_stop_token = true;
          return false;
        }
        job.callbacks.on_token(token);
        return !job.cancelled.load();
      });
  if (!generated.ok()) {
    job.callbacks.on_finish(generated.status(), FinishReason::kStop);
  } else if (job.cancelled) {
    job.callbacks.on_finish(absl::CancelledError("cancelled"), FinishReason::kStop);
  } else {
    job.callbacks.on_finish(absl::OkStatus(),
                            hit_stop_token ? FinishReason::kStop : FinishReason::kLength);
  }
}

}  // namespace shardline::serving
