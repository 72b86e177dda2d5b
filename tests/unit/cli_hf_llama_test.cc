// A Hugging Face Llama folder given straight to the binary a user runs: `shardline generate
// --checkpoint DIR` prints what a PyTorch Llama decodes greedily from the same folder
// (tests/unit/checkpoint_hf_llama_reference.py), `shardline serve --checkpoint DIR` completes the
// same text on one process and on two tensor-parallel ones, `shardline checkpoint export --format
// hf` writes a Llama folder that says it again (from the folder, and from our own checkpoint of
// it), and bad folders or layouts are refused by name before anything is served.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "nlohmann/json.hpp"
#include "tests/support/cli_process.h"
#include "worker/training/model_checkpoint.h"

namespace shardline {
namespace {

namespace fs = std::filesystem;
using ::nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr char kPython[] = "/usr/bin/python3";
const std::string kPrompt = "hello";
constexpr int kTokens = 12;

std::string Binary() { return test_support::ShardlineBinary(); }
std::string TempDir() { return test_support::MakeTestDir("cli_hf_llama"); }
std::string ReadAll(const std::string& path) { return test_support::ReadWholeFile(path); }

std::string SourceDir() {
  if (const char* dir = std::getenv("SHARDLINE_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return SHARDLINE_SOURCE_PATH;
}

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

CommandResult Shardline(const std::vector<std::string>& args) {
  const std::string log = TempDir() + "/out.log";
  SpawnOptions spawn;
  spawn.argv = {Binary()};
  spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
  spawn.log_path = log;
  CommandResult run;
  absl::StatusOr<pid_t> pid = Spawn(spawn);
  if (!pid.ok()) {
    run.out = std::string(pid.status().message());
    return run;
  }
  absl::StatusOr<std::optional<ExitStatus>> exit = WaitFor(*pid, std::chrono::seconds(60));
  if (!exit.ok() || !exit->has_value()) {
    Terminate(*pid, std::chrono::seconds(1));
    run.out = "did not finish within 60 s: " + ReadAll(log);
    return run;
  }
  run.exit_code = (*exit)->signaled ? -1 : (*exit)->code;
  run.out = ReadAll(log);
  return run;
}

// The folder every test reads: 2 layers, 4 heads on 2 key/value heads, vocab 257 (the byte
// tokenizer's), Llama 3 rope scaling, in two files with an index; its head favours 'a'..'z' so
// that greedy text is printable. nullopt without torch.
struct Folder {
  std::string dir;
  std::string completion;  // PyTorch's greedy kTokens after kPrompt
};

std::optional<Folder>& TheFolder() {
  static std::optional<Folder> folder;
  return folder;
}

std::optional<Folder> WriteFolder() {
  if (access(kPython, X_OK) != 0 ||
      std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) != 0) {
    return std::nullopt;
  }
  const std::string root = TempDir();
  json prompt = json::array();
  for (unsigned char c : kPrompt) prompt.push_back(static_cast<int>(c));
  const json config = {{"architectures", {"LlamaForCausalLM"}},
                       {"model_type", "llama"},
                       {"hidden_size", 32},
                       {"intermediate_size", 48},
                       {"num_hidden_layers", 2},
                       {"num_attention_heads", 4},
                       {"num_key_value_heads", 2},
                       {"vocab_size", 257},
                       {"max_position_embeddings", 64},
                       {"rms_norm_eps", 1e-5},
                       {"hidden_act", "silu"},
                       {"rope_theta", 500000.0},
                       {"rope_scaling",
                        {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 16}}},
                       {"tie_word_embeddings", false}};
  const json spec = {
      {"config", config},  {"dtype", "F32"},        {"files", 2}, {"seed", 8}, {"tokens", prompt},
      {"greedy", kTokens}, {"printable_head", true}};
  std::ofstream(root + "/spec.json") << spec.dump();
  Folder folder{root + "/model", ""};
  const std::string command =
      absl::StrCat(kPython, " ", SourceDir(), "/tests/unit/checkpoint_hf_llama_reference.py write ",
                   root, "/spec.json ", folder.dir, " ", root, "/expected");
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(root + "/expected/greedy.json");
  const json greedy = json::parse(in);
  // A lead this large cannot be overturned by f32 against f64.
  EXPECT_GT(greedy["min_gap"].get<double>(), 1e-3);
  for (int token : greedy["tokens"]) folder.completion.push_back(static_cast<char>(token));
  return folder;
}

class CliHfLlamaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { TheFolder() = WriteFolder(); }
  void SetUp() override {
    if (!TheFolder()) GTEST_SKIP() << "PyTorch is not installed for " << kPython;
    folder_ = &*TheFolder();
  }
  void TearDown() override {
    if (pid_ > 0) Terminate(pid_, std::chrono::seconds(5));
  }

