// worker/serving/openai_api.h: parsing and validation, stop strings over streamed bytes, and the
// JSON shapes OpenAI's clients read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "worker/serving/openai_api.h"

namespace shardline::serving {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

ParsedRequest Completion(const std::string& body) {
  return ParseCompletionRequest(body, Endpoint::kCompletions);
}

// The 400 a body gets, with the field it names.
ApiError ErrorOf(const std::string& body, Endpoint endpoint = Endpoint::kCompletions) {
  ParsedRequest r = ParseCompletionRequest(body, endpoint);
  EXPECT_TRUE(r.error.has_value()) << body;
  return r.error.value_or(ApiError{});
}

TEST(ServingOpenAiApiTest, ParsesACompletionRequest) {
  ParsedRequest r = Completion(
      R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"top_p":1,"top_k":-1,
          "seed":7,"stop":["x","yz"],"n":1,"stream":true,"stream_options":{"include_usage":true},
          "user":"ignored"})");
  ASSERT_FALSE(r.error) << r.error->message;
  EXPECT_EQ(r.params.model, "m");
  EXPECT_EQ(r.params.prompt, "hi");
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_EQ(r.params.temperature, 0.0f);
  EXPECT_EQ(r.params.top_k, 0);
  EXPECT_EQ(r.params.seed, 7u);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r.params.stream);
  EXPECT_TRUE(r.params.include_usage);

  ParsedRequest defaults = Completion(R"({"model":"m","prompt":"hi","stop":"\n"})");
  ASSERT_FALSE(defaults.error);
  EXPECT_FALSE(defaults.params.max_tokens.has_value());
  EXPECT_EQ(defaults.params.temperature, 1.0f);
  EXPECT_FALSE(defaults.params.seed.has_value());
  EXPECT_EQ(defaults.params.stop, std::vector<std::string>{"\n"});
  EXPECT_FALSE(defaults.params.stream);
}

TEST(ServingOpenAiApiTest, ParsesChatMessagesAndRendersThemByThePlainForm) {
  ParsedRequest r = ParseCompletionRequest(
      R"({"model":"m","messages":[{"role":"system","content":"Be brief."},
          {"role":"user","content":"Hi"},{"role":"assistant","content":"Hello."},
          {"role":"user","content":"Again"}],"max_completion_tokens":3})",
      Endpoint::kChatCompletions);
  ASSERT_FALSE(r.error) << r.error->message;
  ASSERT_EQ(r.params.messages.size(), 4u);
  EXPECT_EQ(r.params.messages[1].role, "user");
  EXPECT_EQ(r.params.messages[1].content, "Hi");
  EXPECT_EQ(r.params.prompt, "") << "the model's chat format makes the prompt";
  EXPECT_EQ(r.params.max_tokens, 3);
  EXPECT_TRUE(r.params.stop.empty());

  ASSERT_FALSE(ApplyPlainChatForm(r.params));
  EXPECT_EQ(r.params.prompt,
            "System: Be brief.\nUser: Hi\nAssistant: Hello.\nUser: Again\nAssistant:");
  EXPECT_EQ(r.params.stop, std::vector<std::string>{std::string(kChatUserStop)});
}

TEST(ServingOpenAiApiTest, BadJsonSaysWhere) {
  const ApiError e = ErrorOf(R"({"model": "m", "prompt": })");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_THAT(e.message, HasSubstr("not valid JSON (at byte 26)"));
  EXPECT_THAT(ErrorOf("[1,2]").message, HasSubstr("must be a JSON object, got array"));
  EXPECT_THAT(ErrorOf("").message, HasSubstr("not valid JSON"));
}

