// BpeTokenizer with GPT-2's files on tiny hand-written vocabularies: the byte alphabet, merge
// order, where the pre-tokenizer cuts, the special token, bytes that are not UTF-8, and every
// malformed-file error (each naming the file and the line). LoadTokenizer's choice of files. The
// real GPT-2 files are data_gpt2_tokenizer_reference_test's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/data/bpe_tokenizer.h"
#include "worker/model/data/byte_tokenizer.h"
#include "worker/model/data/tokenizer.h"
#include "worker/model/data/tokenizer_json.h"

namespace shardline::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "/gpt2_tok_XXXXXX";
  const char* dir = ::mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

// The byte-level spelling of `text`, as a vocabulary or merges file has it ("a b" → "aĠb").
std::string Spell(std::string_view text) {
  std::string out;
  for (char c : text) out.append(Gpt2ByteChar(static_cast<unsigned char>(c)));
  return out;
}

// A vocabulary whose id b is byte b, then `extra` (spelled with Spell) from id 256 on.
json Vocab(const std::vector<std::string>& extra) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[std::string(Gpt2ByteChar(static_cast<unsigned char>(b)))] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[Spell(extra[i])] = 256 + static_cast<int>(i);
  return vocab;
}

// Writes vocab.json and merges.txt ("#version" line, then `merges` spelled) into a fresh folder.
std::string WriteTokenizer(const std::vector<std::string>& extra,
                           const std::vector<std::pair<std::string, std::string>>& merges) {
  const std::string dir = TempDir();
  WriteFile(dir + "/vocab.json", Vocab(extra).dump(2));
  std::string text = "#version: 0.2\n";
  for (const auto& [a, b] : merges) text += Spell(a) + " " + Spell(b) + "\n";
  WriteFile(dir + "/merges.txt", text);
  return dir;
}

