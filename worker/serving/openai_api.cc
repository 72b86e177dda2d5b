#include "worker/serving/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace shardline::serving {
namespace {

using nlohmann::json;

// Model output may be any bytes: replace what is not UTF-8 rather than throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json NullOr(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

ApiError BadField(const std::string& field, const std::string& message) {
  return MakeApiError(400, message, "invalid_request_error", field);
}

const char* TypeName(const json& j) {
  return j.type_name();  // "string", "number", "object", ...
}

// Reads optional field `name` of `body` into `out` when present and not null.
std::optional<ApiError> ReadNumber(const json& body, const char* name, double* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    return BadField(name, absl::StrCat("'", name, "' must be a number, got ", TypeName(*it)));
  }
  *out = it->get<double>();
  if (!std::isfinite(*out)) return BadField(name, absl::StrCat("'", name, "' must be finite"));
  return std::nullopt;
}

std::optional<ApiError> ReadInteger(const json& body, const char* name, int64_t* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) {
    return BadField(name, absl::StrCat("'", name, "' must be an integer, got ",
                                       it->is_number() ? "a fraction" : TypeName(*it)));
  }
  if (it->is_number_unsigned() &&
      it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return BadField(name, absl::StrCat("'", name, "' is too large"));
  }
  *out = it->get<int64_t>();
  return std::nullopt;
}

std::optional<ApiError> ReadBool(const json& body, const char* name, bool* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) {
    return BadField(name, absl::StrCat("'", name, "' must be a boolean, got ", TypeName(*it)));
  }
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> ReadStop(const json& body, std::vector<std::string>* out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  std::vector<json> items;
  if (it->is_string()) {
    items.push_back(*it);
  } else if (it->is_array()) {
    items.assign(it->begin(), it->end());
  } else {
    return BadField(
        "stop", absl::StrCat("'stop' must be a string or a list of strings, got ", TypeName(*it)));
  }
  if (items.size() > 4) {
    return BadField("stop", absl::StrCat("'stop' holds at most 4 strings, got ", items.size()));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      return BadField("stop",
                      absl::StrCat("'stop[", i, "]' must be a string, got ", TypeName(items[i])));
    }
    std::string s = items[i].get<std::string>();
    if (s.empty()) return BadField("stop", absl::StrCat("'stop[", i, "]' is empty"));
    out->push_back(std::move(s));
  }
  return std::nullopt;
}

