// Hugging Face tokenizer.json files of the two kinds in use, small and hand-written, through
// LoadTokenizer: byte-level BPE with Llama 3's Split pattern and ignore_merges, and
// SentencePiece-style BPE (TinyLlama's normalizer Prepend + Replace with byte_fallback, and the
// Metaspace pre-tokenizer of newer conversions); added tokens and their flags; the special tokens
// of tokenizer_config.json and generation_config.json; and the errors, each naming the file and the
// field. The ids expected here are what tokenizers 0.23 gives for the same files (larger files
// and an edge-case corpus: data_hf_tokenizer_reference_test).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/data/bpe_tokenizer.h"
#include "worker/model/data/tokenizer.h"
#include "worker/model/data/tokenizer_json.h"

namespace shardline::data {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string Message(const absl::Status& status) { return ToString(status.message()); }

std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "/hf_tok_XXXXXX";
  const char* dir = ::mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

std::string Spell(std::string_view text) {
  std::string out;
  for (char c : text) out.append(Gpt2ByteChar(static_cast<unsigned char>(c)));
  return out;
}

json AddedToken(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", !special}, {"special", special}};
}

json BosTemplate(const std::string& bos, int id) {
  return {{"type", "TemplateProcessing"},
          {"single", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
          {"pair", json::array()},
          {"special_tokens", {{bos, {{"id", bos}, {"ids", {id}}, {"tokens", {bos}}}}}}};
}

// Llama 3's kind: bytes 0-255, then "ab" 256, "abc" 257, "Ġab" 258, "12" 259, "123" 260,
// "xyz" 261 (a token without the merges that would build it: only ignore_merges reaches it),
// "'s" 262; <|begin_of_text|> 263, <|end_of_text|> 264, <|eot_id|> 265.
json ByteLevelTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[std::string(Gpt2ByteChar(static_cast<unsigned char>(b)))] = b;
  const std::vector<std::string> extra = {"ab", "abc", " ab", "12", "123", "xyz", "'s"};
  for (size_t i = 0; i < extra.size(); ++i) vocab[Spell(extra[i])] = 256 + static_cast<int>(i);
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       json::array({AddedToken(263, "<|begin_of_text|>"), AddedToken(264, "<|end_of_text|>"),
                    AddedToken(265, "<|eot_id|>")})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", kLlama3Pattern}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       {{"type", "ByteLevel"},
                                        {"add_prefix_space", false},
                                        {"trim_offsets", true},
                                        {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "Sequence"},
        {"processors", json::array({{{"type", "ByteLevel"},
                                     {"add_prefix_space", true},
                                     {"trim_offsets", false},
                                     {"use_regex", true}},
                                    BosTemplate("<|begin_of_text|>", 263)})}}},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", true},
        {"vocab", vocab},
        {"merges", json::array({json::array({"a", "b"}), json::array({"ab", "c"}),
                                json::array({Spell(" "), "ab"}), json::array({"1", "2"}),
                                json::array({"12", "3"}), json::array({"'", "s"})})}}},
  };
}

// TinyLlama's kind: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3-258, then "▁" 259, "a" 260, "b" 261,
// "c" 262, "▁a" 263, "ab" 264, "▁ab" 265, "▁c" 266.
json SentencePieceTokenizer() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  const std::vector<std::string> extra = {"\u2581",  "a",  "b",        "c",
                                          "\u2581a", "ab", "\u2581ab", "\u2581c"};
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 259 + static_cast<int>(i);
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       json::array({AddedToken(0, "<unk>"), AddedToken(1, "<s>"), AddedToken(2, "</s>")})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array(
             {{{"type", "Prepend"}, {"prepend", "\u2581"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", BosTemplate("<s>", 1)},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array({"\u2581 a", "a b", "\u2581a b", "\u2581 c"})}}},
  };
}

// The same model as newer conversions write it: no normalizer, Metaspace with prepend_scheme
// "first" and no split, and the Metaspace decoder.
json MetaspaceTokenizer() {
  json j = SentencePieceTokenizer();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\u2581"},
                        {"prepend_scheme", "first"},
                        {"split", false}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Metaspace"},
                                             {"replacement", "\u2581"},
                                             {"prepend_scheme", "first"},
                                             {"split", false}},
                                            {{"type", "ByteFallback"}},
                                            {{"type", "Fuse"}}})}};
  return j;
}