  // What `generate` prints for kPrompt from `checkpoint`, greedy and with the byte tokenizer.
  static CommandResult Generate(const std::string& checkpoint,
                                const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {
        "generate",         "--checkpoint",          checkpoint,    "--prompt", kPrompt,
        "--max-new-tokens", std::to_string(kTokens), "--tokenizer", "bytes"};
    args.insert(args.end(), more.begin(), more.end());
    return Shardline(args);
  }

  // Starts `shardline serve` on any free port; returns the port it printed (0 on failure).
  int StartServe(const std::vector<std::string>& args) {
    log_ = TempDir() + "/serve.log";
    SpawnOptions spawn;
    spawn.argv = {Binary(),      "serve", "--listen",     "127.0.0.1:0",
                  "--tokenizer", "bytes", "--model-name", "llama"};
    spawn.log_path = log_;
    spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
    absl::StatusOr<pid_t> pid = Spawn(spawn);
    if (!pid.ok()) {
      ADD_FAILURE() << pid.status();
      return 0;
    }
    pid_ = *pid;
    const std::regex url("at http://127\\.0\\.0\\.1:([0-9]+)/v1");
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      std::smatch m;
      const std::string out = ReadAll(log_);
      if (std::regex_search(out, m, url)) return std::stoi(m[1]);
      auto exit = TryReap(pid_);
      if (exit.ok() && exit->has_value()) {
        pid_ = -1;
        ADD_FAILURE() << "serve exited (" << (*exit)->Describe() << "): " << out;
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "serve printed no URL within 60 s: " << ReadAll(log_);
    return 0;
  }

  // The greedy completion of kPrompt that the server at `port` gives.
  static std::string Complete(int port) {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(5);
    client.set_read_timeout(60);
    const json body = {
        {"model", "llama"}, {"prompt", kPrompt}, {"max_tokens", kTokens}, {"temperature", 0}};
    auto res = client.Post("/v1/completions", body.dump(), "application/json");
    if (!res) {
      ADD_FAILURE() << httplib::to_string(res.error());
      return "";
    }
    EXPECT_EQ(res->status, 200) << res->body;
    if (res->status != 200) return "";
    return json::parse(res->body)["choices"][0]["text"].get<std::string>();
  }

  void StopServe() {
    ASSERT_EQ(::kill(pid_, SIGTERM), 0);
    auto exit = WaitFor(pid_, std::chrono::seconds(15));
    ASSERT_TRUE(exit.ok() && exit->has_value()) << "serve did not stop on SIGTERM";
    pid_ = -1;
    EXPECT_TRUE((*exit)->success()) << (*exit)->Describe() << ": " << ReadAll(log_);
  }

  const Folder* folder_ = nullptr;
  pid_t pid_ = -1;
  std::string log_;
};

TEST_F(CliHfLlamaTest, GenerateSaysWhatPyTorchSays) {
  const std::string expected = kPrompt + folder_->completion + "\n";
  for (const std::string& path : {folder_->dir, folder_->dir + "/config.json",
                                  folder_->dir + "/model.safetensors.index.json"}) {
    const CommandResult run = Generate(path);
    EXPECT_EQ(run.exit_code, 0) << path << ": " << run.out;
    EXPECT_EQ(run.out, expected) << path;
  }
  const CommandResult uncached = Generate(folder_->dir, {"--no-kv-cache"});
  EXPECT_EQ(uncached.out, expected);
}

TEST_F(CliHfLlamaTest, ServeOnOneAndOnTwoTensorParallelProcessesSaysItToo) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{}, std::vector<std::string>{"--tp", "2"}}) {
    SCOPED_TRACE(flags.empty() ? "one process" : "--tp 2");
    std::vector<std::string> args = {"--checkpoint", folder_->dir};
    args.insert(args.end(), flags.begin(), flags.end());
    const int port = StartServe(args);
    ASSERT_GT(port, 0);
    EXPECT_EQ(Complete(port), folder_->completion);
    StopServe();
  }
}