std::unique_ptr<BpeTokenizer> Load(const std::string& dir) {
  auto tokenizer = BpeTokenizer::FromGpt2Files(dir + "/vocab.json", dir + "/merges.txt");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

std::vector<Token> Bytes(std::string_view text) {
  std::vector<Token> ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// The error FromGpt2Files gives for these file contents.
absl::Status LoadError(const std::string& vocab, const std::string& merges, std::string* dir) {
  *dir = TempDir();
  WriteFile(*dir + "/vocab.json", vocab);
  WriteFile(*dir + "/merges.txt", merges);
  auto tokenizer = BpeTokenizer::FromGpt2Files(*dir + "/vocab.json", *dir + "/merges.txt");
  return tokenizer.ok() ? absl::OkStatus() : tokenizer.status();
}

TEST(Gpt2ByteAlphabetTest, IsGpt2sBytesToUnicode) {
  EXPECT_EQ(Gpt2ByteChar('a'), "a");
  EXPECT_EQ(Gpt2ByteChar('!'), "!");
  EXPECT_EQ(Gpt2ByteChar('~'), "~");
  EXPECT_EQ(Gpt2ByteChar(0xA1), "\u00a1");
  EXPECT_EQ(Gpt2ByteChar(0xFF), "\u00ff");
  // The 68 others in byte order from U+0100: 0x00-0x20, 0x7F-0xA0, 0xAD.
  EXPECT_EQ(Gpt2ByteChar(0x00), "\u0100");
  EXPECT_EQ(Gpt2ByteChar('\n'), "\u010a");  // "Ċ"
  EXPECT_EQ(Gpt2ByteChar(' '), "\u0120");   // "Ġ"
  EXPECT_EQ(Gpt2ByteChar(0x7F), "\u0121");
  EXPECT_EQ(Gpt2ByteChar(0x80), "\u0122");
  EXPECT_EQ(Gpt2ByteChar(0xA0), "\u0142");
  EXPECT_EQ(Gpt2ByteChar(0xAD), "\u0143");  // "Ń"
  std::set<std::string> distinct;
  for (int b = 0; b < 256; ++b) distinct.emplace(Gpt2ByteChar(static_cast<unsigned char>(b)));
  EXPECT_EQ(distinct.size(), 256u);
}

TEST(Gpt2TokenizerTest, WithoutMergesEveryByteIsItsToken) {
  const auto tokenizer = Load(WriteTokenizer({}, {}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 256);
  EXPECT_EQ(tokenizer->eot(), std::nullopt);
  EXPECT_EQ(tokenizer->Encode("hi \xc3\xa9\n"), Bytes("hi \xc3\xa9\n"));
}

TEST(Gpt2TokenizerTest, LowestRankMergesFirst) {
  // "b c" outranks "a b", so "abc" is a + bc, then abc through "a bc".
  auto tokenizer = Load(WriteTokenizer({"bc", "ab", "abc"}, {{"b", "c"}, {"a", "b"}, {"a", "bc"}}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("abc"), (std::vector<Token>{258}));
  EXPECT_EQ(tokenizer->Encode("ab"), (std::vector<Token>{257}));
  // Without "a bc", "abc" stops at a + bc although "ab" + "c" would also be tokens.
  tokenizer = Load(WriteTokenizer({"bc", "ab"}, {{"b", "c"}, {"a", "b"}}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("abc"), (std::vector<Token>{'a', 256}));
  // The other order of the same merges.
  tokenizer = Load(WriteTokenizer({"bc", "ab"}, {{"a", "b"}, {"b", "c"}}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("abc"), (std::vector<Token>{257, 'c'}));
}

TEST(Gpt2TokenizerTest, AMergeAppliesToEveryOccurrenceLeftToRight) {
  const auto tokenizer = Load(WriteTokenizer({"aa", "aaaa"}, {{"a", "a"}, {"aa", "aa"}}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("aaa"), (std::vector<Token>{256, 'a'}));
  EXPECT_EQ(tokenizer->Encode("aaaa"), (std::vector<Token>{257}));
  EXPECT_EQ(tokenizer->Encode("aaaaa"), (std::vector<Token>{257, 'a'}));
}

TEST(Gpt2TokenizerTest, APairListedTwiceKeepsItsLaterRank) {
  // "a b" first at rank 0 and again at rank 2, after "b c": as in tokenizers and encoder.py,
  // rank 2 counts, so "b c" wins.
  const auto tokenizer = Load(WriteTokenizer({"ab", "bc"}, {{"a", "b"}, {"b", "c"}, {"a", "b"}}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("abc"), (std::vector<Token>{'a', 257}));
}

TEST(Gpt2TokenizerTest, MergesNeverCrossPreTokens) {
  // "t '" would join "it" and "'s", "o " the words of "two words": the regex cuts between them.
  const auto tokenizer =
      Load(WriteTokenizer({"t'", "'s", " w", "o ", "  "},
                          {{"t", "'"}, {"'", "s"}, {" ", "w"}, {"o", " "}, {" ", " "}}));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("it's"), (std::vector<Token>{'i', 't', 257}));
  EXPECT_EQ(tokenizer->Encode("two words"),
            (std::vector<Token>{'t', 'w', 'o', 258, 'o', 'r', 'd', 's'}));
  // A run of spaces leaves its last one to the word after it, and is whole at the end.
  EXPECT_EQ(tokenizer->Encode("a   w"), (std::vector<Token>{'a', 260, 258}));
  EXPECT_EQ(tokenizer->Encode("a    "), (std::vector<Token>{'a', 260, 260}));
}

TEST(Gpt2TokenizerTest, EndOfTextIsTheSpecialTokenOrText) {
  const std::string dir = WriteTokenizer({"<|endoftext|>"}, {});
  const auto tokenizer = Load(dir);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->eot(), 256);
  EXPECT_EQ(tokenizer->vocab_size(), 257);
  std::vector<Token> expected = Bytes("a");
  expected.push_back(256);
  expected.push_back('b');
  EXPECT_EQ(tokenizer->Encode("a<|endoftext|>b"), expected);
  EXPECT_EQ(tokenizer->Encode("<|endoftext|><|endoftext|>"), (std::vector<Token>{256, 256}));
  EXPECT_EQ(tokenizer->Encode("a<|endoftext|>b", BpeTokenizer::Specials::kAsText),
            Bytes("a<|endoftext|>b"));
  EXPECT_EQ(tokenizer->Encode("<|endoftext|"), Bytes("<|endoftext|"));
  const std::vector<Token> eot = {256};
  EXPECT_EQ(*tokenizer->Decode(eot), "<|endoftext|>");
}

TEST(Gpt2TokenizerTest, BytesThatAreNotUtf8AreTheirOwnTokens) {
  const auto tokenizer = Load(WriteTokenizer({" d", "ab"}, {{" ", "d"}, {"a", "b"}}));
  ASSERT_NE(tokenizer, nullptr);
  // The valid runs around a bad byte encode as if alone; the byte is its byte token.
  std::vector<Token> expected = tokenizer->Encode("ab");
  expected.push_back(0xFF);
  for (Token t : tokenizer->Encode(" d")) expected.push_back(t);
  EXPECT_EQ(tokenizer->Encode("ab\xff d"), expected);
  // A truncated sequence, an overlong form, a surrogate: every byte stays.
  for (const std::string bad : {"\xe2\x82", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"}) {
    EXPECT_EQ(tokenizer->Encode(bad), Bytes(bad));
  }
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(rng() % 200, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 4 == 0 ? 'a' + rng() % 4 : rng());
    absl::StatusOr<std::string> decoded = tokenizer->Decode(tokenizer->Encode(text));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ASSERT_EQ(*decoded, text);
  }
}

TEST(Gpt2TokenizerTest, DecodeNamesThePositionOfATokenOutsideTheVocabulary) {
  // Ids 256 and 258 are used, 257 is not.
  const std::string dir = TempDir();
  json vocab = Vocab({"ab"});
  vocab["xy"] = 258;
  WriteFile(dir + "/vocab.json", vocab.dump());
  WriteFile(dir + "/merges.txt", "a b\n");
  const auto tokenizer = Load(dir);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 259);
  for (const auto& [token, position] :
       std::vector<std::pair<Token, std::string>>{{259, "2"}, {-1, "2"}, {257, "2"}}) {
    const std::vector<Token> tokens = {'a', 256, token};
    absl::StatusOr<std::string> decoded = tokenizer->Decode(tokens);
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(decoded.status()),
                HasSubstr("token " + std::to_string(token) + " at position " + position));
  }
}

TEST(Gpt2TokenizerTest, ConcurrentEncodesAgree) {
  const auto tokenizer = Load(WriteTokenizer({"ab", " ab"}, {{"a", "b"}, {" ", "ab"}}));
  ASSERT_NE(tokenizer, nullptr);
  std::string text;
  for (int i = 0; i < 2000; ++i) text += (i % 7 == 0 ? " ab" : " abba") + std::to_string(i % 13);
  const std::vector<Token> expected = tokenizer->Encode(text);
  std::vector<std::thread> threads;
  std::vector<bool> same(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { same[t] = tokenizer->Encode(text) == expected; });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(same[t]) << "thread " << t;
}

// ---- malformed files: every error names the file, and the line where there is one ----------

TEST(Gpt2TokenizerErrorsTest, MissingFilesAreNotFoundNamingThePath) {
  const std::string dir = WriteTokenizer({}, {});
  auto tokenizer = BpeTokenizer::FromGpt2Files(dir + "/nope.json", dir + "/merges.txt");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(tokenizer.status()), HasSubstr(dir + "/nope.json"));
  tokenizer = BpeTokenizer::FromGpt2Files(dir + "/vocab.json", dir + "/nope.txt");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(tokenizer.status()), HasSubstr(dir + "/nope.txt"));
  auto json_file = LoadTokenizerJson(dir + "/tokenizer.json");
  ASSERT_FALSE(json_file.ok());
  EXPECT_EQ(json_file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(json_file.status()), HasSubstr(dir + "/tokenizer.json"));
}

TEST(Gpt2TokenizerErrorsTest, MalformedJsonNamesFileAndLine) {
  // Line 3 lacks its comma: nlohmann finds out at the key on line 4.
  std::string dir;
  absl::Status status = LoadError("{\n  \"a\": 0,\n  \"b\": 1\n  \"c\": 2\n}\n", "", &dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status),
              AllOf(HasSubstr(dir + "/vocab.json line 4 "), HasSubstr("malformed JSON")));
  status = LoadError("{\"a\": 1,\n\"b\": 2,\n\n", "", &dir);  // unexpected end on line 4
  EXPECT_THAT(Message(status), HasSubstr(dir + "/vocab.json line 4 "));
  status = LoadError("", "", &dir);
  EXPECT_THAT(Message(status),
              AllOf(HasSubstr(dir + "/vocab.json line 1"), HasSubstr("malformed JSON")));
}

TEST(Gpt2TokenizerErrorsTest, VocabularyErrorsNameTheFileAndToken) {
  std::string dir;
  absl::Status status = LoadError("[1, 2]", "", &dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(dir + "/vocab.json"), HasSubstr("JSON object")));

  json vocab = Vocab({});
  vocab["xyz"] = "7";
  status = LoadError(vocab.dump(), "", &dir);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(dir + "/vocab.json"), HasSubstr("\"xyz\"")));
  vocab["xyz"] = -3;
  status = LoadError(vocab.dump(), "", &dir);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(dir + "/vocab.json"), HasSubstr("-3")));
  // An id sizes the loader's tables: a huge one is refused, not allocated.
  vocab["xyz"] = 2147483646;
  status = LoadError(vocab.dump(), "", &dir);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(dir + "/vocab.json"), HasSubstr("2147483646"),
                                     HasSubstr("[0, 2097151]")));

  vocab = Vocab({});
  vocab["xyz"] = 5;  // also byte 5's id
  status = LoadError(vocab.dump(), "", &dir);
  EXPECT_THAT(Message(status),
              AllOf(HasSubstr(dir + "/vocab.json"), HasSubstr("\"xyz\""), HasSubstr("id 5")));

  vocab = Vocab({});
  vocab.erase(std::string(Gpt2ByteChar(' ')));
  status = LoadError(vocab.dump(), "", &dir);
  EXPECT_THAT(Message(status),
              AllOf(HasSubstr(dir + "/vocab.json"), HasSubstr("byte 0x20"), HasSubstr("\u0120")));

  vocab = Vocab({});
  vocab["\u20ac"] = 300;  // "€" is no byte's stand-in
  status = LoadError(vocab.dump(), "", &dir);
  EXPECT_THAT(Message(status),
              AllOf(HasSubstr(dir + "/vocab.json"), HasSubstr("U+20AC"), HasSubstr("id 300")));
}

