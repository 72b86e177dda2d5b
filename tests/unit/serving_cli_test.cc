// `shardline serve` as the process a user runs, on a small checkpoint made here: its greedy
// completion says what `shardline generate` prints for the same prompt, on one rank, on two
// tensor-parallel processes (`--tp 2`), two pipeline stages (`--pp 2`) and both (`--tp 2 --pp 2`),
// and it stops cleanly on SIGTERM, leaving no rank and no store directory behind; a tokenizer
// folder with a chat template makes the chat's prompt.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "nlohmann/json.hpp"
#include "tests/support/cli_process.h"
#include "tests/support/tiny_ascii_gpt.h"
#include "worker/model/data/bpe_tokenizer.h"

namespace shardline {
namespace {

using ::nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string Binary() { return test_support::ShardlineBinary(); }
std::string TempDir() { return test_support::MakeTestDir("serving_cli"); }
std::string ReadAll(const std::string& path) { return test_support::ReadWholeFile(path); }

// Runs `shardline generate`, returns what it printed.
std::string GenerateText(const std::string& model, const std::string& prompt, int tokens) {
  const std::string log = TempDir() + "/generate.log";
  SpawnOptions spawn;
  spawn.argv = {Binary(),   "generate", "--checkpoint",     model,
                "--prompt", prompt,     "--max-new-tokens", std::to_string(tokens)};
  spawn.log_path = log;
  absl::StatusOr<pid_t> pid = Spawn(spawn);
  EXPECT_TRUE(pid.ok()) << pid.status();
  if (!pid.ok()) return "";
  auto exit = WaitFor(*pid, std::chrono::seconds(60));
  if (!exit.ok() || !exit->has_value()) {
    Terminate(*pid, std::chrono::seconds(1));
    ADD_FAILURE() << "generate did not finish: " << ReadAll(log);
    return "";
  }
  EXPECT_TRUE((*exit)->success()) << ReadAll(log);
  return ReadAll(log);
}

// What `shardline generate` prints after `prompt` (one byte a token); "" after a failure.
std::string GeneratedCompletion(const std::string& model, const std::string& prompt, int tokens) {
  const std::string printed = GenerateText(model, prompt, tokens);
  EXPECT_EQ(printed.rfind(prompt, 0), 0u) << printed;
  if (printed.size() < prompt.size() + 1 || printed.back() != '\n') {
    ADD_FAILURE() << "not the prompt and a line: " << printed;
    return "";
  }
  const std::string completion = printed.substr(prompt.size(), printed.size() - prompt.size() - 1);
  EXPECT_EQ(completion.size(), static_cast<size_t>(tokens)) << "one byte a token: " << printed;
  return completion;
}

// The processes whose parent is `parent` (from /proc/<pid>/stat's fourth field).
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = ReadAll(entry.path().string() + "/stat");
    // "pid (comm) state ppid ...": the command may hold spaces and parentheses.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    if (rest >> state >> ppid && ppid == parent) children.push_back(std::stoi(name));
  }
  return children;
}

// A process's command line, one argument an element.
std::vector<std::string> CommandLineOf(pid_t pid) {
  const std::string raw = ReadAll("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> args;
  std::string arg;
  std::istringstream in(raw);
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

class ServingCliTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (pid_ > 0) Terminate(pid_, std::chrono::seconds(5));
  }

  // Starts `shardline serve` on any free port; returns the port it printed (0 on failure).
  int StartServe(const std::vector<std::string>& args) {
    log_ = TempDir() + "/serve.log";
    return test_support::StartServe(args, log_, pid_);
  }

  // The sharded serve tests' body (defined below).
  void ServeShardedSaysWhatGeneratePrints(const std::vector<std::string>& flags, int ranks,
                                          const std::string& banner);

  pid_t pid_ = -1;
  std::string log_;
};