TEST(ServingOpenAiApiTest, WrongTypesAndValuesNameTheField) {
  struct Case {
    std::string body;
    std::string param;
    std::string says;
  };
  const std::vector<Case> cases = {
      {R"({"prompt":"x"})", "model", "'model' is required"},
      {R"({"model":1,"prompt":"x"})", "model", "must be a string, got number"},
      {R"({"model":"m"})", "prompt", "'prompt' is required"},
      {R"({"model":"m","prompt":["a"]})", "prompt", "must be a string"},
      {R"({"model":"m","prompt":""})", "prompt", "empty"},
      {R"({"model":"m","prompt":"x","max_tokens":"5"})", "max_tokens",
       "must be an integer, got string"},
      {R"({"model":"m","prompt":"x","max_tokens":1.5})", "max_tokens", "got a fraction"},
      {R"({"model":"m","prompt":"x","max_tokens":0})", "max_tokens", "must be >= 1"},
      {R"({"model":"m","prompt":"x","temperature":"hot"})", "temperature", "must be a number"},
      {R"({"model":"m","prompt":"x","temperature":3})", "temperature", "[0, 2]"},
      {R"({"model":"m","prompt":"x","top_p":0})", "top_p", "(0, 1]"},
      {R"({"model":"m","prompt":"x","top_p":1e-300})", "top_p", "0 as a 32-bit float"},
      {R"({"model":"m","prompt":"x","top_k":-2})", "top_k", "got -2"},
      {R"({"model":"m","prompt":"x","seed":"s"})", "seed", "must be an integer"},
      {R"({"model":"m","prompt":"x","n":2})", "n", "only 'n' = 1"},
      {R"({"model":"m","prompt":"x","stop":["a","b","c","d","e"]})", "stop", "at most 4"},
      {R"({"model":"m","prompt":"x","stop":[1]})", "stop", "'stop[0]' must be a string"},
      {R"({"model":"m","prompt":"x","stop":""})", "stop", "empty"},
      {R"({"model":"m","prompt":"x","stop":{}})", "stop", "string or a list"},
      {R"({"model":"m","prompt":"x","stream":"yes"})", "stream", "must be a boolean"},
      {R"({"model":"m","prompt":"x","stream_options":{"include_usage":true}})", "stream_options",
       "needs 'stream': true"},
      {R"({"model":"m","prompt":"x","echo":true})", "echo", "not supported"},
      {R"({"model":"m","prompt":"x","logprobs":2})", "logprobs", "not supported"},
      {R"({"model":"m","prompt":"x","presence_penalty":0.5})", "presence_penalty", "not supported"},
      {R"({"model":"m","prompt":"x","best_of":3})", "best_of", "only 'best_of' = 1"},
  };
  for (const Case& c : cases) {
    const ApiError e = ErrorOf(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_THAT(e.message, HasSubstr(c.says)) << c.body;
  }
  // Zero penalties and echo false ask for nothing and are accepted.
  EXPECT_FALSE(
      Completion(R"({"model":"m","prompt":"x","echo":false,"frequency_penalty":0})").error);
}

TEST(ServingOpenAiApiTest, BadChatMessagesNameTheMessage) {
  auto chat = [](const std::string& body) { return ErrorOf(body, Endpoint::kChatCompletions); };
  EXPECT_THAT(chat(R"({"model":"m"})").message, HasSubstr("'messages' is required"));
  EXPECT_THAT(chat(R"({"model":"m","messages":[]})").message, HasSubstr("non-empty list"));
  EXPECT_THAT(chat(R"({"model":"m","messages":[{"role":3,"content":"x"}]})").message,
              HasSubstr("messages[0].role must be a string"));
  EXPECT_THAT(
      chat(R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"user"}]})").message,
      HasSubstr("messages[1].content must be a string"));
  EXPECT_EQ(chat(R"({"model":"m","messages":[3]})").param, "messages");
}

TEST(ServingOpenAiApiTest, ThePlainChatFormNamesARoleItLacks) {
  // Any role parses (a model's own template decides what it takes); the plain form has three.
  ParsedRequest r = ParseCompletionRequest(
      R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"tool","content":"x"}]})",
      Endpoint::kChatCompletions);
  ASSERT_FALSE(r.error) << r.error->message;
  const std::optional<ApiError> e = ApplyPlainChatForm(r.params);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "messages");
  EXPECT_THAT(e->message, HasSubstr("messages[1].role 'tool' is not one of system, user"));
}

TEST(ServingOpenAiApiTest, MaxTokensMustFitTheContext) {
  CompletionParams p;
  EXPECT_FALSE(ResolveMaxTokens(p, 10, 64));
  EXPECT_EQ(p.max_tokens, 16) << "OpenAI's default for completions";
  CompletionParams near_end;
  EXPECT_FALSE(ResolveMaxTokens(near_end, 60, 64));
  EXPECT_EQ(near_end.max_tokens, 4);
  CompletionParams chat;
  chat.endpoint = Endpoint::kChatCompletions;
  EXPECT_FALSE(ResolveMaxTokens(chat, 10, 64));
  EXPECT_EQ(chat.max_tokens, 54) << "chat: the rest of the context";

  CompletionParams too_many;
  too_many.max_tokens = 60;
  std::optional<ApiError> e = ResolveMaxTokens(too_many, 10, 64);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "max_tokens");
  EXPECT_THAT(e->message, HasSubstr("past this model's context of 64"));

  CompletionParams long_prompt;
  e = ResolveMaxTokens(long_prompt, 64, 64);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt");
}

