#include "worker/serving/http_server.h"

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "spdlog/spdlog.h"
#include "worker/serving/openai_api.h"

namespace shardline::serving {
namespace {

using Clock = std::chrono::steady_clock;

// How often a waiting handler looks at its deadline, the server's stop and its client.
constexpr auto kPollInterval = std::chrono::milliseconds(50);

// What the engine's callbacks hand to the handler thread of one request.
struct RequestChannel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int32_t> tokens;  // guarded by mu
  bool finished = false;       // guarded by mu
  absl::Status status;         // guarded by mu
  FinishReason reason = FinishReason::kStop;
};

struct Metrics {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Gauge& running = prometheus::BuildGauge()
                                   .Name("shardline_serving_requests_running")
                                   .Help("Requests the engine is generating now")
                                   .Register(*registry)
                                   .Add({});
  prometheus::Gauge& waiting = prometheus::BuildGauge()
                                   .Name("shardline_serving_requests_waiting")
                                   .Help("Requests queued in the engine")
                                   .Register(*registry)
                                   .Add({});
  prometheus::Gauge& kv_blocks = prometheus::BuildGauge()
                                     .Name("shardline_serving_kv_cache_blocks")
                                     .Help("Blocks of the KV cache")
                                     .Register(*registry)
                                     .Add({});
  prometheus::Gauge& kv_blocks_used = prometheus::BuildGauge()
                                          .Name("shardline_serving_kv_cache_blocks_used")
                                          .Help("KV-cache blocks held by running sequences")
                                          .Register(*registry)
                                          .Add({});
  prometheus::Gauge& preemptions = prometheus::BuildGauge()
                                       .Name("shardline_serving_preemptions")
                                       .Help(
                                           "Sequences preempted (cache dropped, recomputed) "
                                           "since the engine started")
                                       .Register(*registry)
                                       .Add({});
  prometheus::Counter& tokens = prometheus::BuildCounter()
                                    .Name("shardline_serving_generated_tokens_total")
                                    .Help("Tokens generated for clients")
                                    .Register(*registry)
                                    .Add({});
  prometheus::Family<prometheus::Counter>& requests =
      prometheus::BuildCounter()
          .Name("shardline_serving_http_requests_total")
          .Help("HTTP requests by status code")
          .Register(*registry);
  prometheus::Histogram& ttft =
      prometheus::BuildHistogram()
          .Name("shardline_serving_time_to_first_token_seconds")
          .Help("From a request's arrival to its first generated token")
          .Register(*registry)
          .Add({}, prometheus::Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                           1, 2.5, 5, 10, 30});
  prometheus::Histogram& tpot =
      prometheus::BuildHistogram()
          .Name("shardline_serving_time_per_output_token_seconds")
          .Help("Between consecutive generated tokens of a request")
          .Register(*registry)
          .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                           0.1, 0.25, 0.5, 1});
};

void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  res.set_content(ErrorJson(error), "application/json");
}

