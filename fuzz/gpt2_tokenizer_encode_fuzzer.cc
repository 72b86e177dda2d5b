// The GPT-2 BPE tokenizer's encoder and decoder (worker/model/data/bpe_tokenizer.h) on arbitrary
// text, with one small real vocabulary loaded once: every byte string encodes to ids inside the
// vocabulary that decode back to it (with special tokens parsed and as text), and any sequence of
// ids (the input read as int32s, as a client may send) decodes or is refused with
// InvalidArgument, never read out of the vocabulary.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "worker/model/data/bpe_tokenizer.h"

namespace {

using shardline::data::BpeTokenizer;
using shardline::data::Gpt2ByteChar;
using shardline::data::Token;

// The byte-level spelling of `text`, as vocabulary and merges files have it (" the" is "Ġthe").
std::string Spell(std::string_view text) {
  std::string spelled;
  for (const char c : text) spelled += Gpt2ByteChar(static_cast<unsigned char>(c));
  return spelled;
}

// The 256 byte tokens, English merges enough to build multi-level words (" the", "ing", " and"),
// some that reach across GPT-2's pre-token classes (digits, punctuation, spaces), and
// <|endoftext|>, so that special-token matching runs too.
std::unique_ptr<BpeTokenizer> LoadTokenizer() {
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"\xC3", "\xA9"}, {"\xE2", "\x82"}, {"\xE2\x82", "\xAC"},  // "é", "€"
      {" ", "t"},  {"h", "e"},  {" t", "he"}, {"i", "n"},  {"in", "g"}, {" ", "a"},   {"n", "d"},
      {" a", "nd"}, {"e", "r"},  {"o", "n"},  {" ", "o"},  {" o", "f"}, {"r", "e"},   {" ", " "},
      {"  ", "  "}, {"1", "2"},  {"12", "3"}, {".", "."},  {"..", "."}, {"'", "s"},   {"\n", "\n"},
      {"é", "t"},   {" ", "é"},  {"t", "h"},  {"th", "e"}, {"e", "d"},  {" w", "as"}, {" ", "w"},
      {"a", "s"},   {"€", "€"}};
  std::string vocab = "{";
  auto add = [&, next = 0](const std::string& spelled) mutable {
    if (next > 0) vocab += ",";
    // Byte spellings need no JSON escapes except '"' and '\\'.
    std::string escaped;
    for (const char c : spelled) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    vocab += "\"" + escaped + "\":" + std::to_string(next++);
  };
  for (int b = 0; b < 256; ++b) add(std::string(Gpt2ByteChar(static_cast<unsigned char>(b))));
  std::string merges_text = "#version: 0.2\n";
  for (const auto& [a, b] : merges) {
    add(Spell(a + b));
    merges_text += Spell(a) + " " + Spell(b) + "\n";
  }
  add(std::string(BpeTokenizer::kEndOfText));
  vocab += "}";
  const shardline::fuzz::MemoryFile vocab_file(vocab);
  const shardline::fuzz::MemoryFile merges_file(merges_text);
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tokenizer =
      BpeTokenizer::FromGpt2Files(vocab_file.path(), merges_file.path());
  FUZZ_CHECK(tokenizer.ok(), "the harness's own vocabulary: " + tokenizer.status().ToString());
  return *std::move(tokenizer);
}

const BpeTokenizer& Tokenizer() {
  static const std::unique_ptr<BpeTokenizer> tokenizer = LoadTokenizer();
  return *tokenizer;
}

void CheckRoundTrip(std::string_view text, BpeTokenizer::Specials specials) {
  const BpeTokenizer& tokenizer = Tokenizer();
  const std::vector<Token> ids = tokenizer.Encode(text, specials);
  for (const Token id : ids) {
    FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size(),
               "id " + std::to_string(id) + " outside the vocabulary");
    if (specials == BpeTokenizer::Specials::kAsText) {
      FUZZ_CHECK(id != *tokenizer.eot(), "an end-of-text token with specials read as text");
    }
  }
  absl::StatusOr<std::string> decoded = tokenizer.Decode(ids);
  FUZZ_CHECK(decoded.ok(), "Decode(Encode(text)) failed: " + decoded.status().ToString());
  FUZZ_CHECK(*decoded == text, "Decode(Encode(text)) differs from the text");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)Tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  CheckRoundTrip(text, BpeTokenizer::Specials::kParse);
  CheckRoundTrip(text, BpeTokenizer::Specials::kAsText);

  std::vector<Token> ids(size / sizeof(Token));
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * sizeof(Token));
  absl::StatusOr<std::string> decoded = Tokenizer().Decode(ids);
  FUZZ_CHECK(decoded.ok() || absl::IsInvalidArgument(decoded.status()),
             "not InvalidArgument: " + decoded.status().ToString());
  return 0;
}
