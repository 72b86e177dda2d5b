// OpenAI's official Python client (PyPI `openai`, which scripts/install-deps.sh installs in
// SHARDLINE_OPENAI_CLIENT_DIR) against `shardline serve` as a process, on a small checkpoint made
// here: serving_openai_client.py checks completions and chat, whole and streamed, models.list, and
// that the server's error statuses reach the client as its exception types. And curl -N, as a
// user would run it, sees the raw event stream end with `data: [DONE]`. Without the client the
// test fails, saying so: a skipped conformance check would pass unnoticed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "nlohmann/json.hpp"
#include "tests/support/cli_process.h"
#include "tests/support/tiny_ascii_gpt.h"

namespace shardline {
namespace {

namespace stdfs = std::filesystem;
using ::nlohmann::json;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr char kPython[] = "/usr/bin/python3";
constexpr char kModel[] = "tiny";
constexpr char kApiKey[] = "sekrit";
constexpr char kPrompt[] = "hello world";
constexpr int kTokens = 12;

std::string Binary() { return test_support::ShardlineBinary(); }
std::string TempDir() { return test_support::MakeTestDir("serving_openai_client"); }
std::string ReadAll(const std::string& path) { return test_support::ReadWholeFile(path); }

std::string SourceDir() {
  if (const char* dir = std::getenv("SHARDLINE_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return SHARDLINE_SOURCE_PATH;
}

// PREFIX/lib/python3.X/{dist,site}-packages holding `openai`, for PYTHONPATH; empty when absent.
std::string OpenAiClientSite() {
  const std::string prefix = SHARDLINE_OPENAI_CLIENT_DIR;
  std::error_code ec;
  for (const auto& lib : stdfs::directory_iterator(prefix + "/lib", ec)) {
    for (const char* packages : {"dist-packages", "site-packages"}) {
      const stdfs::path site = lib.path() / packages;
      if (stdfs::is_regular_file(site / "openai" / "__init__.py", ec)) return site.string();
    }
  }
  return "";
}

// Where `name` is on $PATH; empty when it is not.
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = dir + "/" + name;
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Runs `argv` to its end (at most `timeout`) with `env` added; its output goes to `log`. Returns
// how it exited, or nullopt after a failure (reported).
std::optional<ExitStatus> RunToEnd(const std::vector<std::string>& argv,
                                   std::vector<std::pair<std::string, std::string>> env,
                                   const std::string& log, std::chrono::seconds timeout) {
  SpawnOptions spawn;
  spawn.argv = argv;
  spawn.extra_env = std::move(env);
  spawn.log_path = log;
  absl::StatusOr<pid_t> pid = Spawn(spawn);
  if (!pid.ok()) {
    ADD_FAILURE() << "starting " << argv[0] << ": " << pid.status();
    return std::nullopt;
  }
  auto exit = WaitFor(*pid, timeout);
  if (!exit.ok() || !exit->has_value()) {
    Terminate(*pid, std::chrono::seconds(1));
    ADD_FAILURE() << argv[0] << " did not finish within " << timeout.count()
                  << " s; its output: " << ReadAll(log);
    return std::nullopt;
  }
  return **exit;
}

// What `shardline generate` prints after `prompt` at greedy (one byte a token); "" on failure.
std::string GeneratedCompletion(const std::string& model, const std::string& prompt, int tokens) {
  const std::string log = TempDir() + "/generate.log";
  std::optional<ExitStatus> exit =
      RunToEnd({Binary(), "generate", "--checkpoint", model, "--prompt", prompt, "--max-new-tokens",
                std::to_string(tokens)},
               {}, log, std::chrono::seconds(60));
  const std::string printed = ReadAll(log);
  if (!exit || !exit->success()) {
    ADD_FAILURE() << "generate failed: " << printed;
    return "";
  }
  if (printed.rfind(prompt, 0) != 0 || printed.size() != prompt.size() + tokens + 1 ||
      printed.back() != '\n') {
    ADD_FAILURE() << "not the prompt, " << tokens << " bytes and a newline: " << printed;
    return "";
  }
  return printed.substr(prompt.size(), tokens);
}

class ServingOpenAiClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = test_support::ExportTinyAsciiGpt(TempDir() + "/tiny");
    expected_ = GeneratedCompletion(model_, kPrompt, kTokens);
    ASSERT_EQ(expected_.size(), static_cast<size_t>(kTokens));
    port_ = StartServe({"--checkpoint", model_, "--listen", "127.0.0.1:0", "--model-name", kModel,
                        "--api-key", kApiKey});
    ASSERT_GT(port_, 0);
  }

  void TearDown() override {
    if (pid_ > 0) Terminate(pid_, std::chrono::seconds(5));
  }

  std::string BaseUrl() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Starts `shardline serve` on any free port; returns the port it printed (0 on failure).
  int StartServe(const std::vector<std::string>& args) {
    log_ = TempDir() + "/serve.log";
    return test_support::StartServe(args, log_, pid_);
  }

  std::string model_, expected_, log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST_F(ServingOpenAiClientTest, OfficialClientGetsWhatTheApiPromises) {
  const std::string site = OpenAiClientSite();
  ASSERT_FALSE(site.empty()) << "OpenAI's Python client (PyPI openai) is not installed in "
                             << SHARDLINE_OPENAI_CLIENT_DIR
                             << ": run scripts/install-deps.sh (or configure with "
                                "-DSHARDLINE_OPENAI_CLIENT_DIR=PREFIX)";
  const std::string log = TempDir() + "/client.log";
  std::optional<ExitStatus> exit = RunToEnd(
      {kPython, SourceDir() + "/tests/unit/serving_openai_client.py", "--base-url", BaseUrl(),
       "--api-key", kApiKey, "--model", kModel, "--prompt", kPrompt, "--expected", expected_,
       "--context", std::to_string(test_support::kTinyAsciiGptContext)},
      {{"PYTHONPATH", site}, {"PYTHONDONTWRITEBYTECODE", "1"}}, log, std::chrono::seconds(60));
  ASSERT_TRUE(exit.has_value());
  const std::string out = ReadAll(log);
  std::cout << out;
  EXPECT_TRUE(exit->success()) << "serving_openai_client.py (" << kPython
                               << " with PYTHONPATH=" << site << ") failed with "
                               << exit->Describe() << ":\n"
                               << out << "\nserve's log:\n"
                               << ReadAll(log_);
  // A script that ended early with exit 0 must not pass.
  if (exit->success()) EXPECT_THAT(out, HasSubstr("\nall checks passed\n"));
}

// The raw stream as `curl -N` shows it (through httplib where curl is absent): `data: {json}`
// events joined into the greedy text, the last choice finishing with "length", then
// `data: [DONE]` and nothing after.
TEST_F(ServingOpenAiClientTest, CurlSeesTheStreamEndWithDone) {
  const json body = {{"model", kModel},
                     {"prompt", kPrompt},
                     {"max_tokens", kTokens},
                     {"temperature", 0},
                     {"stream", true}};
  std::string stream;
  const std::string curl = FindOnPath("curl");
  if (!curl.empty()) {
    const std::string dir = TempDir();
    const std::string log = dir + "/curl.log", headers = dir + "/headers";
    std::optional<ExitStatus> exit = RunToEnd(
        {curl, "-sS", "-N", "--max-time", "20", "-D", headers, "-H",
         std::string("Authorization: Bearer ") + kApiKey, "-H", "Content-Type: application/json",
         "-d", body.dump(), BaseUrl() + "/v1/completions"},
        {}, log, std::chrono::seconds(30));
    ASSERT_TRUE(exit.has_value());
    stream = ReadAll(log);
    ASSERT_TRUE(exit->success()) << "curl failed with " << exit->Describe() << ": " << stream;
    const std::string head = ReadAll(headers);
    EXPECT_THAT(head, HasSubstr("HTTP/1.1 200")) << head;
    EXPECT_THAT(head, HasSubstr("text/event-stream")) << head;
  } else {
    std::cout << "no curl on PATH: reading the stream through httplib\n";
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(20);
    auto res = client.Post("/v1/completions", {{"Authorization", std::string("Bearer ") + kApiKey}},
                           body.dump(), "application/json");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_THAT(res->get_header_value("Content-Type"), HasSubstr("text/event-stream"));
    stream = res->body;
  }

  constexpr std::string_view kDone = "data: [DONE]\n\n";
  ASSERT_GE(stream.size(), kDone.size()) << stream;
  EXPECT_EQ(stream.substr(stream.size() - kDone.size()), kDone) << stream;
  // Every event but the last: "data: {json}\n\n".
  std::string text, finish;
  int events = 0;
  size_t at = 0;
  while (at < stream.size() - kDone.size()) {
    const size_t end = stream.find("\n\n", at);
    ASSERT_NE(end, std::string::npos)
        << "an event without its blank line at " << at << ": " << stream;
    const std::string event = stream.substr(at, end - at);
    ASSERT_EQ(event.rfind("data: {", 0), 0u) << event;
    const json chunk = json::parse(event.substr(6));
    ASSERT_EQ(chunk["choices"].size(), 1u) << event;
    EXPECT_TRUE(finish.empty()) << "a chunk after the one that finished: " << event;
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) {
      finish = chunk["choices"][0]["finish_reason"].get<std::string>();
    }
    ++events;
    at = end + 2;
  }
  EXPECT_GE(events, 2) << stream;
  EXPECT_EQ(text, expected_) << stream;
  EXPECT_EQ(finish, "length") << stream;
}

}  // namespace
}  // namespace shardline