// Compares in time independent of where the strings differ.
bool SameSecret(const std::string& given, const std::string& key) {
  if (given.size() != key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= given[i] ^ key[i];
  return diff == 0;
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, CompletionEngine& engine, const data::Tokenizer& tokenizer)
      : options_(std::move(options)),
        engine_(engine),
        tokenizer_(tokenizer),
        id_base_(std::random_device{}()),
        created_(static_cast<int64_t>(std::time(nullptr))) {}

  absl::Status Start();
  void Stop();
  int port() const { return port_; }
  const HttpServerOptions& options() const { return options_; }

 private:
  // Refuses a request the API does not take (a missing or wrong key, an unknown path, a wrong
  // method) with its error; false when it goes on to its handler.
  bool Refused(const httplib::Request& req, httplib::Response& res) const;
  void HandleCompletion(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  void HandleMetrics(httplib::Response& res);

  struct Running {
    Endpoint endpoint;
    std::string id;
    int64_t created;
    std::string model;
    int64_t prompt_tokens;
    bool include_usage;
    RequestId engine_id;
    std::shared_ptr<RequestChannel> channel;
    Clock::time_point deadline;
  };
  // Waits for tokens or the finish until `until`; false when that or the server's stop came
  // first.
  bool WaitForEvent(RequestChannel& channel, Clock::time_point until);
  void RespondWhole(Running run, StopTextAssembler assembler, httplib::Response& res);
  void RespondStream(Running run, StopTextAssembler assembler, httplib::Response& res);

  const HttpServerOptions options_;
  CompletionEngine& engine_;
  const data::Tokenizer& tokenizer_;
  const uint64_t id_base_;
  const int64_t created_;
  std::atomic<uint64_t> next_id_{0};
  std::atomic<bool> stopping_{false};
  // Shared with the engine's callbacks, which may outlive a request's handler.
  std::shared_ptr<Metrics> metrics_ = std::make_shared<Metrics>();
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
};

absl::Status HttpServer::Impl::Start() {
  const int threads = std::max(1, options_.threads);
  server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_.set_payload_max_length(options_.max_body_bytes);
  server_.set_read_timeout(std::chrono::seconds(10));
  server_.set_write_timeout(std::chrono::seconds(10));
  server_.set_keep_alive_timeout(5);
  // A streamed token is one small write: without this Nagle holds it until the client's delayed
  // ACK (~40 ms on a kept-alive connection).
  server_.set_tcp_nodelay(true);
  server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Refused(req, res)) HandleCompletion(req, res, Endpoint::kCompletions);
  });
  server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Refused(req, res)) HandleCompletion(req, res, Endpoint::kChatCompletions);
  });
  server_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (Refused(req, res)) return;
    res.set_content(ModelsJson(options_.model_name, created_), "application/json");
  });
  server_.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    if (Refused(req, res)) return;
    const bool ready = engine_.Ready() && !stopping_;
    res.status = ready ? 200 : 503;
    res.set_content(ready ? "ok\n" : "not ready\n", "text/plain");
  });
  server_.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Refused(req, res)) HandleMetrics(res);
  });
  // Every other path and method, after the routes above. Refused in a handler, never in httplib's
  // pre-routing handler: that runs before httplib reads a request's body, and a request answered
  // there leaves its body on a kept-alive connection, to be parsed as the next request.
  const auto refuse = [this](const httplib::Request& req, httplib::Response& res) {
    if (!Refused(req, res)) SendError(res, MakeApiError(405, req.method + " " + req.path));
  };
  server_.Get(".*", refuse);
  server_.Post(".*", refuse);
  server_.Put(".*", refuse);
  server_.Patch(".*", refuse);
  server_.Delete(".*", refuse);
  server_.Options(".*", refuse);
  // Errors httplib answers itself (a malformed request line, 413) get OpenAI's shape too.
  server_.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        SendError(res, MakeApiError(res.status, absl::StrCat("HTTP status ", res.status)));
        return httplib::Server::HandlerResponse::Handled;
      }));
  server_.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::error("serving: {} {}: {}", req.method, req.path, what);
        SendError(res, MakeApiError(500, "internal error: " + what, "internal_error"));
      });
  server_.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    metrics_->requests.Add({{"code", std::to_string(res.status)}}).Increment();
  });

  if (options_.port == 0) {
    port_ = server_.bind_to_any_port(options_.host);
    if (port_ <= 0) port_ = 0;
  } else {
    // A restarted serve job's leader takes its predecessor's port, which that one holds until it
    // has answered its open requests (the agent's stop grace, 500 ms): try for a while.
    const auto give_up = Clock::now() + std::chrono::seconds(3);
    bool bound = false;
    while (!(bound = server_.bind_to_port(options_.host, options_.port)) &&
           Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (bound) port_ = options_.port;
  }
  if (port_ == 0) {
    return absl::UnavailableError(absl::StrCat("serving: cannot listen on ", options_.host, ":",
                                               options_.port,
                                               " (in use for 3 s, or not an address here)"));
  }
  thread_ = std::thread([this] { server_.listen_after_bind(); });
  // stop() before the loop runs would be lost: wait until it does.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!server_.is_running()) {
    if (Clock::now() > deadline) {
      server_.stop();
      thread_.detach();
      return absl::DeadlineExceededError("serving: the HTTP server did not start within 5 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::OkStatus();
}

void HttpServer::Impl::Stop() {
  stopping_ = true;
  if (thread_.joinable()) {
    server_.stop();
    thread_.join();
  }
}

bool HttpServer::Impl::Refused(const httplib::Request& req, httplib::Response& res) const {
  static const std::map<std::string, std::string> kRoutes = {{"/v1/completions", "POST"},
                                                             {"/v1/chat/completions", "POST"},
                                                             {"/v1/models", "GET"},
                                                             {"/health", "GET"},
                                                             {"/metrics", "GET"}};
  const bool api = req.path.rfind("/v1/", 0) == 0;
  if (api && !options_.api_key.empty()) {
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) != 0 || !SameSecret(auth.substr(prefix.size()), options_.api_key)) {
      res.set_header("WWW-Authenticate", "Bearer");
      SendError(res, MakeApiError(401,
                                  auth.empty() ? "missing 'Authorization: Bearer' API key"
                                               : "incorrect API key",
                                  "invalid_request_error", "", "invalid_api_key"));
      return true;
    }
  }
  auto route = kRoutes.find(req.path);
  if (route == kRoutes.end()) {
    SendError(res, MakeApiError(404, absl::StrCat("no route ", req.path), "invalid_request_error",
                                "", "not_found"));
    return true;
  }
  if (req.method != route->second && !(req.method == "HEAD" && route->second == "GET")) {
    res.set_header("Allow", route->second);
    SendError(res, MakeApiError(405, absl::StrCat(req.path, " takes ", route->second, ", not ",
                                                  req.method)));
    return true;
  }
  return false;
}

