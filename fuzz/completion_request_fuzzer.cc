// The serving API's request parser (worker/serving/openai_api.h) on arbitrary HTTP bodies, for
// both /v1/completions and /v1/chat/completions: ParseCompletionRequest must answer a 400 whose
// JSON is well-formed, or parameters inside the ranges it documents (a chat's prompt made by the
// plain chat form). What an accepted request
// then drives without a model runs too: ResolveMaxTokens, and the stop strings over the prompt's
// own bytes (StopTextAssembler must release exactly the text before the first stop string it
// sees whole, however the bytes are cut).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "nlohmann/json.hpp"
#include "worker/serving/openai_api.h"

namespace {

using shardline::serving::CompletionParams;
using shardline::serving::Endpoint;
using shardline::serving::ParsedRequest;

// What a stop-aware stream must deliver when `text` arrives in pieces of `chunk` bytes: the text
// before the earliest stop string of the first prefix (up to a piece's end) that holds one
// complete, as a server that generates token by token stops at the first stop string it sees
// whole; all the text when none appears.
std::string ReferenceStream(const std::string& text, const std::vector<std::string>& stops,
                            size_t chunk) {
  for (size_t end = std::min(chunk, text.size());; end = std::min(end + chunk, text.size())) {
    const std::string_view seen = std::string_view(text).substr(0, end);
    size_t first = std::string_view::npos;
    for (const std::string& stop : stops) first = std::min(first, seen.find(stop));
    if (first != std::string_view::npos) return text.substr(0, first);
    if (end == text.size()) return text;
  }
}

void CheckAccepted(CompletionParams params) {
  FUZZ_CHECK(!params.prompt.empty(), "an accepted request with an empty prompt");
  FUZZ_CHECK(params.temperature >= 0 && params.temperature <= 2, "temperature out of range");
  FUZZ_CHECK(params.top_p > 0 && params.top_p <= 1, "top_p out of range");
  FUZZ_CHECK(params.top_k >= 0, "negative top_k");
  FUZZ_CHECK(!params.max_tokens || *params.max_tokens >= 1, "max_tokens below 1");
  const size_t own_stops = params.endpoint == Endpoint::kChatCompletions ? 5 : 4;
  FUZZ_CHECK(params.stop.size() <= own_stops, "more stop strings than allowed");
  for (const std::string& stop : params.stop) FUZZ_CHECK(!stop.empty(), "an empty stop string");
  FUZZ_CHECK(!params.include_usage || params.stream, "include_usage without stream");

  // A context exactly as long as the prompt's bytes, and one with room left.
  const int64_t prompt_tokens = static_cast<int64_t>(params.prompt.size());
  for (const int64_t context : {prompt_tokens, prompt_tokens + 64}) {
    CompletionParams resolved = params;
    const auto error = shardline::serving::ResolveMaxTokens(resolved, prompt_tokens, context);
    if (error) {
      FUZZ_CHECK(error->http_status == 400, "ResolveMaxTokens answered " +
                                                std::to_string(error->http_status));
      continue;
    }
    FUZZ_CHECK(resolved.max_tokens && *resolved.max_tokens >= 1 &&
                   prompt_tokens + *resolved.max_tokens <= context,
               "ResolveMaxTokens left a max_tokens past the context");
  }

  // Chunk sizes 1 and 7 split stop strings and UTF-8 sequences at every place in turn.
  for (const size_t chunk : {size_t{1}, size_t{7}}) {
    const std::string expected = ReferenceStream(params.prompt, params.stop, chunk);
    shardline::serving::StopTextAssembler assembler(params.stop);
    std::string released;
    for (size_t at = 0; at < params.prompt.size() && !assembler.stopped(); at += chunk) {
      released += assembler.Append(std::string_view(params.prompt).substr(at, chunk));
    }
    released += assembler.Flush();
    FUZZ_CHECK(released == expected, "in pieces of " + std::to_string(chunk) +
                                         " bytes the stream released\n" + released +
                                         "\nand not\n" + expected);
    FUZZ_CHECK(released == assembler.text(), "text() differs from what was released");
  }
  (void)shardline::serving::CompletionResponseJson(params.endpoint, "cmpl-fuzz", 0, params.model,
                                                   params.prompt, "stop", {});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (const Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    const ParsedRequest parsed = shardline::serving::ParseCompletionRequest(body, endpoint);
    if (parsed.error) {
      FUZZ_CHECK(parsed.error->http_status == 400,
                 "a bad request answered " + std::to_string(parsed.error->http_status));
      FUZZ_CHECK(!parsed.error->message.empty(), "a 400 without a message");
      FUZZ_CHECK(nlohmann::json::accept(shardline::serving::ErrorJson(*parsed.error)),
                 "the error body is not JSON");
      continue;
    }
    FUZZ_CHECK(parsed.params.endpoint == endpoint, "the parsed request names another endpoint");
    CompletionParams params = parsed.params;
    if (endpoint == Endpoint::kChatCompletions) {
      // The plain chat form (a model without a template of its own) makes the prompt.
      FUZZ_CHECK(params.prompt.empty() && !params.messages.empty(),
                 "a parsed chat request without messages, or with a prompt already");
      if (const auto error = shardline::serving::ApplyPlainChatForm(params)) {
        FUZZ_CHECK(error->http_status == 400 && error->param == "messages",
                   "the plain chat form answered " + std::to_string(error->http_status));
        continue;
      }
    }
    CheckAccepted(params);
  }
  return 0;
}