TEST(Gpt2TokenizerErrorsTest, MalformedMergesLineNamesFileAndLine) {
  const std::string vocab = Vocab({"ab"}).dump();
  std::string dir;
  for (const std::string bad : {"ab", "a b c", " a", "a ", "a  b"}) {
    // Line 3, after the #version line and a good merge.
    absl::Status status = LoadError(vocab, "#version: 0.2\na b\n" + bad + "\n", &dir);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(Message(status), HasSubstr(dir + "/merges.txt line 3:")) << bad;
  }
  // CRLF lines and blank lines are fine; line numbers count them.
  EXPECT_TRUE(LoadError(vocab, "#version: 0.2\r\na b\r\n\r\n", &dir).ok());
  absl::Status status = LoadError(vocab, "#version: 0.2\r\n\r\na b\r\nab\r\n", &dir);
  EXPECT_THAT(Message(status), HasSubstr(dir + "/merges.txt line 4:"));
}

TEST(Gpt2TokenizerErrorsTest, MergeOutsideTheVocabularyNamesFileAndLine) {
  const std::string vocab = Vocab({"ab"}).dump();
  std::string dir;
  // A part that is no token ("ab c" is fine as a pair of tokens, "abc" is not one).
  absl::Status status = LoadError(vocab, "a b\nq" + Spell(" ") + "x b\n", &dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(dir + "/merges.txt line 2:"),
                                     HasSubstr("\"q\u0120x\""), HasSubstr("vocab.json")));
  status = LoadError(vocab, "a b\n\nab c\n", &dir);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(dir + "/merges.txt line 3:"),
                                     HasSubstr("\"abc\" (the merged token)")));
}