// `j` as DIR/tokenizer.json, with `files` (name → JSON) beside it; returns DIR.
std::string WriteFolder(const json& j,
                        const std::vector<std::pair<std::string, json>>& files = {}) {
  const std::string dir = TempDir();
  WriteFile(dir + "/tokenizer.json", j.dump(2));
  for (const auto& [name, contents] : files) WriteFile(dir + "/" + name, contents.dump(2));
  return dir;
}

std::unique_ptr<Tokenizer> Load(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

std::vector<Token> Ids(std::string_view text) {
  std::vector<Token> ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

void ExpectRoundTrip(const Tokenizer& tokenizer, const std::string& text) {
  absl::StatusOr<std::string> decoded = tokenizer.Decode(tokenizer.Encode(text));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, text);
}

// ---- byte-level: Llama 3's kind ---------------------------------------------------------------

TEST(HfByteLevelTokenizerTest, SplitsWithLlama3sPatternAndMerges) {
  const auto tokenizer = Load(WriteFolder(ByteLevelTokenizer()));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 266);
  EXPECT_THAT(tokenizer->Describe(), HasSubstr("/tokenizer.json"));
  EXPECT_EQ(tokenizer->Encode("abc ab"), (std::vector<Token>{257, 258}));
  // Digits go in threes; "12345" is "123" + "45".
  EXPECT_EQ(tokenizer->Encode("12345"), (std::vector<Token>{260, '4', '5'}));
  // (?i:'s) takes an upper-case contraction too; the letters before it stay a word.
  EXPECT_EQ(tokenizer->Encode("ab's"), (std::vector<Token>{256, 262}));
  EXPECT_EQ(tokenizer->Encode("AB'S"), (std::vector<Token>{'A', 'B', '\'', 'S'}));
  // A letter run may take one non-letter before it (Llama 3's [^\r\n\p{L}\p{N}]?\p{L}+).
  EXPECT_EQ(tokenizer->Encode("1ab"), (std::vector<Token>{'1', 256}));
  EXPECT_EQ(tokenizer->Encode("(ab"), (std::vector<Token>{'(', 256}));
  for (const std::string text : {"abc ab", "12345", "  \n\n x", "ab's", "\xe4\xbd\xa0\xff"}) {
    ExpectRoundTrip(*tokenizer, text);
  }
}

TEST(HfByteLevelTokenizerTest, IgnoreMergesTakesAWholeVocabularyToken) {
  json j = ByteLevelTokenizer();
  auto tokenizer = Load(WriteFolder(j));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("xyz"), (std::vector<Token>{261}));
  j["model"]["ignore_merges"] = false;
  tokenizer = Load(WriteFolder(j));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("xyz"), Ids("xyz"));
}

// GPT-2's own pre-tokenizer with add_prefix_space, as RoBERTa-style files have it: a space before
// each piece between added tokens that does not start with one.
TEST(HfByteLevelTokenizerTest, ByteLevelWithItsRegexAndAPrefixSpace) {
  json j = ByteLevelTokenizer();
  j["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", true},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  const auto tokenizer = Load(WriteFolder(j));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("ab"), (std::vector<Token>{258}));
  EXPECT_EQ(tokenizer->Encode(" ab"), (std::vector<Token>{258}));
  EXPECT_EQ(tokenizer->Encode("abc ab"), (std::vector<Token>{' ', 257, 258}));
  EXPECT_EQ(tokenizer->Encode("<|eot_id|>ab"), (std::vector<Token>{265, 258}));
  // GPT-2's \p{N}+ keeps a digit run whole.
  EXPECT_EQ(tokenizer->Encode("12345"), (std::vector<Token>{' ', 260, '4', '5'}));
}