TEST_F(ServingCliTest, GreedyCompletionSaysWhatGeneratePrints) {
  const std::string model = test_support::ExportTinyAsciiGpt(TempDir() + "/tiny");
  const std::string prompt = "hello world";
  const int tokens = 12;
  const std::string expected = GeneratedCompletion(model, prompt, tokens);
  ASSERT_EQ(expected.size(), static_cast<size_t>(tokens));

  const int port = StartServe(
      {"--checkpoint", model, "--listen", "127.0.0.1:0", "--model-name", "tiny", "--api-key", "k"});
  ASSERT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(60);
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);

  const httplib::Headers auth = {{"Authorization", "Bearer k"}};
  const json body = {
      {"model", "tiny"}, {"prompt", prompt}, {"max_tokens", tokens}, {"temperature", 0}};
  auto res = client.Post("/v1/completions", auth, body.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body;
  const json j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["text"], expected);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int>(prompt.size()));
  EXPECT_EQ(j["usage"]["completion_tokens"], tokens);

  // The same text streamed; and a top_k 1 draw at temperature 1 is greedy too.
  json streamed_body = body;
  streamed_body["stream"] = true;
  streamed_body["temperature"] = 1;
  streamed_body["top_k"] = 1;
  auto stream = client.Post("/v1/completions", auth, streamed_body.dump(), "application/json");
  ASSERT_TRUE(stream);
  ASSERT_EQ(stream->status, 200) << stream->body;
  std::string text;
  std::istringstream lines(stream->body);
  std::string line;
  std::string last;
  while (std::getline(lines, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    last = line.substr(6);
    if (last == "[DONE]") break;
    text += json::parse(last)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(last, "[DONE]");
  EXPECT_EQ(text, expected);

  auto unauthorized = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(unauthorized);
  EXPECT_EQ(unauthorized->status, 401);

  ASSERT_EQ(::kill(pid_, SIGTERM), 0);
  auto exit = WaitFor(pid_, std::chrono::seconds(15));
  ASSERT_TRUE(exit.ok() && exit->has_value()) << "serve did not stop on SIGTERM";
  pid_ = -1;
  EXPECT_TRUE((*exit)->success()) << (*exit)->Describe() << ": " << ReadAll(log_);
}

// The byte tokenizer's 257 ids as a Hugging Face tokenizer.json: byte b is token b (no merges),
// and <|endoftext|> is 256.
std::string TokenizerJsonOfBytes() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[std::string(data::Gpt2ByteChar(static_cast<unsigned char>(b)))] = b;
  }
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 256},
                                     {"content", "<|endoftext|>"},
                                     {"special", true},
                                     {"normalized", false}}})},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      // Without a decoder Hugging Face joins the tokens with spaces; a byte-level file has its own.
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}}
      .dump();
}

// A tokenizer folder whose tokenizer_config.json has a chat template: the chat's prompt is the
// rendered template, with its special token as that token's id, so a greedy chat says what a
// greedy completion of the rendered text says.
TEST_F(ServingCliTest, ChatsThroughTheTokenizersTemplate) {
  const std::string dir = TempDir();
  const std::string model = test_support::ExportTinyAsciiGpt(dir + "/tiny");
  const std::string tokenizer = dir + "/tokenizer";
  std::filesystem::create_directories(tokenizer);
  std::ofstream(tokenizer + "/tokenizer.json") << TokenizerJsonOfBytes();
  std::ofstream(tokenizer + "/tokenizer_config.json") << json{
      {"chat_template",
       "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: "
       "{{ message['content'] | trim }}\n{% endfor %}{% if add_generation_prompt %}bot:"
       "{% endif %}"},
      {"bos_token", "<|endoftext|>"},
      {"eos_token", "<|endoftext|>"}}.dump();
  const int port = StartServe({"--checkpoint", model, "--tokenizer", tokenizer, "--listen",
                               "127.0.0.1:0", "--model-name", "tiny"});
  ASSERT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(60);
  const int tokens = 8;
  auto chat = client.Post(
      "/v1/chat/completions",
      json{{"model", "tiny"},
           {"messages", json::array({{{"role", "user"}, {"content", " hello there "}}})},
           {"max_tokens", tokens},
           {"temperature", 0}}
          .dump(),
      "application/json");
  ASSERT_TRUE(chat) << httplib::to_string(chat.error());
  ASSERT_EQ(chat->status, 200) << chat->body;
  const std::string rendered = "<|endoftext|>user: hello there\nbot:";
  auto completion = client.Post(
      "/v1/completions",
      json{{"model", "tiny"}, {"prompt", rendered}, {"max_tokens", tokens}, {"temperature", 0}}
          .dump(),
      "application/json");
  ASSERT_TRUE(completion);
  ASSERT_EQ(completion->status, 200) << completion->body;
  const json c = json::parse(chat->body);
  const json t = json::parse(completion->body);
  EXPECT_EQ(c["choices"][0]["message"]["content"], t["choices"][0]["text"]);
  EXPECT_EQ(c["choices"][0]["message"]["content"].get<std::string>().size(),
            static_cast<size_t>(tokens));
  // "<|endoftext|>" is one token, and the rest one byte a token.
  EXPECT_EQ(c["usage"]["prompt_tokens"], 1 + rendered.size() - std::string("<|endoftext|>").size());
  EXPECT_EQ(t["usage"]["prompt_tokens"], c["usage"]["prompt_tokens"]);
  EXPECT_THAT(ReadAll(log_), ::testing::HasSubstr("chat completions: the chat template of " +
                                                  tokenizer + "/tokenizer_config.json"));
}