// ---- tokenizer.json ------------------------------------------------------------------------

json TokenizerJson() {
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 258},
                                     {"content", "<|endoftext|>"},
                                     {"special", true},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"single_word", false},
                                     {"normalized", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", true}}},
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
        {"ignore_merges", false},
        {"vocab", Vocab({"ab", "abc"})},
        {"merges", json::array({"a b", json::array({"ab", "c"})})}}},
  };
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> LoadJson(const std::string& text, std::string* path) {
  *path = TempDir() + "/tokenizer.json";
  WriteFile(*path, text);
  return LoadTokenizerJson(*path);
}

TEST(Gpt2TokenizerJsonTest, ReadsVocabMergesOfBothFormsAndAddedTokens) {
  std::string path;
  auto tokenizer = LoadJson(TokenizerJson().dump(2), &path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 259);  // the added token is not in model.vocab
  EXPECT_EQ((*tokenizer)->eot(), 258);
  EXPECT_EQ((*tokenizer)->Encode("abc<|endoftext|>ab"), (std::vector<Token>{257, 258, 256}));
  const std::vector<Token> ids = {257, 258};
  EXPECT_EQ(*(*tokenizer)->Decode(ids), "abc<|endoftext|>");
}

TEST(Gpt2TokenizerJsonTest, ErrorsNameTheFileAndWhere) {
  std::string path;
  std::string text = TokenizerJson().dump(2);
  text.insert(text.find("\"model\""), "}");  // not on line 1
  auto tokenizer = LoadJson(text, &path);
  ASSERT_FALSE(tokenizer.ok());
  const size_t line = 1 + std::count(text.begin(), text.begin() + text.find("}\"model\""), '\n');
  EXPECT_THAT(Message(tokenizer.status()),
              AllOf(HasSubstr(path + " line " + std::to_string(line)), HasSubstr("malformed")));

  json j = TokenizerJson();
  j["model"]["merges"][1] = json::array({"ab", "x"});
  tokenizer = LoadJson(j.dump(), &path);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(Message(tokenizer.status()),
              AllOf(HasSubstr(path + ": model.merges[1]"), HasSubstr("\"abx\"")));
  j = TokenizerJson();
  j["model"]["merges"][0] = "a";
  tokenizer = LoadJson(j.dump(), &path);
  EXPECT_THAT(Message(tokenizer.status()), HasSubstr(path + ": model.merges[0]"));

  // Tokenizers of another kind are refused rather than computed wrong, naming the field.
  for (const auto& [pointer, value, field] :
       std::vector<std::tuple<std::string, json, std::string>>{
           {"/model/type", "WordPiece", "model.type 'WordPiece' is not supported"},
           {"/model/dropout", 0.1, "model.dropout is 0.1"},
           {"/normalizer", {{"type", "NFC"}}, "normalizer.type 'NFC' is not supported"},
           {"/decoder", {{"type", "WordPiece"}}, "decoder.type 'WordPiece' is not supported"},
           {"/pre_tokenizer",
            {{"type", "Whitespace"}},
            "pre_tokenizer.type 'Whitespace' is not supported"}}) {
    j = TokenizerJson();
    j[json::json_pointer(pointer)] = value;
    tokenizer = LoadJson(j.dump(), &path);
    ASSERT_FALSE(tokenizer.ok()) << pointer;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(tokenizer.status()), HasSubstr(path + ": " + field)) << pointer;
  }
}