// Fields OpenAI defines that Shardline does not implement: refused unless they ask for nothing.
std::optional<ApiError> RefuseUnsupported(const json& body) {
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    auto it = body.find(name);
    if (it != body.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0.0)) {
      return BadField(name, absl::StrCat("'", name, "' is not supported (only 0)"));
    }
  }
  for (const char* name : {"echo", "logprobs"}) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    if (it->is_boolean() && !it->get<bool>()) continue;
    return BadField(name, absl::StrCat("'", name, "' is not supported"));
  }
  for (const char* name : {"logit_bias", "suffix", "tools", "functions", "response_format"}) {
    auto it = body.find(name);
    if (it != body.end() && !it->is_null()) {
      return BadField(name, absl::StrCat("'", name, "' is not supported"));
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ReadChatMessages(const json& body, std::vector<ChatMessage>* messages) {
  auto it = body.find("messages");
  if (it == body.end()) return BadField("messages", "'messages' is required");
  if (!it->is_array() || it->empty()) {
    return BadField("messages", "'messages' must be a non-empty list of messages");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return BadField("messages", where + " must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return BadField("messages", where + ".role must be a string");
    }
    auto content = m.find("content");
    if (content == m.end() || !content->is_string()) {
      return BadField("messages", where +
                                      ".content must be a string (lists of parts are not "
                                      "supported)");
    }
    messages->push_back({role->get<std::string>(), content->get<std::string>()});
  }
  return std::nullopt;
}

ParsedRequest Fail(ApiError error) {
  ParsedRequest r;
  r.error = std::move(error);
  return r;
}

// The length of the longest proper prefix of any stop string that `text` ends with.
size_t StopPrefixTail(std::string_view text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& stop : stops) {
    for (size_t k = std::min(stop.size() - 1, text.size()); k > best; --k) {
      if (text.substr(text.size() - k) == std::string_view(stop).substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

// Where an incomplete UTF-8 sequence at the end of `text` starts (text.size() when none).
size_t CompleteUtf8End(std::string_view text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    // 0xF8..0xFF never start a sequence: nothing to wait for.
    const size_t need = c >= 0xF8 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return back < need ? n - back : n;
  }
  return n;
}

json BaseObject(const std::string& id, const char* object, int64_t created,
                const std::string& model) {
  return json{{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

json UsageJson(const Usage& usage) {
  return json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

}  // namespace

ApiError MakeApiError(int http_status, std::string message, std::string type, std::string param,
                      std::string code) {
  ApiError e;
  e.http_status = http_status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

std::string ErrorJson(const ApiError& error) {
  return Dump(json{{"error",
                    {{"message", error.message},
                     {"type", error.type},
                     {"param", NullOr(error.param)},
                     {"code", NullOr(error.code)}}}});
}

ApiError ErrorFromStatus(const absl::Status& status) {
  const std::string message = ToString(status.message());
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted:
      return MakeApiError(429, message, "rate_limit_error");
    case absl::StatusCode::kUnavailable:
      return MakeApiError(503, message, "service_unavailable");
    case absl::StatusCode::kInvalidArgument: {
      // Engines start the message with the field ("top_p: only 1 is supported").
      const std::string word = message.substr(0, message.find_first_of(": "));
      const bool field = word == "prompt" || word == "max_tokens" || word == "temperature" ||
                         word == "top_p" || word == "top_k" || word == "seed";
      return MakeApiError(400, message, "invalid_request_error", field ? word : "");
    }
    default:
      return MakeApiError(500, message, "internal_error");
  }
}

ParsedRequest ParseCompletionRequest(std::string_view body, Endpoint endpoint) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::parse_error& e) {
    return Fail(MakeApiError(
        400, absl::StrCat("the body is not valid JSON (at byte ", e.byte, "): ", e.what())));
  } catch (const json::exception& e) {
    // A number past double's range ("1e400") is out_of_range, not a parse_error.
    return Fail(MakeApiError(400, absl::StrCat("the body is not valid JSON: ", e.what())));
  }
  if (!j.is_object()) {
    return Fail(
        MakeApiError(400, absl::StrCat("the body must be a JSON object, got ", TypeName(j))));
  }
  ParsedRequest out;
  CompletionParams& p = out.params;
  p.endpoint = endpoint;

  auto model = j.find("model");
  if (model == j.end()) return Fail(BadField("model", "'model' is required"));
  if (!model->is_string()) {
    return Fail(
        BadField("model", absl::StrCat("'model' must be a string, got ", TypeName(*model))));
  }
  p.model = model->get<std::string>();

  if (endpoint == Endpoint::kCompletions) {
    auto prompt = j.find("prompt");
    if (prompt == j.end()) return Fail(BadField("prompt", "'prompt' is required"));
    if (!prompt->is_string()) {
      return Fail(BadField("prompt", absl::StrCat("'prompt' must be a string (lists and token "
                                                  "ids are not supported), got ",
                                                  TypeName(*prompt))));
    }
    p.prompt = prompt->get<std::string>();
    if (p.prompt.empty()) return Fail(BadField("prompt", "'prompt' is empty"));
  } else if (auto e = ReadChatMessages(j, &p.messages)) {
    return Fail(*e);
  }
  if (auto e = RefuseUnsupported(j)) return Fail(*e);

  // Chat's newer name for it wins, as in OpenAI's API.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    int64_t max_tokens = -1;
    if (auto e = ReadInteger(j, name, &max_tokens)) return Fail(*e);
    if (max_tokens == -1) continue;
    if (max_tokens < 1 || max_tokens > std::numeric_limits<int32_t>::max()) {
      return Fail(BadField(name, absl::StrCat("'", name, "' must be >= 1, got ", max_tokens)));
    }
    p.max_tokens = static_cast<int32_t>(max_tokens);
  }
  double temperature = 1.0;
  if (auto e = ReadNumber(j, "temperature", &temperature)) return Fail(*e);
  if (temperature < 0 || temperature > 2) {
    return Fail(BadField("temperature",
                         absl::StrCat("'temperature' must be in [0, 2], got ", temperature)));
  }
  p.temperature = static_cast<float>(temperature);
  double top_p = 1.0;
  if (auto e = ReadNumber(j, "top_p", &top_p)) return Fail(*e);
  // Sampling runs in fp32, where a top_p below about 1e-45 is 0: a nucleus of no token.
  const bool in_range = top_p > 0 && top_p <= 1;
  if (!in_range || static_cast<float>(top_p) == 0.0f) {
    return Fail(BadField("top_p", absl::StrCat("'top_p' must be in (0, 1], got ", top_p,
                                               in_range ? " (0 as a 32-bit float)" : "")));
  }
  p.top_p = static_cast<float>(top_p);
  int64_t top_k = 0;
  if (auto e = ReadInteger(j, "top_k", &top_k)) return Fail(*e);
  if (top_k < -1 || top_k > std::numeric_limits<int32_t>::max()) {
    return Fail(
        BadField("top_k", absl::StrCat("'top_k' must be -1, 0 (all) or >= 1, got ", top_k)));
  }
  p.top_k = top_k == -1 ? 0 : static_cast<int32_t>(top_k);
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) {
      return Fail(BadField("seed", absl::StrCat("'seed' must be an integer, got ",
                                                it->is_number() ? "a fraction" : TypeName(*it))));
    }
    p.seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  int64_t n = 1;
  if (auto e = ReadInteger(j, "n", &n)) return Fail(*e);
  if (n != 1) return Fail(BadField("n", absl::StrCat("only 'n' = 1 is supported, got ", n)));
  int64_t best_of = 1;
  if (auto e = ReadInteger(j, "best_of", &best_of)) return Fail(*e);
  if (best_of != 1) {
    return Fail(
        BadField("best_of", absl::StrCat("only 'best_of' = 1 is supported, got ", best_of)));
  }
  if (auto e = ReadStop(j, &p.stop)) return Fail(*e);
  if (auto e = ReadBool(j, "stream", &p.stream)) return Fail(*e);
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      return Fail(BadField("stream_options", "'stream_options' must be an object"));
    }
    if (!p.stream) {
      return Fail(BadField("stream_options", "'stream_options' needs 'stream': true"));
    }
    if (auto e = ReadBool(*it, "include_usage", &p.include_usage)) {
      e->param = "stream_options";
      return Fail(*e);
    }
  }
  return out;
}

std::optional<ApiError> ApplyPlainChatForm(CompletionParams& params) {
  std::string prompt;
  for (size_t i = 0; i < params.messages.size(); ++i) {
    const ChatMessage& m = params.messages[i];
    const char* label = m.role == "system"      ? "System"
                        : m.role == "user"      ? "User"
                        : m.role == "assistant" ? "Assistant"
                                                : nullptr;
    if (label == nullptr) {
      return BadField("messages", absl::StrCat("messages[", i, "].role '", m.role,
                                               "' is not one of system, user, assistant"));
    }
    absl::StrAppend(&prompt, label, ": ", m.content, "\n");
  }
  absl::StrAppend(&prompt, "Assistant:");
  params.prompt = std::move(prompt);
  params.stop.push_back(std::string(kChatUserStop));
  return std::nullopt;
}

std::optional<ApiError> ResolveMaxTokens(CompletionParams& params, int64_t prompt_tokens,
                                         int64_t max_context) {
  if (prompt_tokens >= max_context) {
    return BadField(
        params.endpoint == Endpoint::kCompletions ? "prompt" : "messages",
        absl::StrCat("the prompt is ", prompt_tokens, " tokens; this model's context is ",
                     max_context, " tokens, and at least one must be left to generate"));
  }
  if (!params.max_tokens.has_value()) {
    const int64_t rest = max_context - prompt_tokens;
    params.max_tokens = static_cast<int32_t>(
        params.endpoint == Endpoint::kCompletions ? std::min<int64_t>(16, rest) : rest);
    return std::nullopt;
  }
  if (prompt_tokens + *params.max_tokens > max_context) {
    return BadField("max_tokens",
                    absl::StrCat("the prompt (", prompt_tokens, " tokens) plus max_tokens (",
                                 *params.max_tokens, ") is past this model's context of ",
                                 max_context, " tokens"));
  }
  return std::nullopt;
}

std::string StopTextAssembler::Release(size_t end) {
  std::string out = buffer_.substr(emitted_, end - emitted_);
  emitted_ = end;
  released_ += out;
  return out;
}

std::string StopTextAssembler::Append(std::string_view bytes) {
  if (stopped_) return "";
  buffer_.append(bytes.data(), bytes.size());
  size_t longest = 0;
  for (const std::string& s : stop_) longest = std::max(longest, s.size());
  // A stop string can only be found where it overlaps the new bytes or the held-back tail.
  const size_t from = emitted_ > longest ? emitted_ - longest : 0;
  size_t first = std::string::npos;
  for (const std::string& s : stop_) first = std::min(first, buffer_.find(s, from));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = Release(std::max(first, emitted_));
    buffer_.resize(emitted_);
    return out;
  }
  const size_t tail = StopPrefixTail(buffer_, stop_);
  const size_t end = std::min(buffer_.size() - tail, CompleteUtf8End(buffer_));
  return end > emitted_ ? Release(end) : "";
}