// tp must divide the query heads (4): refused before any rank starts, naming both.
TEST_F(CliHfLlamaTest, ServeRefusesATensorParallelCutThatDoesNotFit) {
  const CommandResult run = Shardline({"serve", "--checkpoint", folder_->dir, "--listen",
                                       "127.0.0.1:0", "--tokenizer", "bytes", "--tp", "3"});
  EXPECT_EQ(run.exit_code, 2) << run.out;
  EXPECT_THAT(run.out, AllOf(HasSubstr("--tp 3"), HasSubstr("heads 4")));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("serving ")));
}

TEST_F(CliHfLlamaTest, ExportWritesALlamaFolderThatSaysTheSame) {
  const std::string expected = kPrompt + folder_->completion + "\n";
  // From the Hugging Face folder itself.
  const std::string out = TempDir() + "/export";
  CommandResult run =
      Shardline({"checkpoint", "export", folder_->dir, "--format", "hf", "--out", out});
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("transformers.LlamaForCausalLM.from_pretrained"));
  EXPECT_TRUE(fs::is_regular_file(out + "/model.safetensors"));
  EXPECT_EQ(Generate(out).out, expected);

  // From our own checkpoint of the same model.
  absl::StatusOr<model::ModelParams> params = training::LoadModel(folder_->dir);
  ASSERT_TRUE(params.ok()) << params.status();
  const std::string ours = TempDir() + "/ours.safetensors";
  ASSERT_TRUE(training::SaveModel(*params, ours).ok());
  EXPECT_EQ(Generate(ours).out, expected);
  const std::string out2 = TempDir() + "/export2";
  run = Shardline({"checkpoint", "export", ours, "--format", "hf", "--out", out2});
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(ReadAll(out2 + "/config.json"), ReadAll(out + "/config.json"));
  EXPECT_EQ(ReadAll(out2 + "/model.safetensors"), ReadAll(out + "/model.safetensors"));
}

TEST_F(CliHfLlamaTest, ABadFolderIsNamedBeforeAnythingRuns) {
  // Another architecture.
  const std::string qwen = TempDir() + "/qwen";
  fs::copy(folder_->dir, qwen, fs::copy_options::recursive);
  std::ifstream in(qwen + "/config.json");
  json config = json::parse(in);
  config["architectures"] = {"Qwen2ForCausalLM"};
  std::ofstream(qwen + "/config.json") << config.dump();
  CommandResult run = Generate(qwen);
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_THAT(run.out, AllOf(HasSubstr(qwen + "/config.json"), HasSubstr("'architectures'"),
                             HasSubstr("Qwen2ForCausalLM")));

  // A shard file gone: serve says which entry of the index names it, and serves nothing.
  const std::string gone = TempDir() + "/gone";
  fs::copy(folder_->dir, gone, fs::copy_options::recursive);
  fs::remove(gone + "/model-00002-of-00002.safetensors");
  run =
      Shardline({"serve", "--checkpoint", gone, "--listen", "127.0.0.1:0", "--tokenizer", "bytes"});
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_THAT(run.out, AllOf(HasSubstr("model.safetensors.index.json"),
                             HasSubstr("model-00002-of-00002.safetensors")));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("serving ")));
}

}  // namespace
}  // namespace shardline