void HttpServer::Impl::HandleMetrics(httplib::Response& res) {
  const EngineStats stats = engine_.Stats();
  metrics_->running.Set(static_cast<double>(stats.running));
  metrics_->waiting.Set(static_cast<double>(stats.waiting));
  metrics_->kv_blocks.Set(static_cast<double>(stats.kv_blocks));
  metrics_->kv_blocks_used.Set(static_cast<double>(stats.kv_blocks_used));
  metrics_->preemptions.Set(static_cast<double>(stats.preemptions));
  res.set_content(prometheus::TextSerializer().Serialize(metrics_->registry->Collect()),
                  "text/plain; version=0.0.4");
}

void HttpServer::Impl::HandleCompletion(const httplib::Request& req, httplib::Response& res,
                                        Endpoint endpoint) {
  const Clock::time_point arrival = Clock::now();
  ParsedRequest parsed = ParseCompletionRequest(req.body, endpoint);
  if (parsed.error) return SendError(res, *parsed.error);
  CompletionParams& p = parsed.params;
  if (p.model != options_.model_name) {
    return SendError(res, MakeApiError(404,
                                       absl::StrCat("the model '", p.model,
                                                    "' does not exist; this server has '",
                                                    options_.model_name, "'"),
                                       "invalid_request_error", "model", "model_not_found"));
  }
  if (endpoint == Endpoint::kChatCompletions) {
    if (auto e = options_.chat.Apply(p)) return SendError(res, *e);
  }
  if (!engine_.Ready() || stopping_) {
    return SendError(res, ErrorFromStatus(absl::UnavailableError("the engine is not ready")));
  }
  GenerationRequest request;
  // A chat template writes the model's special tokens as text ("<|begin_of_text|>"), which Encode
  // turns into their ids without adding any of its own: the prompt has the one BOS the template
  // wrote. Anything else gets the special tokens the tokenizer puts before a text (Llama's BOS),
  // as vLLM encodes a completion's prompt.
  const bool templated =
      endpoint == Endpoint::kChatCompletions && options_.chat.chat_template() != nullptr;
  request.prompt =
      templated ? tokenizer_.Encode(p.prompt) : tokenizer_.EncodeWithSpecials(p.prompt);
  if (auto e =
          ResolveMaxTokens(p, static_cast<int64_t>(request.prompt.size()), engine_.max_context())) {
    return SendError(res, *e);
  }
  request.max_tokens = *p.max_tokens;
  request.temperature = p.temperature;
  request.top_p = p.top_p;
  request.top_k = p.top_k;
  request.seed = p.seed.has_value() ? *p.seed : std::random_device{}();
  request.stop_token_ids = tokenizer_.stop_tokens();

  auto channel = std::make_shared<RequestChannel>();
  // Timing state for the histograms, touched only on the engine's thread.
  auto last_token = std::make_shared<std::optional<Clock::time_point>>();
  StreamCallbacks callbacks;
  callbacks.on_token = [metrics = metrics_, channel, last_token, arrival](int32_t token) {
    const Clock::time_point now = Clock::now();
    const Clock::time_point since = last_token->value_or(arrival);
    (last_token->has_value() ? metrics->tpot : metrics->ttft)
        .Observe(std::chrono::duration<double>(now - since).count());
    *last_token = now;
    metrics->tokens.Increment();
    {
      std::lock_guard<std::mutex> lock(channel->mu);
      channel->tokens.push_back(token);
    }
    channel->cv.notify_all();
  };
  callbacks.on_finish = [channel](absl::Status status, FinishReason reason) {
    {
      std::lock_guard<std::mutex> lock(channel->mu);
      channel->finished = true;
      channel->status = std::move(status);
      channel->reason = reason;
    }
    channel->cv.notify_all();
  };
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  absl::StatusOr<RequestId> id = engine_.Submit(std::move(request), std::move(callbacks));
  if (!id.ok()) return SendError(res, ErrorFromStatus(id.status()));

  Running run{.endpoint = endpoint,
              .id = CompletionId(endpoint, id_base_ + next_id_.fetch_add(1)),
              .created = static_cast<int64_t>(std::time(nullptr)),
              .model = options_.model_name,
              .prompt_tokens = prompt_tokens,
              .include_usage = p.include_usage,
              .engine_id = *id,
              .channel = channel,
              .deadline = arrival + options_.request_timeout};
  StopTextAssembler assembler(p.stop);
  if (p.stream) {
    RespondStream(std::move(run), std::move(assembler), res);
  } else {
    RespondWhole(std::move(run), std::move(assembler), res);
  }
}