std::string StopTextAssembler::Flush() {
  if (stopped_) return "";
  return Release(buffer_.size());
}

std::string CompletionResponseJson(Endpoint endpoint, const std::string& id, int64_t created,
                                   const std::string& model, const std::string& text,
                                   const std::string& finish_reason, const Usage& usage) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  json j = BaseObject(id, chat ? "chat.completion" : "text_completion", created, model);
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", NullOr(finish_reason)}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string CompletionChunkJson(Endpoint endpoint, const std::string& id, int64_t created,
                                const std::string& model, const std::string& text, bool first,
                                const std::string& finish_reason) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  json j = BaseObject(id, chat ? "chat.completion.chunk" : "text_completion", created, model);
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", NullOr(finish_reason)}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  return Dump(j);
}

std::string UsageChunkJson(Endpoint endpoint, const std::string& id, int64_t created,
                           const std::string& model, const Usage& usage) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  json j = BaseObject(id, chat ? "chat.completion.chunk" : "text_completion", created, model);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string ModelsJson(const std::string& model, int64_t created) {
  return Dump(json{{"object", "list"},
                   {"data", json::array({json{{"id", model},
                                              {"object", "model"},
                                              {"created", created},
                                              {"owned_by", "shardline"}}})}});
}

std::string SseEvent(std::string_view json_text) {
  return absl::StrCat("data: ", absl::string_view(json_text.data(), json_text.size()), "\n\n");
}

std::string CompletionId(Endpoint endpoint, uint64_t n) {
  char hex[25];
  std::snprintf(hex, sizeof(hex), "%024llx", static_cast<unsigned long long>(n));
  return absl::StrCat(endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", hex);
}

}  // namespace shardline::serving
