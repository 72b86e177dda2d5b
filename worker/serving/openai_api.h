// The OpenAI-compatible API without HTTP: request parsing and validation, the plain chat form of
// models without a chat template (a model's own template is chat_template.h's), stop strings over
// streamed text, and the response, chunk and error JSON in OpenAI's shapes.
// Pure functions of their inputs (no clock, no sockets), so they can be unit-tested and fuzzed;
// http_server.cc wires them to the routes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace shardline::serving {

// An error as OpenAI sends it: {"error": {"message", "type", "param", "code"}} with this status.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field; empty: null
  std::string code;   // empty: null
};
// (GCC 12 warns on designated initializers that leave members out, hence a function.)
ApiError MakeApiError(int http_status, std::string message,
                      std::string type = "invalid_request_error", std::string param = "",
                      std::string code = "");
std::string ErrorJson(const ApiError& error);

// The error an engine's Submit status means: ResourceExhausted 429, Unavailable 503,
// InvalidArgument 400 (param: the request field its message starts with, if any), anything else
// 500.
ApiError ErrorFromStatus(const absl::Status& status);

enum class Endpoint { kCompletions, kChatCompletions };

// One message of a chat request, as the client sent it.
struct ChatMessage {
  std::string role;
  std::string content;
};

// The fields of a /v1/completions or /v1/chat/completions body that Shardline acts on.
struct CompletionParams {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // The text to encode: the completion's prompt, or (once chat_format.h's ChatFormat has made it
  // of `messages`) the chat's.
  std::string prompt;
  std::vector<ChatMessage> messages;  // chat: not empty; completions: empty
  std::optional<int32_t> max_tokens;  // unset: 16 for completions, the rest of the context for chat
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0 (or -1, as vLLM writes it): all tokens
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // at most 4, none empty
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
};

// The plain chat form, for Shardline's own GPT-2 checkpoints, which have no chat template: the
// messages become
//   "System: {content}\n" / "User: {content}\n" / "Assistant: {content}\n" for each message, then
//   "Assistant:" for the model to continue,
// and the chat request stops at "\nUser:" (besides its own stop strings), where the model would
// start writing the user's next turn. Sets params.prompt and adds the stop string; the 400 (naming
// the message) for a role other than system, user and assistant.
inline constexpr std::string_view kChatUserStop = "\nUser:";
std::optional<ApiError> ApplyPlainChatForm(CompletionParams& params);

// Parses and validates `body`. Errors (all 400) say where: the byte position of a JSON syntax
// error, the name of a field of the wrong type or with a value out of range or unsupported
// (n != 1, echo, logprobs, a non-string prompt, penalties, a message whose role or content is not a
// string). A chat request's prompt is left empty: its messages become one by the served model's
// ChatFormat (chat_format.h).
struct ParsedRequest {
  CompletionParams params;
  std::optional<ApiError> error;
};
ParsedRequest ParseCompletionRequest(std::string_view body, Endpoint endpoint);

// Fills in an unset max_tokens and checks that prompt + max_tokens fit in `max_context`
// positions; the 400 when they do not.
std::optional<ApiError> ResolveMaxTokens(CompletionParams& params, int64_t prompt_tokens,
                                         int64_t max_context);

// Turns the bytes of streamed tokens into text that is safe to send now: it holds back an
// incomplete UTF-8 sequence at the end and any tail that may be the start of a stop string, and
// ends the text at the first stop string (which is not included, as in OpenAI's API). Not
// thread-safe.
class StopTextAssembler {
 public:
  explicit StopTextAssembler(std::vector<std::string> stop) : stop_(std::move(stop)) {}
  // Adds one token's bytes; returns the text now releasable (maybe empty).
  std::string Append(std::string_view bytes);
  // Whether a stop string was seen: the request should end with finish_reason "stop".
  bool stopped() const { return stopped_; }
  // The text still held back, at the end of the request.
  std::string Flush();
  // All text released so far.
  const std::string& text() const { return released_; }

 private:
  std::string Release(size_t end);

  std::vector<std::string> stop_;
  std::string buffer_;    // every byte so far
  size_t emitted_ = 0;    // bytes of buffer_ released
  std::string released_;  // buffer_[0, emitted_)
  bool stopped_ = false;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// "cmpl-…" or "chatcmpl-…" ids, "text_completion" or "chat.completion" objects. Text that is not
// valid UTF-8 (a model may say anything) is sent with U+FFFD in place of the bad bytes.
std::string CompletionResponseJson(Endpoint endpoint, const std::string& id, int64_t created,
                                   const std::string& model, const std::string& text,
                                   const std::string& finish_reason, const Usage& usage);
// One streamed chunk ("text_completion" or "chat.completion.chunk"). For chat, `first` adds the
// assistant role to the delta. An empty finish_reason is null.
std::string CompletionChunkJson(Endpoint endpoint, const std::string& id, int64_t created,
                                const std::string& model, const std::string& text, bool first,
                                const std::string& finish_reason);
// The last chunk with include_usage: empty choices and the usage.
std::string UsageChunkJson(Endpoint endpoint, const std::string& id, int64_t created,
                           const std::string& model, const Usage& usage);
// GET /v1/models for the one model served.
std::string ModelsJson(const std::string& model, int64_t created);

// Server-sent events: "data: {json}\n\n", and the stream's end.
std::string SseEvent(std::string_view json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// "cmpl-" or "chatcmpl-" then `n` as 24 hex digits.
std::string CompletionId(Endpoint endpoint, uint64_t n);

}  // namespace shardline::serving
