// BpeTokenizer with tokenizer.json files of both kinds against Hugging Face's `tokenizers`: the
// reference (data_hf_tokenizer_reference.py) trains a Llama 3-style byte-level BPE and a
// TinyLlama-style SentencePiece BPE (and the same model with a Metaspace pre-tokenizer) with
// `tokenizers` itself, saves them as Hugging Face model folders, and encodes and decodes the
// edge-case corpus (tests/support/tokenizer_corpus.h and Llama's special tokens); we load the same
// folders through LoadTokenizer and must give the same ids, with and without the special tokens,
// and the same decoded text, and decode(encode(x)) == x.
//
// Text that is not UTF-8 `tokenizers` cannot take at all (Python strings are Unicode). So such
// text is compared on what `tokenizers` can be given: the same bytes with each ill-formed byte
// replaced by U+FFFD, whose ids must be equal; the raw bytes themselves must round-trip through our
// Encode and Decode (bpe_tokenizer.h says how they are encoded).
//
// `tokenizers` comes from scripts/install-deps.sh (SHARDLINE_GPT2_TOKENIZER_DIR, which the GPT-2
// reference test uses too); without it these tests fail, saying so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
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
using json = nlohmann::json;

constexpr char kPython[] = "/usr/bin/python3";
const char* const kKinds[] = {"llama3", "tinyllama", "metaspace"};

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

// `text` with every byte that is not part of well-formed UTF-8 replaced by U+FFFD.
std::string Lossy(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char b0 = static_cast<unsigned char>(text[i]);
    size_t len = 0;
    const auto cont = [&](size_t k, int lo, int hi) {
      if (i + k >= text.size()) return false;
      const int b = static_cast<unsigned char>(text[i + k]);
      return b >= lo && b <= hi;
    };
    if (b0 < 0x80) {
      len = 1;
    } else if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = cont(1, 0x80, 0xBF) ? 2 : 0;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = cont(1, b0 == 0xE0 ? 0xA0 : 0x80, b0 == 0xED ? 0x9F : 0xBF) && cont(2, 0x80, 0xBF) ? 3
                                                                                               : 0;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = cont(1, b0 == 0xF0 ? 0x90 : 0x80, b0 == 0xF4 ? 0x8F : 0xBF) && cont(2, 0x80, 0xBF) &&
                    cont(3, 0x80, 0xBF)
                ? 4
                : 0;
    }
    if (len == 0) {
      out += "\xef\xbf\xbd";
      ++i;
    } else {
      out.append(text, i, len);
      i += len;
    }
  }
  return out;
}

