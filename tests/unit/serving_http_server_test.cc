// worker/serving/http_server.h over real loopback sockets (an ephemeral port), driven with
// httplib's client, in front of a scripted engine: the engine is the test double, the HTTP layer
// is the thing under test.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "nlohmann/json.hpp"
#include "tests/support/cli_process.h"
#include "worker/model/data/bpe_tokenizer.h"
#include "worker/model/data/tokenizer.h"
#include "worker/serving/chat_format.h"
#include "worker/serving/http_server.h"

namespace shardline::serving {
namespace {

using ::nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Says `script` byte by byte (the byte tokenizer's ids), or 'a' until cancelled when `forever`.
class ScriptedEngine final : public CompletionEngine {
 public:
  ~ScriptedEngine() override {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
  }

  absl::StatusOr<RequestId> Submit(GenerationRequest request, StreamCallbacks callbacks) override {
    if (!ready) return absl::UnavailableError("not ready (scripted)");
    if (!reject.ok()) return reject;
    std::lock_guard<std::mutex> lock(mu_);
    const RequestId id = next_id_++;
    last_request_ = request;
    threads_.emplace_back([this, id, request, callbacks] {
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      size_t i = 0;
      for (;;) {
        if (Cancelled(id) || stop_ || Clock::now() > deadline) {
          callbacks.on_finish(absl::CancelledError("cancelled"), FinishReason::kStop);
          return;
        }
        if (!forever && i == script.size()) break;
        callbacks.on_token(forever ? 'a' : static_cast<unsigned char>(script[i]));
        ++i;
        std::this_thread::sleep_for(token_delay);
      }
      callbacks.on_finish(absl::OkStatus(), finish);
    });
    return id;
  }
  void Cancel(RequestId id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.insert(id);
  }
  bool Ready() const override { return ready; }
  EngineStats Stats() const override {
    return EngineStats{
        .running = 1, .waiting = 2, .kv_blocks = 40, .kv_blocks_used = 7, .preemptions = 3};
  }
  int32_t max_context() const override { return 64; }

  bool Cancelled(RequestId id) {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_.count(id) > 0;
  }
  bool AnyCancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return !cancelled_.empty();
  }
  GenerationRequest last_request() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_request_;
  }

  std::string script = "hello world";
  FinishReason finish = FinishReason::kLength;
  bool forever = false;
  std::chrono::milliseconds token_delay{1};
  std::atomic<bool> ready{true};
  absl::Status reject;

 private:
  std::mutex mu_;
  RequestId next_id_ = 1;
  std::set<RequestId> cancelled_;
  GenerationRequest last_request_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
};

class ServingHttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = data::LoadTokenizer("bytes");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
  }

  void StartServer(std::string api_key = "") {
    HttpServerOptions options;
    options.model_name = "tiny";
    options.api_key = std::move(api_key);
    options.request_timeout = std::chrono::seconds(20);
    options.chat = chat_;
    auto server = HttpServer::Start(options, engine_, *tokenizer_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
  }

  httplib::Client Client() {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_connection_timeout(5);
    client.set_read_timeout(20);
    return client;
  }

  httplib::Result Post(const std::string& path, const json& body,
                       const httplib::Headers& headers = {}) {
    return Client().Post(path.c_str(), headers, body.dump(), "application/json");
  }

  // The "data: " payloads of an SSE body, in order.
  static std::vector<std::string> Events(const std::string& body) {
    std::vector<std::string> events;
    size_t at = 0;
    while (at < body.size()) {
      const size_t end = body.find("\n\n", at);
      EXPECT_NE(end, std::string::npos) << "an unterminated event in " << body;
      if (end == std::string::npos) break;
      const std::string event = body.substr(at, end - at);
      EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
      events.push_back(event.substr(6));
      at = end + 2;
    }
    return events;
  }

  static json ErrorBody(const httplib::Result& res) {
    json j = json::parse(res->body);
    EXPECT_TRUE(j.contains("error")) << res->body;
    for (const char* key : {"message", "type", "param", "code"}) {
      EXPECT_TRUE(j["error"].contains(key)) << key << " in " << res->body;
    }
    return j["error"];
  }

  // Serves the model folder `dir` as `shardline serve` does: its tokenizer and chat format.
  void StartServerFor(const std::string& dir) {
    auto tokenizer = data::LoadTokenizer(dir);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
    auto chat = ChatFormatFor(dir);
    ASSERT_TRUE(chat.ok()) << chat.status();
    chat_ = *chat;
    StartServer();
  }

  ScriptedEngine engine_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  ChatFormat chat_ = ChatFormat::PlainText();
  std::unique_ptr<HttpServer> server_;
};

