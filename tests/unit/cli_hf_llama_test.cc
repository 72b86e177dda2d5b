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
#include "worker/model/data/bpe_tokenizer.h"
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

std::string TempDir() { return test_support::MakeTestDir("cli_hf_llama"); }
std::string ReadAll(const std::string& path) { return test_support::ReadWholeFile(path); }

std::string SourceDir() {
  if (const char* dir = std::getenv("SHARDLINE_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return SHARDLINE_SOURCE_PATH;
}

using test_support::CommandResult;

CommandResult Shardline(const std::vector<std::string>& args) {
  return test_support::RunShardline(args, TempDir() + "/out.log");
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

  // Starts `shardline serve` on any free port, with the byte tokenizer unless `folder_tokenizer`
  // (then the checkpoint folder's own); returns the port it printed (0 on failure).
  int StartServe(const std::vector<std::string>& args, bool folder_tokenizer = false) {
    log_ = TempDir() + "/serve.log";
    std::vector<std::string> argv = {"--listen", "127.0.0.1:0", "--model-name", "llama"};
    if (!folder_tokenizer) argv.insert(argv.end(), {"--tokenizer", "bytes"});
    argv.insert(argv.end(), args.begin(), args.end());
    return test_support::StartServe(argv, log_, pid_);
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

// The folder as a Hugging Face user has it: a tokenizer.json (byte-level BPE whose 256 byte tokens
// are the byte ids, no merges, and <|endoftext|> as 256: the byte tokenizer's ids) and a
// tokenizer_config.json with a ChatML chat template. `serve --tp 2` takes both from the folder: a
// chat completion renders the template and answers what a completion of the rendered text says,
// which is what single-device `generate` says for it.
TEST_F(CliHfLlamaTest, ServeAtTpTwoRendersTheFoldersChatTemplateAsGenerateSaysIt) {
  const std::string dir = TempDir() + "/with-tokenizer";
  std::filesystem::create_directories(dir);
  for (const auto& entry : std::filesystem::directory_iterator(folder_->dir)) {
    std::filesystem::create_symlink(entry.path(), dir + "/" + entry.path().filename().string());
  }
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[std::string(data::Gpt2ByteChar(static_cast<unsigned char>(b)))] = b;
  }
  vocab["<|endoftext|>"] = 256;
  const json tokenizer = {{"version", "1.0"},
                          {"added_tokens",
                           {{{"id", 256},
                             {"content", "<|endoftext|>"},
                             {"single_word", false},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"normalized", false},
                             {"special", true}}}},
                          {"normalizer", nullptr},
                          {"pre_tokenizer",
                           {{"type", "ByteLevel"},
                            {"add_prefix_space", false},
                            {"trim_offsets", true},
                            {"use_regex", true}}},
                          {"post_processor", nullptr},
                          {"decoder",
                           {{"type", "ByteLevel"},
                            {"add_prefix_space", true},
                            {"trim_offsets", true},
                            {"use_regex", true}}},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"continuing_subword_prefix", ""},
                            {"end_of_word_suffix", ""},
                            {"fuse_unk", false},
                            {"byte_fallback", false},
                            {"ignore_merges", false},
                            {"vocab", vocab},
                            {"merges", json::array()}}}};
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  const std::string chat_template =
      "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  const json config = {{"chat_template", chat_template},
                       {"eos_token", "<|endoftext|>"},
                       {"bos_token", "<|endoftext|>"},
                       {"add_bos_token", false}};
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  const std::string rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";

  // Single-device generate of the rendered text, with the folder's tokenizer.
  const CommandResult generated =
      Shardline({"generate", "--checkpoint", dir, "--prompt", rendered, "--max-new-tokens",
                 std::to_string(kTokens), "--ignore-eos"});
  ASSERT_EQ(generated.exit_code, 0) << generated.out;
  ASSERT_EQ(generated.out.substr(0, rendered.size()), rendered) << generated.out;
  const std::string want =
      generated.out.substr(rendered.size(), generated.out.size() - rendered.size() - 1);

  const int port = StartServe({"--checkpoint", dir, "--tp", "2"}, /*folder_tokenizer=*/true);
  ASSERT_GT(port, 0) << ReadAll(log_);
  EXPECT_THAT(ReadAll(log_), ::testing::HasSubstr("tokenizer_config.json"));
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60);
  const json chat = {{"model", "llama"},
                     {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"max_tokens", kTokens},
                     {"temperature", 0}};
  auto res = client.Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body;
  const json answer = json::parse(res->body);
  const std::string text = answer["choices"][0]["message"]["content"].get<std::string>();
  // The reply stops early only at the end-of-text token, which generate --ignore-eos runs past.
  EXPECT_GE(text.size(), 4u) << answer.dump();
  EXPECT_EQ(text, want.substr(0, text.size()));
  if (answer["choices"][0]["finish_reason"] == "length") {
    EXPECT_EQ(text, want);
  }
  // The template's prompt, encoded: every byte of it, no BOS added.
  EXPECT_EQ(answer["usage"]["prompt_tokens"].get<int>(), static_cast<int>(rendered.size()));
  StopServe();
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