// ---- LoadTokenizer -------------------------------------------------------------------------

TEST(LoadTokenizerTest, BytesIsTheByteTokenizer) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer("bytes");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 257);
  EXPECT_EQ((*tokenizer)->eot(), ByteTokenizer::kEotToken);
  EXPECT_EQ((*tokenizer)->Describe(), "the byte tokenizer");
  EXPECT_EQ((*tokenizer)->Encode("hi"), Bytes("hi"));
}

TEST(LoadTokenizerTest, FindsTheFilesOfAFolderOrTheirPartner) {
  const std::string dir = WriteTokenizer({"ab"}, {{"a", "b"}});
  EXPECT_TRUE(HoldsTokenizerFiles(dir));
  for (const std::string& spec : {dir, dir + "/vocab.json", dir + "/merges.txt"}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(spec);
    ASSERT_TRUE(tokenizer.ok()) << spec << ": " << tokenizer.status();
    EXPECT_EQ((*tokenizer)->Encode("ab"), (std::vector<Token>{256})) << spec;
    EXPECT_THAT((*tokenizer)->Describe(), HasSubstr(dir + "/vocab.json"));
  }
  // GPT-2's own names.
  const std::string gpt2 = TempDir();
  ASSERT_EQ(std::rename((dir + "/vocab.json").c_str(), (gpt2 + "/encoder.json").c_str()), 0);
  ASSERT_EQ(std::rename((dir + "/merges.txt").c_str(), (gpt2 + "/vocab.bpe").c_str()), 0);
  EXPECT_FALSE(HoldsTokenizerFiles(dir));
  EXPECT_TRUE(HoldsTokenizerFiles(gpt2));
  for (const std::string& spec : {gpt2, gpt2 + "/encoder.json", gpt2 + "/vocab.bpe"}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(spec);
    ASSERT_TRUE(tokenizer.ok()) << spec << ": " << tokenizer.status();
    EXPECT_EQ((*tokenizer)->Encode("ab"), (std::vector<Token>{256})) << spec;
  }
  // A tokenizer.json, by folder or by file.
  const std::string hf = TempDir();
  WriteFile(hf + "/tokenizer.json", TokenizerJson().dump());
  EXPECT_TRUE(HoldsTokenizerFiles(hf));
  for (const std::string& spec : {hf, hf + "/tokenizer.json"}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(spec);
    ASSERT_TRUE(tokenizer.ok()) << spec << ": " << tokenizer.status();
    EXPECT_EQ((*tokenizer)->eot(), 258) << spec;
  }
}

TEST(LoadTokenizerTest, WhatIsNoTokenizerIsAnErrorNamingIt) {
  const std::string empty = TempDir();
  EXPECT_FALSE(HoldsTokenizerFiles(empty));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(empty);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(tokenizer.status()), AllOf(HasSubstr(empty), HasSubstr("vocab.json")));

  tokenizer = LoadTokenizer(empty + "/nothing");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(tokenizer.status()), HasSubstr(empty + "/nothing"));

  // A vocabulary without its merges file names the missing one.
  WriteFile(empty + "/vocab.json", Vocab({}).dump());
  tokenizer = LoadTokenizer(empty + "/vocab.json");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(Message(tokenizer.status()), HasSubstr(empty + "/merges.txt"));

  WriteFile(empty + "/notes.txt", "hello");
  tokenizer = LoadTokenizer(empty + "/notes.txt");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(tokenizer.status()), HasSubstr(empty + "/notes.txt"));
}

}  // namespace
}  // namespace shardline::data