bool HttpServer::Impl::WaitForEvent(RequestChannel& channel, Clock::time_point until) {
  std::unique_lock<std::mutex> lock(channel.mu);
  while (channel.tokens.empty() && !channel.finished) {
    if (stopping_ || Clock::now() >= until) return false;
    channel.cv.wait_for(lock, kPollInterval);
  }
  return true;
}

namespace {

// Takes what the engine has delivered so far. `bytes` gets the decoded text of the tokens.
struct Drained {
  std::string text;  // releasable now
  int64_t tokens = 0;
  bool finished = false;
  absl::Status status;
  FinishReason reason = FinishReason::kStop;
};

Drained Drain(RequestChannel& channel, const data::Tokenizer& tokenizer,
              StopTextAssembler& assembler) {
  std::deque<int32_t> tokens;
  Drained d;
  {
    std::lock_guard<std::mutex> lock(channel.mu);
    tokens.swap(channel.tokens);
    d.finished = channel.finished;
    d.status = channel.status;
    d.reason = channel.reason;
  }
  for (int32_t token : tokens) {
    if (assembler.stopped()) break;
    ++d.tokens;
    const std::vector<int32_t> one = {token};
    // A continuation of the prompt: Llama 2's decoder would drop a first word's space.
    absl::StatusOr<std::string> bytes = tokenizer.DecodeContinuation(one);
    if (!bytes.ok()) {
      d.finished = true;
      d.status = absl::InternalError(
          absl::StrCat("decoding token ", token, ": ", bytes.status().message()));
      return d;
    }
    d.text += assembler.Append(*bytes);
  }
  return d;
}

std::string FinishName(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
}

ApiError FailureOf(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kCancelled) {
    return ErrorFromStatus(absl::UnavailableError("the request was cancelled (server stopping)"));
  }
  return ErrorFromStatus(status);
}

}  // namespace