// `serve` with `flags` (--tp/--pp) on `ranks` processes: the followers are `serve-rank` children
// of serve, ranks 1..ranks-1 on one store directory; two requests at once each get the
// one-process text; on SIGTERM the leader stops every follower and removes the store directory.
void ServingCliTest::ServeShardedSaysWhatGeneratePrints(const std::vector<std::string>& flags,
                                                        int ranks, const std::string& banner) {
  const std::string model = test_support::ExportTinyAsciiGpt(TempDir() + "/tiny");
  const std::string prompt = "the quick brown fox";
  const int tokens = 16;
  const std::string expected = GeneratedCompletion(model, prompt, tokens);
  ASSERT_EQ(expected.size(), static_cast<size_t>(tokens));
  const std::string other_expected = GeneratedCompletion(model, "hello world", 12);

  std::vector<std::string> args = {"--checkpoint", model, "--listen", "127.0.0.1:0"};
  args.insert(args.end(), flags.begin(), flags.end());
  const int port = StartServe(args);
  ASSERT_GT(port, 0);
  EXPECT_THAT(ReadAll(log_), ::testing::HasSubstr(banner));
  const std::vector<pid_t> followers = ChildrenOf(pid_);
  ASSERT_EQ(followers.size(), static_cast<size_t>(ranks - 1)) << "followers of " << banner;
  std::string store_dir;
  std::vector<int> follower_ranks;
  for (pid_t follower : followers) {
    const std::vector<std::string> argv = CommandLineOf(follower);
    ASSERT_GE(argv.size(), 2u);
    EXPECT_EQ(argv[1], "serve-rank");
    auto value_of = [&argv](const std::string& flag) {
      const auto it = std::find(argv.begin(), argv.end(), flag);
      return it != argv.end() && it + 1 != argv.end() ? *(it + 1) : std::string();
    };
    const std::string store = value_of("--store");
    ASSERT_FALSE(store.empty());
    if (store_dir.empty()) store_dir = store;
    EXPECT_EQ(store, store_dir) << "every rank on one store";
    follower_ranks.push_back(std::stoi(value_of("--rank")));
  }
  std::sort(follower_ranks.begin(), follower_ranks.end());
  std::vector<int> want_ranks(ranks - 1);
  std::iota(want_ranks.begin(), want_ranks.end(), 1);
  EXPECT_EQ(follower_ranks, want_ranks);
  EXPECT_TRUE(std::filesystem::is_directory(store_dir)) << store_dir;

  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(60);
  // Two requests at once: they share the batch, and each gets its own greedy text.
  const json body = {
      {"model", "tiny"}, {"prompt", prompt}, {"max_tokens", tokens}, {"temperature", 0}};
  const json other = {
      {"model", "tiny"}, {"prompt", "hello world"}, {"max_tokens", 12}, {"temperature", 0}};
  std::string other_text;
  std::thread concurrent([&] {
    httplib::Client second("127.0.0.1", port);
    second.set_read_timeout(60);
    auto res = second.Post("/v1/completions", other.dump(), "application/json");
    if (res && res->status == 200) other_text = json::parse(res->body)["choices"][0]["text"];
  });
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  concurrent.join();
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], expected);
  EXPECT_EQ(other_text, other_expected);

  ASSERT_EQ(::kill(pid_, SIGTERM), 0);
  auto exit = WaitFor(pid_, std::chrono::seconds(15));
  ASSERT_TRUE(exit.ok() && exit->has_value()) << "serve did not stop on SIGTERM";
  pid_ = -1;
  EXPECT_TRUE((*exit)->success()) << (*exit)->Describe() << ": " << ReadAll(log_);
  for (pid_t follower : followers) {
    EXPECT_FALSE(std::filesystem::exists("/proc/" + std::to_string(follower)))
        << "follower " << follower << " outlived serve";
  }
  EXPECT_FALSE(std::filesystem::exists(store_dir)) << store_dir;
}

// Two tensor-parallel processes give the one-process text.
TEST_F(ServingCliTest, TensorParallelServeSaysWhatGeneratePrints) {
  ServeShardedSaysWhatGeneratePrints({"--tp", "2"}, 2, "(tp 2, pp 1,");
}