// Text with ill-formed UTF-8 put in at random places, and random bytes.
std::vector<std::string> InvalidUtf8Texts() {
  const std::vector<std::string> bad = testing::InvalidUtf8Pieces();
  const std::vector<std::string> corpus = testing::TokenizerCorpus();
  std::mt19937 rng(77);
  std::vector<std::string> cases = bad;
  for (int i = 0; i < 100; ++i) {
    std::string bytes(rng() % 200, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    cases.push_back(std::move(bytes));
  }
  for (int i = 0; i < 200; ++i) {
    std::string text = corpus[rng() % corpus.size()].substr(0, 300);
    for (int k = 0; k < 3; ++k) {
      text.insert(text.empty() ? 0 : rng() % text.size(), bad[rng() % bad.size()]);
    }
    if (i % 10 == 0) text.insert(text.empty() ? 0 : rng() % text.size(), "<|eot_id|>");
    cases.push_back(std::move(text));
  }
  return cases;
}

// The shared corpus, Llama's special tokens and added tokens in and around text, and the lossy
// (U+FFFD) versions of the invalid UTF-8 texts.
std::vector<std::string> Corpus() {
  std::vector<std::string> corpus = testing::TokenizerCorpus();
  const std::vector<std::string> more = {
      "<|begin_of_text|>Hello<|eot_id|>",
      "<|eot_id|><|eot_id|>",
      " <|end_of_text|> ",
      "<|begin_of_text",
      "text<|end_of_text|>\n\nnext",
      "Shardline",
      "Shardline's shard",
      "theShardline",
      "Shardline!",
      "x Shardline y",
      "a <|sep|>  b",
      "x\n<|sep|>\ny",
      "<|sep|>",
      "<s>",
      "</s> hi",
      "<s>Hello</s>",
      "<unk>",
      "<0x41>",
      "<0x0A>",
      "\u2581",
      "\u2581\u2581x",
      " \u2581 x",
      "shard",
      "the shard",
      "shards shard",
      "1234567",
      "12 345 6789 1,234,567.89",
      "I'M WE'LL you'Re THEY'VE",
      "\t\t\n\n  \r\n",
      "\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80",
      "\xf0\x9f\x87\xba\xf0\x9f\x87\xb8",
      "\xe4\xb8\xad\xe6\x96\x87\xe6\xb5\x8b\xe8\xaf\x95",
      "    def f():\n        return 1\n",
  };
  corpus.insert(corpus.end(), more.begin(), more.end());
  for (const std::string& text : InvalidUtf8Texts()) corpus.push_back(Lossy(text));
  return corpus;
}

// Where scripts/install-deps.sh put `tokenizers`: PREFIX/lib/python3.X/dist-packages.
std::string TokenizersSite(std::string* error) {
  const std::string prefix = SHARDLINE_GPT2_TOKENIZER_DIR;
  std::error_code ec;
  for (const auto& lib : stdfs::directory_iterator(prefix + "/lib", ec)) {
    for (const char* packages : {"dist-packages", "site-packages"}) {
      if (stdfs::is_directory(lib.path() / packages / "tokenizers", ec)) {
        return (lib.path() / packages).string();
      }
    }
  }
  *error =
      "Hugging Face tokenizers is not installed in " + prefix +
      ": run scripts/install-deps.sh (or configure with -DSHARDLINE_GPT2_TOKENIZER_DIR=PREFIX)";
  return "";
}

struct KindReference {
  std::vector<std::vector<Token>> ids, ids_with_specials;
  std::vector<std::string> decoded;
  int32_t vocab_size = 0;
};

struct Reference {
  std::string dir;  // DIR/KIND/ holds each kind's model folder
  std::map<std::string, KindReference> kinds;
  std::string error;
};

const Reference& RunReference() {
  static const Reference reference = [] {
    Reference ref;
    const std::string site = TokenizersSite(&ref.error);
    if (site.empty()) return ref;
    ref.dir = ::testing::TempDir() + "/hf_reference_XXXXXX";
    if (::mkdtemp(ref.dir.data()) == nullptr) {
      ref.error = "mkdtemp failed";
      return ref;
    }
    const std::string corpus_path = ref.dir + "/corpus.json";
    const std::string log_path = ref.dir + "/python.log";
    std::ofstream(corpus_path) << json(Corpus()).dump();
    SpawnOptions spawn;
    spawn.argv = {kPython, SourceDir() + "/tests/unit/data_hf_tokenizer_reference.py", corpus_path,
                  ref.dir};
    spawn.extra_env = {{"PYTHONPATH", site}};
    spawn.log_path = log_path;
    absl::StatusOr<pid_t> pid = Spawn(spawn);
    if (!pid.ok()) {
      ref.error = "starting " + std::string(kPython) + ": " + ToString(pid.status().message());
      return ref;
    }
    absl::StatusOr<std::optional<ExitStatus>> exit = WaitFor(*pid, std::chrono::seconds(150));
    if (!exit.ok() || !exit->has_value()) {
      if (exit.ok()) Terminate(*pid, std::chrono::seconds(1));
      ref.error = "the reference did not finish within 150 s; its log: " + ReadAll(log_path);
      return ref;
    }
    if (!(*exit)->success()) {
      ref.error = "the reference (" + std::string(kPython) + " with PYTHONPATH=" + site +
                  ") failed with " + (*exit)->Describe() + ": " + ReadAll(log_path);
      return ref;
    }
    const json out = json::parse(ReadAll(ref.dir + "/ids.json"));
    for (const char* kind : kKinds) {
      KindReference& k = ref.kinds[kind];
      const json& j = out.at(kind);
      k.ids = j.at("ids").get<std::vector<std::vector<Token>>>();
      k.ids_with_specials = j.at("ids_with_specials").get<std::vector<std::vector<Token>>>();
      k.decoded = j.at("decoded").get<std::vector<std::string>>();
      k.vocab_size = j.at("vocab_size").get<int32_t>();
    }
    return ref;
  }();
  return reference;
}

std::unique_ptr<Tokenizer> LoadKind(const std::string& kind) {
  const Reference& ref = RunReference();
  EXPECT_TRUE(ref.error.empty()) << ref.error;
  if (!ref.error.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(ref.dir + "/" + kind);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

std::string Show(const std::string& text) {
  return json(text.substr(0, 200)).dump(-1, ' ', true, json::error_handler_t::replace);
}

// How many corpus strings differ, with the first shown; "" when none do.
template <typename T>
std::string Differences(const std::vector<std::string>& corpus, const std::vector<T>& ours,
                        const std::vector<T>& theirs, int* differing) {
  std::string first;
  *differing = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    if (ours[i] == theirs[i]) continue;
    if ((*differing)++ == 0) {
      first = "corpus[" + std::to_string(i) + "] = " + Show(corpus[i]) + "\n  ours:       " +
              json(ours[i]).dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 400) +
              "\n  tokenizers: " +
              json(theirs[i]).dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 400);
    }
  }
  return first;
}

class HfTokenizerReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerReferenceTest, IdsAndTextEqualHuggingFaceTokenizers) {
  const std::unique_ptr<Tokenizer> tokenizer = LoadKind(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  const KindReference& ref = RunReference().kinds.at(GetParam());
  const std::vector<std::string> corpus = Corpus();
  ASSERT_EQ(ref.ids.size(), corpus.size());
  EXPECT_EQ(tokenizer->vocab_size(), ref.vocab_size);
  std::vector<std::vector<Token>> ids, with_specials;
  std::vector<std::string> decoded;
  for (size_t i = 0; i < corpus.size(); ++i) {
    ids.push_back(tokenizer->Encode(corpus[i]));
    with_specials.push_back(tokenizer->EncodeWithSpecials(corpus[i]));
    absl::StatusOr<std::string> text = tokenizer->Decode(ref.ids[i]);
    ASSERT_TRUE(text.ok()) << text.status();
    decoded.push_back(*text);
  }
  int differing = 0;
  std::string first = Differences(corpus, ids, ref.ids, &differing);
  EXPECT_EQ(differing, 0) << differing << " of " << corpus.size()
                          << " strings have other ids; the first:\n"
                          << first;
  first = Differences(corpus, with_specials, ref.ids_with_specials, &differing);
  EXPECT_EQ(differing, 0) << differing << " of " << corpus.size()
                          << " strings have other ids with the special tokens; the first:\n"
                          << first;
  first = Differences(corpus, decoded, ref.decoded, &differing);
  EXPECT_EQ(differing, 0) << differing << " of " << corpus.size()
                          << " strings decode to other text; the first:\n"
                          << first;
  RecordProperty("corpus_strings", static_cast<int>(corpus.size()));
}

// decode(encode(x)) == x, for the corpus and for bytes that are not UTF-8, except where the
// pipeline drops text by design (bpe_tokenizer.h): <|sep|>'s lstrip and rstrip take whitespace;
// the SentencePiece kinds' decoders turn an input "▁" into a space; TinyLlama's Prepend
// normalizer puts a "▁" before each piece between added tokens ("</s> hi" decodes with two
// spaces, in `tokenizers` too); a Metaspace pre-tokenizer encodes " x" as it encodes "x".
TEST_P(HfTokenizerReferenceTest, DecodeGivesBackTheText) {
  const std::unique_ptr<Tokenizer> tokenizer = LoadKind(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  std::vector<std::string> texts = testing::TokenizerCorpus();
  for (const std::string& text : InvalidUtf8Texts()) texts.push_back(text);
  for (const std::string& text : Corpus()) texts.push_back(text);
  int checked = 0;
  for (const std::string& text : texts) {
    if (text.find("<|sep|>") != std::string::npos) continue;
    if (GetParam() != "llama3" && text.find("\u2581") != std::string::npos) continue;
    if (GetParam() == "tinyllama" &&
        (text.find("<s>") != std::string::npos || text.find("</s>") != std::string::npos ||
         text.find("<unk>") != std::string::npos)) {
      continue;
    }
    if (GetParam() == "metaspace" && !text.empty() && text[0] == ' ') continue;
    ++checked;
    absl::StatusOr<std::string> decoded = tokenizer->Decode(tokenizer->Encode(text));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ASSERT_EQ(*decoded, text) << Show(text);
  }
  RecordProperty("texts_checked", checked);
}

// Decoding a generated stream a token at a time (as serving does) gives what decoding it whole
// gives after the prompt.
TEST_P(HfTokenizerReferenceTest, ContinuationsDecodeAsTheWhole) {
  const std::unique_ptr<Tokenizer> tokenizer = LoadKind(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<Token> prompt = tokenizer->Encode("Once upon");
  for (const std::string text :
       {"a time, there was a shard.", "  two spaces", "\xe4\xbd\xa0\xe5\xa5\xbd!"}) {
    std::vector<Token> all = prompt;
    const std::vector<Token> generated = tokenizer->Encode(text);
    all.insert(all.end(), generated.begin(), generated.end());
    std::string streamed = *tokenizer->Decode(prompt);
    for (const Token t : generated) {
      streamed += *tokenizer->DecodeContinuation(std::span<const Token>(&t, 1));
    }
    EXPECT_EQ(streamed, *tokenizer->Decode(all)) << text;
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, HfTokenizerReferenceTest,
                         ::testing::Values("llama3", "tinyllama", "metaspace"));

// The special tokens of each folder's tokenizer_config.json and generation_config.json.
TEST(HfTokenizerReferenceFolderTest, SpecialTokensFromTheConfigFiles) {
  const Reference& ref = RunReference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const json llama3 = json::parse(ReadAll(ref.dir + "/llama3/generation_config.json"));
  const std::unique_ptr<Tokenizer> tokenizer = LoadKind("llama3");
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<Token> eos = llama3.at("eos_token_id").get<std::vector<Token>>();
  EXPECT_EQ(tokenizer->stop_tokens(), eos);  // <|end_of_text|> and <|eot_id|>
  EXPECT_EQ(tokenizer->eot(), eos[1]);       // tokenizer_config's eos_token: <|eot_id|>
  EXPECT_EQ(tokenizer->EncodeWithSpecials("").front(), llama3.at("bos_token_id").get<Token>());

  const std::unique_ptr<Tokenizer> tiny = LoadKind("tinyllama");
  ASSERT_NE(tiny, nullptr);
  EXPECT_EQ(tiny->stop_tokens(), std::vector<Token>{2});
  EXPECT_EQ(tiny->EncodeWithSpecials("hi").front(), 1);
}

}  // namespace
}  // namespace shardline::data