void HttpServer::Impl::RespondWhole(Running run, StopTextAssembler assembler,
                                    httplib::Response& res) {
  std::string text;
  int64_t completion_tokens = 0;
  for (;;) {
    if (!WaitForEvent(*run.channel, run.deadline)) {
      engine_.Cancel(run.engine_id);
      if (stopping_) {
        return SendError(res, ErrorFromStatus(absl::UnavailableError("the server is stopping")));
      }
      return SendError(res, MakeApiError(504,
                                         absl::StrCat("the request did not finish within ",
                                                      options_.request_timeout.count(), " s"),
                                         "timeout"));
    }
    Drained d = Drain(*run.channel, tokenizer_, assembler);
    text += d.text;
    completion_tokens += d.tokens;
    std::string finish;
    if (assembler.stopped()) {
      engine_.Cancel(run.engine_id);
      finish = "stop";
    } else if (d.finished) {
      if (!d.status.ok()) return SendError(res, FailureOf(d.status));
      text += assembler.Flush();
      finish = FinishName(d.reason);
    } else {
      continue;
    }
    res.set_content(CompletionResponseJson(run.endpoint, run.id, run.created, run.model, text,
                                           finish, Usage{run.prompt_tokens, completion_tokens}),
                    "application/json");
    return;
  }
}

void HttpServer::Impl::RespondStream(Running run, StopTextAssembler assembler,
                                     httplib::Response& res) {
  struct State {
    Running run;
    StopTextAssembler assembler;
    int64_t completion_tokens = 0;
    bool first = true;
    bool done = false;
  };
  auto state = std::make_shared<State>(State{std::move(run), std::move(assembler)});
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, state](size_t, httplib::DataSink& sink) {
        State& s = *state;
        const Running& r = s.run;
        // A failed write or a closed peer: the client is gone. Returning false makes httplib drop
        // the connection; the releaser below cancels the request.
        auto send = [&sink](const std::string& event) {
          return sink.is_writable() && sink.write(event.data(), event.size());
        };
        if (s.first && r.endpoint == Endpoint::kChatCompletions) {
          s.first = false;
          if (!send(SseEvent(
                  CompletionChunkJson(r.endpoint, r.id, r.created, r.model, "", true, "")))) {
            return false;
          }
        }
        s.first = false;
        // A short wait, so that a client that left is noticed between tokens.
        const Clock::time_point until =
            std::min(r.deadline, Clock::now() + std::chrono::milliseconds(200));
        if (!WaitForEvent(*r.channel, until)) {
          if (!stopping_ && Clock::now() < r.deadline) return sink.is_writable();
          const ApiError error =
              stopping_ ? ErrorFromStatus(absl::UnavailableError("the server is stopping"))
                        : MakeApiError(504, "the request did not finish in time", "timeout");
          send(SseEvent(ErrorJson(error)));
          send(std::string(kSseDone));
          s.done = true;
          sink.done();
          return true;
        }
        Drained d = Drain(*r.channel, tokenizer_, s.assembler);
        s.completion_tokens += d.tokens;
        std::string finish;
        if (s.assembler.stopped()) {
          finish = "stop";
        } else if (d.finished && d.status.ok()) {
          d.text += s.assembler.Flush();
          finish = FinishName(d.reason);
        }
        if (!d.text.empty() && !send(SseEvent(CompletionChunkJson(r.endpoint, r.id, r.created,
                                                                  r.model, d.text, false, "")))) {
          return false;
        }
        if (finish.empty() && !d.finished) return true;
        if (finish.empty()) {
          send(SseEvent(ErrorJson(FailureOf(d.status))));
        } else {
          if (!send(SseEvent(
                  CompletionChunkJson(r.endpoint, r.id, r.created, r.model, "", false, finish)))) {
            return false;
          }
          if (r.include_usage &&
              !send(SseEvent(UsageChunkJson(r.endpoint, r.id, r.created, r.model,
                                            Usage{r.prompt_tokens, s.completion_tokens})))) {
            return false;
          }
        }
        s.done = true;
        send(std::string(kSseDone));
        sink.done();
        return true;
      },
      [this, state](bool) {
        // Whatever ended the stream (done, a stop string, a vanished client, the server's stop):
        // the engine need not go on. A no-op for a finished request.
        engine_.Cancel(state->run.engine_id);
      });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              CompletionEngine& engine,
                                                              const data::Tokenizer& tokenizer) {
  auto impl = std::make_unique<Impl>(std::move(options), engine, tokenizer);
  if (absl::Status status = impl->Start(); !status.ok()) return status;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::Stop() { impl_->Stop(); }

int HttpServer::port() const { return impl_->port(); }

std::string HttpServer::url() const {
  return absl::StrCat("http://", impl_->options().host, ":", impl_->port());
}

}  // namespace shardline::serving