TEST(HfByteLevelTokenizerTest, SpecialTokensAndBos) {
  const std::string dir = WriteFolder(
      ByteLevelTokenizer(),
      {{"tokenizer_config.json", {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}}},
       {"generation_config.json", {{"bos_token_id", 263}, {"eos_token_id", {264, 265}}}}});
  const auto tokenizer = Load(dir);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("<|begin_of_text|>ab<|eot_id|>"),
            (std::vector<Token>{263, 256, 265}));
  // The post-processor's template puts BOS first.
  EXPECT_EQ(tokenizer->EncodeWithSpecials("ab"), (std::vector<Token>{263, 256}));
  EXPECT_EQ(tokenizer->eot(), 265);
  EXPECT_THAT(tokenizer->stop_tokens(), ElementsAre(264, 265));
  const std::vector<Token> ids = {263, 256, 265};
  EXPECT_EQ(*tokenizer->Decode(ids), "<|begin_of_text|>ab<|eot_id|>");
  // As text, a special token is bytes.
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(tokenizer.get());
  ASSERT_NE(bpe, nullptr);
  EXPECT_EQ(bpe->Encode("<|eot_id|>", BpeTokenizer::Specials::kAsText).size(), 10u);
}

TEST(HfByteLevelTokenizerTest, AddedTokenFlags) {
  json j = ByteLevelTokenizer();
  // "ab" is a vocabulary token already, so keeps its id.
  json word = AddedToken(256, "ab", /*special=*/false);
  word["single_word"] = true;
  json strip = AddedToken(266, "<sep>");
  strip["lstrip"] = true;
  strip["rstrip"] = true;
  j["added_tokens"].push_back(word);
  j["added_tokens"].push_back(strip);
  const auto tokenizer = Load(WriteFolder(j));
  ASSERT_NE(tokenizer, nullptr);
  // single_word: "ab" alone is the added token (cut out before the pre-tokenizer, so the spaces
  // around it are tokens of their own), inside "abc" it is not.
  EXPECT_EQ(tokenizer->Encode("x ab y"), (std::vector<Token>{'x', ' ', 256, ' ', 'y'}));
  EXPECT_EQ(tokenizer->Encode("abc"), (std::vector<Token>{257}));
  // lstrip and rstrip take the whitespace around the token with it.
  EXPECT_EQ(tokenizer->Encode("x  <sep>\n y"), (std::vector<Token>{'x', 266, 'y'}));
}

// ---- SentencePiece-style: Llama 2's and TinyLlama's kind --------------------------------------

TEST(HfSentencePieceTokenizerTest, NormalizerPrependsAndReplacesSpaces) {
  const std::string dir = WriteFolder(
      SentencePieceTokenizer(), {{"tokenizer_config.json",
                                  {{"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
                                   {"eos_token", {{"__type", "AddedToken"}, {"content", "</s>"}}},
                                   {"add_bos_token", true},
                                   {"add_eos_token", false}}}});
  const auto tokenizer = Load(dir);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 267);
  // "▁ab▁ab", "▁ab▁▁c" (the second ▁ merges with nothing before "▁c").
  EXPECT_EQ(tokenizer->Encode("ab ab"), (std::vector<Token>{265, 265}));
  EXPECT_EQ(tokenizer->Encode("ab  c"), (std::vector<Token>{265, 259, 266}));
  EXPECT_EQ(tokenizer->EncodeWithSpecials("ab"), (std::vector<Token>{1, 265}));
  EXPECT_EQ(tokenizer->eot(), 2);
  EXPECT_THAT(tokenizer->stop_tokens(), ElementsAre(2));
  // Each piece between added tokens is normalized alone (so gets its own "▁").
  EXPECT_EQ(tokenizer->Encode("ab</s>ab"), (std::vector<Token>{265, 2, 265}));
  for (const std::string text :
       {"ab ab", " ab", "  c  ", "ab\nc", "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80", "a\xff\xfe"}) {
    ExpectRoundTrip(*tokenizer, text);
  }
}

