// The OpenAI-compatible HTTP server (cpp-httplib) in front of a CompletionEngine:
//   POST /v1/completions, POST /v1/chat/completions (streamed as server-sent events or not),
//   GET /v1/models, GET /health (200 when the engine is ready, else 503), GET /metrics
//   (Prometheus text).
// Requests are parsed by openai_api.h; a chat request's messages become its prompt by the model's
// ChatFormat (chat_format.h: its own template, or the plain form); the prompt is encoded and the
// tokens decoded here, with `tokenizer`, and stop strings are matched here on the decoded text. A
// streaming client that goes away cancels its request in the engine. Every wait is bounded by
// request_timeout.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/data/tokenizer.h"
#include "worker/serving/chat_format.h"
#include "worker/serving/engine.h"

namespace shardline::serving {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                         // 0: an ephemeral port (see port())
  std::string model_name = "shardline";  // the one name /v1/models lists and requests must give
  std::string api_key;                   // non-empty: /v1/* needs "Authorization: Bearer KEY"
  std::chrono::seconds request_timeout{600};  // a request still running then fails (504)
  int threads = 8;                        // connections served at once (each stream holds one)
  size_t max_body_bytes = size_t{1} << 20;  // larger bodies get 413
  // How chat messages become the prompt (ChatFormatFor decides it for a model's folder).
  ChatFormat chat = ChatFormat::PlainText();
};

class HttpServer {
 public:
  // Binds and starts serving on a thread of its own. `engine` and `tokenizer` must outlive the
  // server. Unavailable naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           CompletionEngine& engine,
                                                           const data::Tokenizer& tokenizer);
  // Stop().
  ~HttpServer();

  // Stops accepting, ends open streams within a fraction of a second (cancelling their requests)
  // and joins the server's threads. Idempotent; not from a handler.
  void Stop();

  int port() const;
  std::string url() const;  // "http://host:port"

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardline::serving