// Two pipeline stages of one layer each.
TEST_F(ServingCliTest, PipelineServeSaysWhatGeneratePrints) {
  ServeShardedSaysWhatGeneratePrints({"--pp", "2"}, 2, "(tp 1, pp 2,");
}

// Two stages of two tensor-parallel ranks: four processes.
TEST_F(ServingCliTest, TensorAndPipelineServeSaysWhatGeneratePrints) {
  ServeShardedSaysWhatGeneratePrints({"--tp", "2", "--pp", "2"}, 4, "(tp 2, pp 2,");
}

TEST_F(ServingCliTest, TensorParallelSizeMustDivideTheModel) {
  const std::string model = test_support::ExportTinyAsciiGpt(TempDir() + "/tiny");  // 2 heads, d_ff 32
  const std::string log = TempDir() + "/bad_tp.log";
  SpawnOptions spawn;
  spawn.argv = {Binary(), "serve", "--checkpoint", model, "--listen", "127.0.0.1:0", "--tp", "3"};
  spawn.log_path = log;
  absl::StatusOr<pid_t> pid = Spawn(spawn);
  ASSERT_TRUE(pid.ok());
  auto exit = WaitFor(*pid, std::chrono::seconds(30));
  ASSERT_TRUE(exit.ok() && exit->has_value()) << "serve ran on with --tp 3";
  EXPECT_EQ((*exit)->code, 2) << (*exit)->Describe() << ": " << ReadAll(log);
  EXPECT_THAT(ReadAll(log), ::testing::HasSubstr("--tp 3: tp 3 must divide heads 2 and d_ff 32"));
}

// More stages than layers (or none) is exit 2 naming --pp and the layers, before any rank starts.
TEST_F(ServingCliTest, PipelineStagesMustBeAtMostTheLayers) {
  const std::string model = test_support::ExportTinyAsciiGpt(TempDir() + "/tiny");  // 2 layers
  for (const std::string pp : {"3", "0"}) {
    const std::string log = TempDir() + "/bad_pp.log";
    SpawnOptions spawn;
    spawn.argv = {Binary(), "serve", "--checkpoint", model, "--listen", "127.0.0.1:0",
                  "--tp",   "2",     "--pp",         pp};
    spawn.log_path = log;
    absl::StatusOr<pid_t> pid = Spawn(spawn);
    ASSERT_TRUE(pid.ok());
    auto exit = WaitFor(*pid, std::chrono::seconds(30));
    ASSERT_TRUE(exit.ok() && exit->has_value()) << "serve ran on with --pp " << pp;
    EXPECT_EQ((*exit)->code, 2) << (*exit)->Describe() << ": " << ReadAll(log);
    EXPECT_THAT(ReadAll(log), ::testing::HasSubstr("--pp " + pp +
                                                   ": a model of 2 layers has 1 to 2 pipeline "
                                                   "stages"));
    EXPECT_THAT(ReadAll(log), ::testing::Not(::testing::HasSubstr("serving ")));
  }
}

TEST_F(ServingCliTest, BadFlagsSayWhatIsWrong) {
  const std::string model = test_support::ExportTinyAsciiGpt(TempDir() + "/tiny");
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--checkpoint", model, "--listen", "nowhere"}, "is not HOST:PORT"},
           {{"--checkpoint", model, "--listen", "127.0.0.1:99999"}, "0..65535"},
           {{"--checkpoint", TempDir() + "/missing"}, "--checkpoint"},
           {{"--checkpoint", model, "--tokenizer", "/no/such/tokenizer"}, "--tokenizer"},
           {{"--checkpoint", model, "--api-key", "a", "--api-key-file", model + "/config.json"},
            "excludes"},
           {{"--checkpoint", model, "--device", "gpu"},
            "--device: 'gpu' is not a device: cpu, cuda or cuda:N"}}) {
    const std::string log = TempDir() + "/bad.log";
    SpawnOptions spawn;
    spawn.argv = {Binary(), "serve"};
    spawn.log_path = log;
    spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
    absl::StatusOr<pid_t> pid = Spawn(spawn);
    ASSERT_TRUE(pid.ok());
    auto exit = WaitFor(*pid, std::chrono::seconds(30));
    ASSERT_TRUE(exit.ok() && exit->has_value()) << "serve ran on with " << args.back();
    EXPECT_FALSE((*exit)->success()) << args.back();
    EXPECT_THAT(ReadAll(log), ::testing::HasSubstr(says));
  }
}

}  // namespace
}  // namespace shardline