TEST(HfSentencePieceTokenizerTest, ByteFallbackAndUnknowns) {
  json j = SentencePieceTokenizer();
  auto tokenizer = Load(WriteFolder(j));
  ASSERT_NE(tokenizer, nullptr);
  // "é" is not in the vocabulary: its UTF-8 bytes, as <0xC3> <0xA9>.
  EXPECT_EQ(tokenizer->Encode("\xc3\xa9"), (std::vector<Token>{259, 3 + 0xC3, 3 + 0xA9}));
  // A byte that is not UTF-8 is its own byte token too.
  EXPECT_EQ(tokenizer->Encode("a\xff"), (std::vector<Token>{263, 3 + 0xFF}));
  // Without byte_fallback, unknown characters are <unk>, a run of them one (fuse_unk).
  j["model"]["byte_fallback"] = false;
  tokenizer = Load(WriteFolder(j));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("a\xc3\xa9\xc3\xa9"
                              "b"),
            (std::vector<Token>{263, 0, 261}));
  j["model"]["fuse_unk"] = false;
  tokenizer = Load(WriteFolder(j));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("a\xc3\xa9\xc3\xa9"
                              "b"),
            (std::vector<Token>{263, 0, 0, 261}));
}

TEST(HfSentencePieceTokenizerTest, ContinuationKeepsTheLeadingSpace) {
  const auto tokenizer = Load(WriteFolder(SentencePieceTokenizer()));
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<Token> word = {265};  // "▁ab"
  EXPECT_EQ(*tokenizer->Decode(word), "ab");
  EXPECT_EQ(*tokenizer->DecodeContinuation(word), " ab");
  // Decoding a stream a token at a time gives the whole text.
  const std::vector<Token> ids = tokenizer->Encode("ab c\xc3\xa9");
  std::string streamed = *tokenizer->Decode(std::span<const Token>(ids).subspan(0, 1));
  for (size_t i = 1; i < ids.size(); ++i) {
    streamed += *tokenizer->DecodeContinuation(std::span<const Token>(ids).subspan(i, 1));
  }
  EXPECT_EQ(streamed, "ab c\xc3\xa9");
}

TEST(HfSentencePieceTokenizerTest, MetaspacePrependsOnlyAtTheStart) {
  const auto tokenizer = Load(WriteFolder(MetaspaceTokenizer()));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("ab ab"), (std::vector<Token>{265, 265}));
  // prepend_scheme "first": the piece after an added token gets no "▁".
  EXPECT_EQ(tokenizer->Encode("</s>ab"), (std::vector<Token>{2, 264}));
  EXPECT_EQ(tokenizer->Encode("ab</s>ab"), (std::vector<Token>{265, 2, 264}));
  const std::vector<Token> ids = {265, 265};
  EXPECT_EQ(*tokenizer->Decode(ids), "ab ab");
  ExpectRoundTrip(*tokenizer, "ab c a\xc3\xa9");
}

// ---- what is refused, and where ---------------------------------------------------------------

absl::Status LoadError(const json& j, std::string* path,
                       const std::vector<std::pair<std::string, json>>& files = {}) {
  const std::string dir = WriteFolder(j, files);
  *path = dir + "/tokenizer.json";
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(dir);
  return tokenizer.ok() ? absl::OkStatus() : tokenizer.status();
}