TEST(ServingOpenAiApiTest, StopStringsEndTheTextAndAreHeldBackWhileTheyMayStart) {
  StopTextAssembler a({"END", "\n\n"});
  EXPECT_EQ(a.Append("Hello"), "Hello");
  EXPECT_EQ(a.Append(" E"), " ") << "'E' may start END";
  EXPECT_EQ(a.Append("N"), "");
  EXPECT_EQ(a.Append("x"), "ENx") << "it did not";
  EXPECT_EQ(a.Append("\n"), "");
  EXPECT_EQ(a.Append("\nmore"), "");
  EXPECT_TRUE(a.stopped());
  EXPECT_EQ(a.Append("after"), "");
  EXPECT_EQ(a.Flush(), "");
  EXPECT_EQ(a.text(), "Hello ENx");

  StopTextAssembler inside({"stop"});
  EXPECT_EQ(inside.Append("a stop b"), "a ");
  EXPECT_TRUE(inside.stopped());

  StopTextAssembler none({"zz"});
  EXPECT_EQ(none.Append("abz"), "ab");
  EXPECT_FALSE(none.stopped());
  EXPECT_EQ(none.Flush(), "z");
}

TEST(ServingOpenAiApiTest, IncompleteUtf8IsHeldUntilItsLastByte) {
  StopTextAssembler a({});
  const std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(a.Append("a\xE2"), "a");
  EXPECT_EQ(a.Append("\x82"), "");
  EXPECT_EQ(a.Append("\xAC"), euro);
  // A byte that can never become UTF-8 is not held (the JSON shows U+FFFD for it).
  EXPECT_EQ(a.Append("\xFF"), "\xFF");
  EXPECT_EQ(a.Append("\xC3"), "");
  EXPECT_EQ(a.Flush(), "\xC3");
}

TEST(ServingOpenAiApiTest, ResponsesHaveOpenAisShapes) {
  const json c = json::parse(CompletionResponseJson(Endpoint::kCompletions, "cmpl-1", 1700, "m",
                                                    "text", "length", Usage{3, 4}));
  EXPECT_EQ(c["id"], "cmpl-1");
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["created"], 1700);
  EXPECT_EQ(c["model"], "m");
  ASSERT_EQ(c["choices"].size(), 1u);
  EXPECT_EQ(c["choices"][0]["index"], 0);
  EXPECT_EQ(c["choices"][0]["text"], "text");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(c["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(c["usage"],
            (json{{"prompt_tokens", 3}, {"completion_tokens", 4}, {"total_tokens", 7}}));

  const json chat = json::parse(CompletionResponseJson(Endpoint::kChatCompletions, "chatcmpl-1", 1,
                                                       "m", "hi", "stop", Usage{1, 1}));
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"], (json{{"role", "assistant"}, {"content", "hi"}}));
  EXPECT_FALSE(chat["choices"][0].contains("text"));

  const json first = json::parse(
      CompletionChunkJson(Endpoint::kChatCompletions, "chatcmpl-1", 1, "m", "", true, ""));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const json last = json::parse(
      CompletionChunkJson(Endpoint::kChatCompletions, "chatcmpl-1", 1, "m", "", false, "stop"));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  const json text_chunk =
      json::parse(CompletionChunkJson(Endpoint::kCompletions, "cmpl-1", 1, "m", "ab", false, ""));
  EXPECT_EQ(text_chunk["object"], "text_completion");
  EXPECT_EQ(text_chunk["choices"][0]["text"], "ab");
  const json usage =
      json::parse(UsageChunkJson(Endpoint::kCompletions, "cmpl-1", 1, "m", Usage{2, 5}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);

  const json models = json::parse(ModelsJson("m", 5));
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "m");
  EXPECT_EQ(models["data"][0]["object"], "model");

  EXPECT_EQ(SseEvent("{}"), "data: {}\n\n");
  EXPECT_EQ(CompletionId(Endpoint::kCompletions, 255), "cmpl-0000000000000000000000ff");
  EXPECT_EQ(CompletionId(Endpoint::kChatCompletions, 1).rfind("chatcmpl-", 0), 0u);
}

TEST(ServingOpenAiApiTest, InvalidUtf8InTextIsReplacedNotThrown) {
  const json c = json::parse(CompletionResponseJson(Endpoint::kCompletions, "i", 1, "m",
                                                    "a\xFF"
                                                    "b",
                                                    "stop", Usage{}));
  EXPECT_EQ(c["choices"][0]["text"],
            "a\xEF\xBF\xBD"
            "b");
}

TEST(ServingOpenAiApiTest, ErrorsHaveOpenAisShapeAndStatus) {
  const json e = json::parse(ErrorJson(MakeApiError(400, "bad", "invalid_request_error", "n")));
  EXPECT_EQ(e, (json{{"error",
                      {{"message", "bad"},
                       {"type", "invalid_request_error"},
                       {"param", "n"},
                       {"code", nullptr}}}}));
  EXPECT_EQ(ErrorFromStatus(absl::ResourceExhaustedError("full")).http_status, 429);
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError("no")).http_status, 503);
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("x")).http_status, 400);
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("x")).param, "");
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("top_p: only 1")).param, "top_p");
  EXPECT_EQ(ErrorFromStatus(absl::InternalError("x")).http_status, 500);
}

}  // namespace
}  // namespace shardline::serving
