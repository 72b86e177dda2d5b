// GPT-2's byte-level BPE tokenizer: the ids Hugging Face's `tokenizers` (GPT2TokenizerFast) gives,
// from the same vocabulary and merges files. Text is split on the special tokens, then into
// pre-tokens by GPT-2's regex (through PCRE2); each pre-token's bytes become GPT-2's printable
// stand-in characters (Gpt2ByteChar) and are merged pair by pair, lowest merge rank first.
//
// Limits, as measured against tokenizers 0.23 (tests/unit/data_gpt2_tokenizer_reference_test.cc):
// the regex's \p{L} and \p{N} are PCRE2's Unicode tables (Debian 12's PCRE2 10.42: Unicode 14.0),
// so letters and digits assigned after Unicode 14 (CJK extension H, Kawi, ...) are split as
// punctuation where `tokenizers` (Unicode 16) keeps them in a word. Merging is the classic
// quadratic loop per pre-token: a pre-token of n characters (one word, one run of spaces) costs
// O(n²) (a 30,000-letter word takes 0.5 s on this project's machines; ordinary text encodes at
// about 25 MB/s); results are cached per pre-token.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/model/data/tokenizer.h"

namespace shardline::data {

// GPT-2's bytes_to_unicode: the character (as UTF-8) that stands for `byte` in the vocabulary and
// merges files. Printable Latin-1 bytes stand for themselves; the other 68 (control bytes, space,
// 0x7F-0xA0, 0xAD) are U+0100 onwards in byte order, so ' ' is "Ġ" and '\n' is "Ċ".
std::string_view Gpt2ByteChar(unsigned char byte);

class Gpt2Tokenizer final : public Tokenizer {
 public:
  static constexpr std::string_view kEndOfText = "<|endoftext|>";

  // Whether the text of a special token in Encode's input is that token or plain text.
  enum class Specials {
    kParse,   // Hugging Face's behaviour (its tokenizer.json's added tokens are always matched)
    kAsText,  // tiktoken's encode_ordinary: "<|endoftext|>" is 7 ordinary tokens in GPT-2
  };

  // vocab.json (a JSON object: token → id) and merges.txt (one "a b" merge a line, best first,
  // after an optional "#version" line); GPT-2's own encoder.json and vocab.bpe are the same
  // formats. "<|endoftext|>", when the vocabulary has it, is the special token and eot().
  // Errors name the file: NotFound for a missing one; InvalidArgument naming the line for
  // malformed JSON, a merges line that is not two tokens, or a merge whose parts or result are not
  // in the vocabulary; and for a vocabulary that lacks one of the 256 byte tokens, has an id twice
  // or past 2^21 - 1, or has a token that is not made of Gpt2ByteChar characters.
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> FromFiles(const std::string& vocab_path,
                                                                  const std::string& merges_path);

  // A Hugging Face tokenizer.json: model.vocab, model.merges ("a b" strings or ["a", "b"] pairs)
  // and added_tokens, which all become special tokens. Errors as FromFiles (a merge is named by
  // its index in model.merges); InvalidArgument, too, for a tokenizer that is not GPT-2's kind
  // (a model other than BPE, a normalizer, a pre-tokenizer other than ByteLevel without a prefix
  // space, BPE dropout or ignore_merges, an added token with lstrip/rstrip/single_word).
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> FromTokenizerJson(const std::string& path);

  std::vector<Token> Encode(std::string_view text) const override {
    return Encode(text, Specials::kParse);
  }
  // Never fails. Valid UTF-8 gets exactly `tokenizers`' ids (see the limits above). Bytes that
  // are not part of valid UTF-8 each become their own byte token, so that Decode gives back any
  // byte string; the valid runs between them are encoded as if each were the whole text.
  std::vector<Token> Encode(std::string_view text, Specials specials) const;

  // The bytes back (a special token gives its text). InvalidArgument naming the position of a
  // token outside the vocabulary.
  absl::StatusOr<std::string> Decode(std::span<const Token> tokens) const override;

  // One more than the largest id (50257 for GPT-2).
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  std::optional<Token> eot() const override { return eot_; }
  std::string Describe() const override { return "the GPT-2 BPE tokenizer of " + source_; }

  ~Gpt2Tokenizer() override;

 private:
  struct Merge {
    int32_t rank;
    Token result;
  };
  struct Special {
    std::string text;
    Token id;
  };
  // One merge as a file gives it; `where` names its line (or index) for errors.
  struct MergeEntry {
    std::string a, b, where;
  };
  struct Regex;  // the compiled pre-tokenizer (PCRE2 types stay in the .cc)

  Gpt2Tokenizer() = default;
  // Everything from the parsed files; `merges` in rank order, best first.
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Build(
      std::string source, const std::string& vocab_where,
      std::vector<std::pair<std::string, Token>> vocab, std::vector<MergeEntry> merges,
      std::vector<Special> specials);

  void EncodeOrdinary(std::string_view text, std::vector<Token>& out) const;
  void EncodeValidUtf8(std::string_view text, std::vector<Token>& out) const;
  void EncodePreToken(std::string_view piece, std::vector<Token>& out) const;
  std::vector<Token> Bpe(std::string_view piece) const;

  std::string source_;
  // Indexed by id: the bytes each token stands for; nullopt for an id the files leave unused.
  std::vector<std::optional<std::string>> token_bytes_;
  std::array<Token, 256> byte_tokens_{};
  absl::flat_hash_map<uint64_t, Merge> merges_;  // key: (left id << 32) | right id
  std::vector<Special> specials_;
  std::optional<Token> eot_;
  std::unique_ptr<Regex> regex_;

  mutable std::mutex cache_mutex_;
  mutable absl::flat_hash_map<std::string, std::vector<Token>> cache_;  // pre-token → ids
};

}  // namespace shardline::data