TEST(HfTokenizerErrorsTest, UnsupportedPartsNameTheFileAndTheField) {
  const json byte_level = ByteLevelTokenizer();
  const json sentencepiece = SentencePieceTokenizer();
  for (const auto& [base, pointer, value, field] :
       std::vector<std::tuple<json, std::string, json, std::string>>{
           {sentencepiece,
            "/normalizer/normalizers/0",
            {{"type", "NFC"}},
            "normalizer.normalizers[0].type 'NFC' is not supported"},
           {sentencepiece,
            "/normalizer",
            {{"type", "BertNormalizer"}},
            "normalizer.type 'BertNormalizer' is not supported"},
           {sentencepiece,
            "/decoder/decoders/1",
            {{"type", "CTC"}},
            "decoder.decoders[1].type 'CTC' is not supported"},
           {sentencepiece, "/model/continuing_subword_prefix", "##",
            "model.continuing_subword_prefix '##' is not supported"},
           {byte_level,
            "/pre_tokenizer/pretokenizers/2",
            {{"type", "Digits"}},
            "pre_tokenizer.pretokenizers[1] is ByteLevel before other pre-tokenizers"},
           {byte_level, "/pre_tokenizer/pretokenizers/0/behavior", "Sideways",
            "pre_tokenizer.pretokenizers[0].behavior 'Sideways' is not supported"},
           {byte_level,
            "/pre_tokenizer/pretokenizers/0/pattern",
            {{"Regex", "(ab"}},
            "pre_tokenizer.pretokenizers[0]: pattern \"(ab\""},
           {byte_level, "/post_processor/processors/1/type", "BertWithExtras",
            "post_processor.processors[1].type 'BertWithExtras' is not supported"},
           {byte_level, "/truncation", {{"max_length", 8}}, "truncation is {"},
           {byte_level, "/model/type", "Unigram", "model.type 'Unigram' is not supported"},
           {byte_level, "/added_tokens/2/id", 270,
            "added_tokens[2] has id 270 but `tokenizers` gives \"<|eot_id|>\" id 265"},
       }) {
    json j = base;
    j[json::json_pointer(pointer)] = value;
    std::string path;
    const absl::Status status = LoadError(j, &path);
    ASSERT_FALSE(status.ok()) << pointer;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << pointer;
    EXPECT_THAT(Message(status), HasSubstr(path + ": " + field)) << pointer;
  }
}

TEST(HfTokenizerErrorsTest, SpecialTokenFilesNameTheFileAndTheField) {
  std::string path;
  absl::Status status = LoadError(SentencePieceTokenizer(), &path,
                                  {{"tokenizer_config.json", {{"eos_token", "</x>"}}}});
  const std::string dir = path.substr(0, path.rfind('/'));
  EXPECT_THAT(Message(status),
              HasSubstr("tokenizer_config.json: eos_token is \"</x>\", which is not a "
                        "token of"));
  status = LoadError(SentencePieceTokenizer(), &path,
                     {{"generation_config.json", {{"eos_token_id", {2, 9999}}}}});
  EXPECT_THAT(Message(status),
              HasSubstr("generation_config.json: eos_token_id[1] is 9999, not an id of the 267 "
                        "tokens"));
  status = LoadError(SentencePieceTokenizer(), &path,
                     {{"tokenizer_config.json", {{"add_bos_token", "yes"}}}});
  EXPECT_THAT(Message(status), HasSubstr("tokenizer_config.json: add_bos_token is \"yes\""));
}

TEST(HfTokenizerErrorsTest, ATokenizerLargerThanTheModelSaysBothSizes) {
  const std::string dir = WriteFolder(SentencePieceTokenizer());
  const auto tokenizer = Load(dir);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_TRUE(CheckTokenizerFitsModel(*tokenizer, 267).ok());
  EXPECT_TRUE(CheckTokenizerFitsModel(*tokenizer, 320).ok());  // a padded embedding
  const absl::Status status = CheckTokenizerFitsModel(*tokenizer, 260);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status),
              HasSubstr(dir + "/tokenizer.json has 267 tokens but the model's vocabulary is 260"));
}

TEST(HfTokenizerLoadTest, AFolderWithTokenizerJsonAndGpt2FilesReadsTheTokenizerJson) {
  const std::string dir = WriteFolder(ByteLevelTokenizer());
  WriteFile(dir + "/vocab.json", ByteLevelTokenizer()["model"]["vocab"].dump());
  WriteFile(dir + "/merges.txt", "#version: 0.2\n");
  EXPECT_TRUE(HoldsTokenizerFiles(dir));
  const auto tokenizer = Load(dir);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->Describe(), HasSubstr(dir + "/tokenizer.json"));
  EXPECT_EQ(tokenizer->Encode("abc"), (std::vector<Token>{257}));
}

}  // namespace
}  // namespace shardline::data
