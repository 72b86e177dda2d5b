// `shardline generate --tokenizer`, and the tokenizer it takes from a Hugging Face folder by
// itself (GPT-2's files, or a Llama-style tokenizer.json with its config files): the BOS put
// before the prompt, the end-of-sequence tokens it stops at, the space a continuation keeps. The
// model is built to say one thing: every weight zero but the final LayerNorm's bias and one row of
// the (tied) embedding, so that greedy decoding gives that row's token every time; which text comes
// out then shows which tokenizer decoded it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/gpt2_hf_export.h"
#include "common/process.h"
#include "model/tensor_table.h"
#include "nlohmann/json.hpp"
#include "tests/support/cli_process.h"
#include "worker/model/data/bpe_tokenizer.h"

namespace shardline {
namespace {

namespace stdfs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kModelVocab = 258;  // 256 bytes, "ab", "<|endoftext|>"
constexpr int64_t kAb = 256;          // the token the model always says

std::string TempDir() { return test_support::MakeTestDir("cli_generate"); }
std::string ReadAll(const std::string& path) { return test_support::ReadWholeFile(path); }

using test_support::CommandResult;

CommandResult Shardline(const std::vector<std::string>& args) {
  return test_support::RunShardline(args, TempDir() + "/out.log");
}

// A Hugging Face folder (model.safetensors + config.json) of the model that always says kAb.
std::string ExportModel(int64_t vocab = kModelVocab) {
  checkpoint::Gpt2Weights weights;
  weights.config = {.layers = 1,
                    .heads = 2,
                    .d_model = 8,
                    .d_ff = 16,
                    .vocab = vocab,
                    .max_seq_len = 32,
                    .tied_embeddings = true};
  for (const model::TensorRow& spec : model::ModelRows(weights.config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    weights.tensors[spec.name] = {spec.shape, std::vector<float>(n, 0.0f)};
  }
  // The final LayerNorm gives its bias whatever comes in; the logits are bias · wte rows.
  for (float& v : weights.tensors["lnf.b"].values) v = 1.0f;
  if (kAb < vocab) {
    for (int64_t c = 0; c < 8; ++c) weights.tensors["wte"].values[kAb * 8 + c] = 1.0f;
  }
  const std::string dir = TempDir() + "/hf";
  const absl::Status status = checkpoint::ExportHfGpt2(weights, dir);
  EXPECT_TRUE(status.ok()) << status;
  return dir;
}

// vocab.json + merges.txt into `dir`: the bytes, "ab" (id 256), then `extra` more tokens, then
// "<|endoftext|>".
void WriteTokenizer(const std::string& dir, int extra = 0) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[std::string(data::Gpt2ByteChar(static_cast<unsigned char>(b)))] = b;
  }
  vocab["ab"] = kAb;
  for (int i = 0; i < extra; ++i) vocab["x" + std::to_string(i)] = kAb + 1 + i;
  vocab["<|endoftext|>"] = kAb + 1 + extra;
  std::ofstream(dir + "/vocab.json") << vocab.dump();
  std::ofstream(dir + "/merges.txt") << "#version: 0.2\na b\n";
}

std::vector<std::string> Generate(const std::string& checkpoint, std::vector<std::string> more) {
  std::vector<std::string> args = {"generate", "--checkpoint",     checkpoint, "--prompt",
                                   "hi ",      "--max-new-tokens", "3"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(CliGenerateTokenizerTest, AHuggingFaceFolderSpeaksItsOwnTokenizer) {
  const std::string hf = ExportModel();
  WriteTokenizer(hf);
  const CommandResult run = Shardline(Generate(hf, {}));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("hi ababab")) << "id 256 is \"ab\" to the folder's tokenizer";
  // Naming the model file rather than the folder finds the same files.
  const CommandResult by_file = Shardline(Generate(hf + "/model.safetensors", {}));
  ASSERT_EQ(by_file.exit_code, 0) << by_file.out;
  EXPECT_THAT(by_file.out, HasSubstr("hi ababab"));
}

TEST(CliGenerateTokenizerTest, TokenizerFlagOverridesTheFolder) {
  const std::string hf = ExportModel();
  WriteTokenizer(hf);
  // To the byte tokenizer id 256 is its end-of-text marker (printed only with --ignore-eos).
  const CommandResult bytes = Shardline(Generate(hf, {"--tokenizer", "bytes", "--ignore-eos"}));
  ASSERT_EQ(bytes.exit_code, 0) << bytes.out;
  EXPECT_THAT(bytes.out, HasSubstr("hi <|endoftext|><|endoftext|><|endoftext|>"));

  // A folder without tokenizer files is bytes unless --tokenizer names some.
  const std::string bare = ExportModel();
  const CommandResult plain = Shardline(Generate(bare, {"--ignore-eos"}));
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  EXPECT_THAT(plain.out, HasSubstr("hi <|endoftext|><|endoftext|><|endoftext|>"));
  for (const std::string& spec : {hf, hf + "/vocab.json"}) {
    const CommandResult named = Shardline(Generate(bare, {"--tokenizer", spec}));
    ASSERT_EQ(named.exit_code, 0) << named.out;
    EXPECT_THAT(named.out, HasSubstr("hi ababab")) << spec;
  }
}

TEST(CliGenerateTokenizerTest, ATokenizerLargerThanTheModelIsRefused) {
  const std::string hf = ExportModel();
  const std::string big = TempDir();
  WriteTokenizer(big, /*extra=*/40);  // 298 tokens for a model of 258
  const CommandResult run = Shardline(Generate(hf, {"--tokenizer", big}));
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_THAT(run.out, HasSubstr("the GPT-2 BPE tokenizer of " + big +
                                 "/vocab.json has 298 tokens but the model's vocabulary is 258"));
  // The byte tokenizer's 257 against a model of 200.
  const CommandResult small = Shardline(Generate(ExportModel(200), {}));
  EXPECT_EQ(small.exit_code, 1) << small.out;
  EXPECT_THAT(small.out,
              HasSubstr("the byte tokenizer has 257 tokens but the model's vocabulary is 200"));
}

// Generation ends at the tokenizer's end-of-sequence token, which is not printed.
TEST(CliGenerateTokenizerTest, GenerationStopsAtTheEndOfText) {
  const std::string hf = ExportModel();
  const CommandResult run = Shardline(Generate(hf, {"--tokenizer", "bytes"}));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("hi \n"));
  EXPECT_THAT(run.out, Not(HasSubstr("<|endoftext|>")));
}

// A Llama-style folder: tokenizer.json of the SentencePiece kind (TinyLlama's normalizer and
// decoder; id 256 is "▁ab"), tokenizer_config.json and generation_config.json.
void WriteLlamaTokenizer(const std::string& dir, const nlohmann::json& eos_token_id) {
  using nlohmann::json;
  const json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\u2581", 3},  {"a", 4},
                      {"b", 5},     {"h", 6},   {"i", 7},    {"\u2581a", 8}, {"\u2581ab", kAb}};
  const auto added = [](int id, const char* content) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  const json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", json::array({added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array(
             {{{"type", "Prepend"}, {"prepend", "\u2581"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", json::array({"\u2581 a", "\u2581a b"})}}}};
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump(1);
  std::ofstream(dir + "/tokenizer_config.json")
      << json{{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_bos_token", true}}.dump();
  std::ofstream(dir + "/generation_config.json")
      << json{{"bos_token_id", 1}, {"eos_token_id", eos_token_id}}.dump();
}

TEST(CliGenerateTokenizerTest, ALlamaFolderSpeaksItsTokenizerJson) {
  const std::string hf = ExportModel();
  WriteLlamaTokenizer(hf, 2);
  // Each "▁ab" after the prompt keeps its space (a continuation, not a text's first word).
  const CommandResult run = Shardline(Generate(hf, {}));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("hi  ab ab ab"));
  // The BOS the tokenizer puts first is a prompt even when the text has no tokens.
  std::vector<std::string> empty = Generate(hf, {});
  empty[4] = "";
  const CommandResult bos_only = Shardline(empty);
  ASSERT_EQ(bos_only.exit_code, 0) << bos_only.out;
  EXPECT_THAT(bos_only.out, HasSubstr(" ab ab ab"));
}

TEST(CliGenerateTokenizerTest, StopsOnAnyEndOfSequenceIdOfGenerationConfig) {
  const std::string hf = ExportModel();
  WriteLlamaTokenizer(hf, nlohmann::json::array({2, kAb}));
  const CommandResult run = Shardline(Generate(hf, {}));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("hi \n"));
  EXPECT_THAT(run.out, Not(HasSubstr("hi  ab")));
  const CommandResult ignoring = Shardline(Generate(hf, {"--ignore-eos"}));
  ASSERT_EQ(ignoring.exit_code, 0) << ignoring.out;
  EXPECT_THAT(ignoring.out, HasSubstr("hi  ab ab ab"));
}

TEST(CliGenerateTokenizerTest, BadTokenizerJsonIsAnErrorNamingTheField) {
  const std::string hf = ExportModel();
  WriteLlamaTokenizer(hf, 2);
  auto tokenizer = nlohmann::json::parse(ReadAll(hf + "/tokenizer.json"));
  tokenizer["normalizer"]["normalizers"][0] = {{"type", "NFKC"}};
  std::ofstream(hf + "/tokenizer.json") << tokenizer.dump();
  const CommandResult run = Shardline(Generate(hf, {}));
  EXPECT_EQ(run.exit_code, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr("the checkpoint folder's tokenizer: " + hf +
                                 "/tokenizer.json: normalizer.normalizers[0].type 'NFKC' is not "
                                 "supported"));
}

TEST(CliGenerateTokenizerTest, BadTokenizerIsAnErrorNamingIt) {
  const std::string hf = ExportModel();
  const std::string missing = TempDir() + "/no-such-tokenizer";
  const CommandResult run = Shardline(Generate(hf, {"--tokenizer", missing}));
  EXPECT_EQ(run.exit_code, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr("error: --tokenizer: no tokenizer at " + missing));
  // Broken files in the checkpoint's folder are not silently replaced by bytes.
  WriteTokenizer(hf);
  std::ofstream(hf + "/merges.txt") << "a b c\n";
  const CommandResult broken = Shardline(Generate(hf, {}));
  EXPECT_EQ(broken.exit_code, 2) << broken.out;
  EXPECT_THAT(broken.out,
              HasSubstr("the checkpoint folder's tokenizer: " + hf + "/merges.txt line 1:"));
}

}  // namespace
}  // namespace shardline