// A Hugging Face model folder: a byte-level tokenizer.json (byte b is token b, no merges) whose
// added tokens are Llama 2's <s> (256) and </s> (257), and tokenizer_config.json `config`.
std::string ModelFolder(const json& config) {
  const std::string dir = test_support::MakeTestDir("serving_chat");
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[std::string(data::Gpt2ByteChar(static_cast<unsigned char>(b)))] = b;
  json added = json::array();
  for (const auto& [content, id] : {std::pair<std::string, int>{"<s>", 256}, {"</s>", 257}}) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"special", true},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false},
                     {"normalized", false}});
  }
  const json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      // Without a decoder Hugging Face joins the tokens with spaces; a byte-level file has its own.
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  return dir;
}

// Llama 2's tokenizer_config.json (tests/unit/chat_templates/llama2).
json Llama2Config() {
  std::ifstream in(std::string(SHARDLINE_SOURCE_PATH) +
                   "/tests/unit/chat_templates/llama2/tokenizer_config.json");
  return json::parse(in);
}

TEST_F(ServingHttpServerTest, CompletesWhole) {
  StartServer();
  auto res = Post("/v1/completions", {{"model", "tiny"},
                                      {"prompt", "Say hi"},
                                      {"max_tokens", 20},
                                      {"temperature", 0},
                                      {"seed", 5}});
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_THAT(res->get_header_value("Content-Type"), HasSubstr("application/json"));
  const json j = json::parse(res->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["text"], "hello world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(j["usage"]["completion_tokens"], 11);
  EXPECT_EQ(j["usage"]["total_tokens"], 17);

  const GenerationRequest sent = engine_.last_request();
  EXPECT_EQ(sent.prompt, (std::vector<int32_t>{'S', 'a', 'y', ' ', 'h', 'i'}));
  EXPECT_EQ(sent.max_tokens, 20);
  EXPECT_EQ(sent.temperature, 0.0f);
  EXPECT_EQ(sent.seed, 5u);
  EXPECT_EQ(sent.stop_token_ids, std::vector<int32_t>{256}) << "the byte tokenizer's end of text";
}

TEST_F(ServingHttpServerTest, StopStringEndsTheTextAndCancelsTheRequest) {
  engine_.script = "abc STOP def and much more";
  engine_.token_delay = std::chrono::milliseconds(20);
  StartServer();
  auto res = Post("/v1/completions",
                  {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 30}, {"stop", "STOP"}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["text"], "abc ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(engine_.AnyCancelled());
}

TEST_F(ServingHttpServerTest, ChatCompletesWithTheAssistantsMessage) {
  engine_.script = "Hi there\nUser: and me";
  engine_.finish = FinishReason::kStop;
  StartServer();
  auto res = Post("/v1/chat/completions",
                  {{"model", "tiny"},
                   {"messages", json::array({{{"role", "user"}, {"content", "Hello"}}})},
                   {"max_tokens", 30}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json j = json::parse(res->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hi there")
      << "the template's user turn stops it";
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const std::string prompt = "User: Hello\nAssistant:";
  EXPECT_EQ(engine_.last_request().prompt.size(), prompt.size());
}

TEST_F(ServingHttpServerTest, ChatRendersTheModelsOwnTemplate) {
  engine_.script = "Hi there\nUser: and me";
  engine_.finish = FinishReason::kStop;
  StartServerFor(ModelFolder(Llama2Config()));
  auto res = Post("/v1/chat/completions",
                  {{"model", "tiny"},
                   {"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                             {{"role", "user"}, {"content", "Hello"}}})},
                   {"max_tokens", 14}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hi there\nUser: and me")
      << "no User: stop with the model's own template";
  // The template's "<s>" is the BOS token's id, once: Encode matched it, and added none.
  const std::string text = "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHello [/INST]";
  std::vector<int32_t> expected = {256};
  for (unsigned char c : text) expected.push_back(c);
  EXPECT_EQ(engine_.last_request().prompt, expected);
  EXPECT_EQ(j["usage"]["prompt_tokens"], expected.size());
}

TEST_F(ServingHttpServerTest, ATemplatesRefusalIsA400WithItsMessage) {
  StartServerFor(ModelFolder(Llama2Config()));
  for (const bool stream : {false, true}) {
    auto res = Post("/v1/chat/completions",
                    {{"model", "tiny"},
                     {"messages", json::array({{{"role", "user"}, {"content", "a"}},
                                               {{"role", "user"}, {"content", "b"}}})},
                     {"stream", stream}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    const json error = ErrorBody(res);
    EXPECT_THAT(error["message"].get<std::string>(),
                HasSubstr("refused the messages: Conversation roles must alternate "
                          "user/assistant/user/assistant/..."));
    EXPECT_EQ(error["param"], "messages");
  }
  EXPECT_TRUE(engine_.last_request().prompt.empty()) << "nothing reached the engine";
}

TEST_F(ServingHttpServerTest, AModelWithoutATemplateAnswersChatWith400) {
  const std::string dir = ModelFolder(json{{"model_max_length", 64}, {"eos_token", "</s>"}});
  StartServerFor(dir);
  auto chat = Post(
      "/v1/chat/completions",
      {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "Hello"}}})}});
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 400) << chat->body;
  EXPECT_THAT(ErrorBody(chat)["message"].get<std::string>(),
              AllOf(HasSubstr("this model has no chat template"),
                    HasSubstr(dir + "/tokenizer_config.json has no \"chat_template\"")));
  auto completion = Post("/v1/completions", {{"model", "tiny"}, {"prompt", "<s>x"}});
  ASSERT_TRUE(completion);
  EXPECT_EQ(completion->status, 200) << "completions still serve: " << completion->body;
  EXPECT_EQ(engine_.last_request().prompt, (std::vector<int32_t>{256, 'x'}));
}

TEST_F(ServingHttpServerTest, StreamsChunksEndingWithDone) {
  StartServer();
  auto res = Post("/v1/completions", {{"model", "tiny"},
                                      {"prompt", "x"},
                                      {"stream", true},
                                      {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_THAT(res->get_header_value("Content-Type"), HasSubstr("text/event-stream"));
  const std::vector<std::string> events = Events(res->body);
  ASSERT_GE(events.size(), 4u) << res->body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::set<std::string> ids;
  for (size_t i = 0; i + 3 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
    ids.insert(chunk["id"].get<std::string>());
    text += chunk["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "hello world");
  const json last = json::parse(events[events.size() - 3]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  ids.insert(last["id"].get<std::string>());
  EXPECT_EQ(ids.size(), 1u) << "one id for every chunk";
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 11);
}

TEST_F(ServingHttpServerTest, StreamsChatDeltas) {
  StartServer();
  auto res = Post("/v1/chat/completions",
                  {{"model", "tiny"},
                   {"messages", json::array({{{"role", "user"}, {"content", "Hello"}}})},
                   {"max_tokens", 20},
                   {"stream", true}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::vector<std::string> events = Events(res->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events.front());
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_FALSE(chunk["choices"][0]["delta"].contains("role"));
    text += chunk["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, "hello world");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
}

TEST_F(ServingHttpServerTest, AClientThatLeavesMidStreamCancelsItsRequest) {
  engine_.forever = true;
  engine_.token_delay = std::chrono::milliseconds(5);
  StartServer();
  httplib::Client client = Client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 60}, {"stream", true}}.dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    return ++chunks < 2;  // false: the client closes the connection
  };
  auto res = client.send(req);
  EXPECT_GE(chunks, 1);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!engine_.Cancelled(1) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(engine_.Cancelled(1)) << "the request outlived its client";
}

TEST_F(ServingHttpServerTest, ApiKeyGuardsTheApiButNotHealth) {
  StartServer("sekret");
  const json body = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 2}};
  auto none = Post("/v1/completions", body);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(ErrorBody(none)["code"], "invalid_api_key");
  auto wrong = Post("/v1/completions", body, {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto models = Client().Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  auto right = Post("/v1/completions", body, {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200) << right->body;
  auto health = Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

// A request refused before its body was read (a wrong key, an unknown path, a wrong method) must
// not leave that body on a kept-alive connection, where it would be read as the next request
// (which then got a 400): the OpenAI client keeps its connections.
TEST_F(ServingHttpServerTest, ARefusedRequestsBodyDoesNotSpoilItsConnection) {
  StartServer("sekret");
  httplib::Client client = Client();
  client.set_keep_alive(true);
  const std::string body =
      json{{"model", "tiny"}, {"prompt", std::string(3000, 'x')}, {"max_tokens", 2}}.dump();
  const httplib::Headers right = {{"Authorization", "Bearer sekret"}};
  const httplib::Headers wrong = {{"Authorization", "Bearer nope"}};
  const std::vector<std::pair<std::string, httplib::Headers>> refusals = {
      {"/v1/completions", wrong}, {"/v2/nothing", right}, {"/v1/models", right}};
  for (const auto& [path, headers] : refusals) {
    auto refused = client.Post(path.c_str(), headers, body, "application/json");
    ASSERT_TRUE(refused) << path;
    EXPECT_THAT(refused->status, ::testing::AnyOf(401, 404, 405)) << path << ": " << refused->body;
    ErrorBody(refused);
    auto next = client.Get("/v1/models", right);
    ASSERT_TRUE(next) << "after " << path;
    EXPECT_EQ(next->status, 200) << "after " << path << ": " << next->body;
  }
  // A body on a GET does not get it past the key. (httplib never reads a GET's body, so on a
  // kept-alive connection it would spoil the next request as above: a fresh client sends it.)
  httplib::Request get;
  get.method = "GET";
  get.path = "/v1/models";
  get.headers = wrong;
  get.body = body;
  get.set_header("Content-Type", "application/json");
  auto sneaky = Client().send(get);
  ASSERT_TRUE(sneaky);
  EXPECT_EQ(sneaky->status, 401) << sneaky->body;
}

TEST_F(ServingHttpServerTest, AFullQueueIs429) {
  engine_.reject = absl::ResourceExhaustedError("the queue is full");
  StartServer();
  auto res = Post("/v1/completions", {{"model", "tiny"}, {"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  EXPECT_THAT(ErrorBody(res)["message"].get<std::string>(), HasSubstr("queue is full"));
}

TEST_F(ServingHttpServerTest, NotReadyIs503AndSoIsHealth) {
  engine_.ready = false;
  StartServer();
  auto res = Post("/v1/completions", {{"model", "tiny"}, {"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  ErrorBody(res);
  auto health = Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  engine_.ready = true;
  health = Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServingHttpServerTest, UnknownPathsModelsAndMethods) {
  StartServer();
  auto path = Client().Get("/v2/nothing");
  ASSERT_TRUE(path);
  EXPECT_EQ(path->status, 404);
  ErrorBody(path);
  auto model = Post("/v1/completions", {{"model", "other"}, {"prompt", "x"}});
  ASSERT_TRUE(model);
  EXPECT_EQ(model->status, 404);
  EXPECT_EQ(ErrorBody(model)["code"], "model_not_found");
  auto method = Client().Get("/v1/completions");
  ASSERT_TRUE(method);
  EXPECT_EQ(method->status, 405);
  EXPECT_EQ(method->get_header_value("Allow"), "POST");
  ErrorBody(method);
  auto models = Client().Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
}

TEST_F(ServingHttpServerTest, BadRequestsAre400AndTheServerStaysUp) {
  StartServer();
  auto bad_json = Client().Post("/v1/completions", "{\"model\": \"tiny\",", "application/json");
  ASSERT_TRUE(bad_json);
  EXPECT_EQ(bad_json->status, 400);
  EXPECT_THAT(ErrorBody(bad_json)["message"].get<std::string>(), HasSubstr("at byte"));
  auto bad_type = Post("/v1/completions", {{"model", "tiny"}, {"prompt", "x"}, {"n", "2"}});
  ASSERT_TRUE(bad_type);
  EXPECT_EQ(bad_type->status, 400);
  EXPECT_EQ(ErrorBody(bad_type)["param"], "n");
  // The scripted engine's context is 64 positions.
  auto too_long = Post("/v1/completions", {{"model", "tiny"}, {"prompt", std::string(70, 'x')}});
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->status, 400);
  EXPECT_EQ(ErrorBody(too_long)["param"], "prompt");
  auto past = Post("/v1/completions", {{"model", "tiny"}, {"prompt", "xx"}, {"max_tokens", 63}});
  ASSERT_TRUE(past);
  EXPECT_EQ(past->status, 400);
  EXPECT_EQ(ErrorBody(past)["param"], "max_tokens");
  auto binary = Client().Post("/v1/completions", std::string("\x00\xff{", 3), "application/json");
  ASSERT_TRUE(binary);
  EXPECT_EQ(binary->status, 400);
  auto ok = Post("/v1/completions", {{"model", "tiny"}, {"prompt", "x"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// Bytes that are not HTTP, straight onto a socket; the reply (if any) is read with a deadline.
std::string RawExchange(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char buf[4096];
  const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  ::close(fd);
  return n > 0 ? std::string(buf, n) : "";
}

TEST_F(ServingHttpServerTest, GarbageOnTheSocketDoesNotTakeTheServerDown) {
  StartServer();
  EXPECT_THAT(RawExchange(server_->port(), "NOT HTTP AT ALL\r\n\r\n"), HasSubstr("400"));
  EXPECT_THAT(RawExchange(server_->port(), std::string("\x00\xff\x01\r\n\r\n", 7)),
              HasSubstr("400"));
  auto ok = Post("/v1/completions", {{"model", "tiny"}, {"prompt", "x"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(ServingHttpServerTest, MetricsInPrometheusText) {
  StartServer();
  ASSERT_TRUE(Post("/v1/completions", {{"model", "tiny"}, {"prompt", "x"}}));
  auto res = Client().Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  for (const char* line :
       {"shardline_serving_requests_running 1", "shardline_serving_requests_waiting 2",
        "shardline_serving_kv_cache_blocks 40", "shardline_serving_kv_cache_blocks_used 7",
        "shardline_serving_preemptions 3", "shardline_serving_generated_tokens_total 11",
        "shardline_serving_time_to_first_token_seconds_count 1",
        "shardline_serving_time_per_output_token_seconds_count 10",
        "shardline_serving_http_requests_total{code=\"200\"}"}) {
    EXPECT_THAT(res->body, HasSubstr(line));
  }
}

TEST_F(ServingHttpServerTest, StopEndsAnOpenStream) {
  engine_.forever = true;
  engine_.token_delay = std::chrono::milliseconds(5);
  StartServer();
  std::thread client([this] {
    auto res = Post("/v1/completions",
                    {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 60}, {"stream", true}});
    (void)res;
  });
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (engine_.last_request().prompt.empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto start = Clock::now();
  server_->Stop();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  client.join();
}

}  // namespace
}  // namespace shardline::serving
