// Byte-pair encoding as Hugging Face's `tokenizers` computes it: the ids `tokenizers` gives, from
// GPT-2's vocabulary and merges files or from a tokenizer.json (tokenizer_json.h reads those into
// a BpePipeline). One mechanism for both kinds in use:
//   - byte-level BPE (GPT-2, Llama 3): the pre-tokenizer ends in ByteLevel, so every byte of a
//     pre-token is a token of its own (spelled in the vocabulary as Gpt2ByteChar) before merging;
//   - SentencePiece-style BPE (Llama 2, TinyLlama): characters are tokens, spaces become "▁"
//     (normalizer Prepend + Replace, or the Metaspace pre-tokenizer), and a character the
//     vocabulary lacks becomes its UTF-8 bytes as "<0xXX>" tokens (byte_fallback) or unk_token.
// Encoding follows `tokenizers`' pipeline: added tokens are cut out first (those with
// normalized=false on the raw text, then the others on the normalized text); each other piece is
// normalized, pre-tokenized, and each pre-token merged pair by pair, lowest merge rank first (a
// priority queue, as `tokenizers`' Word::merge_all: O(n log n) in the pre-token's length).
//
// Limits, as measured against tokenizers 0.23 (data_gpt2_tokenizer_reference_test.cc,
// data_hf_tokenizer_reference_test.cc):
//   - patterns are Oniguruma's (what `tokenizers` runs) run by PCRE2, with \s \S \w \W \d \h \H
//     rewritten to the Unicode sets Oniguruma gives them; \p{L}, \p{N}, ... are PCRE2's tables
//     (Debian 12's PCRE2 10.42: Unicode 14.0), so characters assigned after Unicode 14 (CJK
//     extension H, Kawi, ...) may be split where `tokenizers` (Unicode 16) keeps them together;
//   - text that is not valid UTF-8 (which `tokenizers` cannot take at all): pattern-based splits
//     run on each valid run between the ill-formed bytes, and each such byte is a pre-token of its
//     own: its byte token (byte-level), its "<0xXX>" token (byte_fallback) or unk_token;
//   - Decode gives bytes: where `tokenizers`' decoders would turn ill-formed UTF-8 into U+FFFD
//     (ByteLevel's from_utf8_lossy, ByteFallback), the bytes themselves are kept, so that
//     decode(encode(x)) == x for any bytes a byte-level or byte_fallback tokenizer can spell. It
//     does not hold where the pipeline loses text by design, in `tokenizers` as here: a
//     Metaspace pre-tokenizer that prepends "▁" (" x" and "x" encode alike), a Prepend normalizer
//     (it prepends to each piece between added tokens: "</s> x" comes back as "</s>  x"), a
//     Replace normalizer, an added token's lstrip or rstrip, characters that become unk_token;
//   - an added token's single_word test is Rust's regex crate's \w, as in `tokenizers`
//     (Alphabetic, marks, decimal digits, connector punctuation, Join_Control), with PCRE2's
//     Unicode 14 tables.
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

// GPT-2's bytes_to_unicode: the character (as UTF-8) that stands for `byte` in a byte-level
// vocabulary and merges. Printable Latin-1 bytes stand for themselves; the other 68 (control bytes,
// space, 0x7F-0xA0, 0xAD) are U+0100 onwards in byte order, so ' ' is "Ġ" and '\n' is "Ċ".
std::string_view Gpt2ByteChar(unsigned char byte);

// How Metaspace puts its replacement before a piece (`tokenizers`' PrependScheme).
enum class PrependScheme { kAlways, kFirst, kNever };

// How Split keeps what its pattern matched (`tokenizers`' SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A tokenizer as data: the parts of a Hugging Face tokenizer.json that BpeTokenizer computes. Each
// part keeps `where` it came from ("tokenizer.json: pre_tokenizer.pretokenizers[0]") for errors
// found when it is built (a pattern PCRE2 refuses).
struct BpePipeline {
  struct Normalizer {
    enum class Kind { kPrepend, kReplace } kind = Kind::kPrepend;
    std::string text;     // kPrepend: what goes first; kReplace: the pattern
    bool regex = false;   // kReplace: `text` is an Oniguruma pattern rather than a literal
    std::string content;  // kReplace: what replaces each match
    std::string where;
  };
  struct PreTokenizer {
    enum class Kind { kSplit, kMetaspace, kByteLevel } kind = Kind::kSplit;
    // kSplit
    std::string pattern;
    bool regex = false;
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    // kMetaspace
    std::string replacement = "\u2581";
    PrependScheme prepend_scheme = PrependScheme::kAlways;
    bool split = true;
    // kByteLevel (only as the last pre-tokenizer: later ones would see the byte characters)
    bool add_prefix_space = false;
    bool use_regex = true;  // split with GPT-2's pattern first
    std::string where;
  };
  struct Decoder {
    enum class Kind {
      kByteLevel,
      kMetaspace,
      kReplace,
      kByteFallback,
      kFuse,
      kStrip
    } kind = Kind::kByteLevel;
    std::string replacement = "\u2581";                     // kMetaspace
    PrependScheme prepend_scheme = PrependScheme::kAlways;  // kMetaspace
    std::string pattern, content;  // kReplace (a literal pattern); kStrip: content, one character
    int start = 0, stop = 0;       // kStrip: at most this many `content` cut from each end
  };
  struct AddedToken {
    std::string content;
    Token id = 0;
    bool special = false;     // Specials::kAsText reads it as text
    bool normalized = false;  // matched in the normalized text rather than the raw text
    bool lstrip = false, rstrip = false, single_word = false;
  };
  struct Merge {
    std::string a, b, where;
  };

  std::string kind = "BPE";  // for Describe: "the <kind> tokenizer of <source>"
  std::string source;        // the file, for messages
  std::string vocab_where;   // "DIR/tokenizer.json: model.vocab"

  // model
  std::vector<std::pair<std::string, Token>> vocab;
  std::vector<Merge> merges;  // best first
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a pre-token that is a vocabulary token is that token (Llama 3)
  std::optional<std::string> unk_token;

  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  // nullopt: no decoder, and `tokenizers` joins the tokens with spaces.
  std::optional<std::vector<Decoder>> decoders;
  std::vector<AddedToken> added_tokens;

  // What EncodeWithSpecials puts before and after a sequence (the post-processor's template).
  std::vector<Token> prefix, suffix;
  std::optional<Token> eot;
  std::vector<Token> stop_tokens;  // empty: eot
};

class BpeTokenizer final : public Tokenizer {
 public:
  static constexpr std::string_view kEndOfText = "<|endoftext|>";

  // Whether the text of a special added token in Encode's input is that token or plain text.
  enum class Specials {
    kParse,   // Hugging Face's behaviour (its tokenizer.json's added tokens are always matched)
    kAsText,  // `tokenizers`' encode_special_tokens, tiktoken's encode_ordinary: "<|endoftext|>"
              // is 7 ordinary tokens in GPT-2 (added tokens that are not special still match)
  };

  // GPT-2's vocab.json (a JSON object: token → id) and merges.txt (one "a b" merge a line, best
  // first, after an optional "#version" line); GPT-2's own encoder.json and vocab.bpe are the same
  // formats. "<|endoftext|>", when the vocabulary has it, is the special token and eot().
  // Errors name the file: NotFound for a missing one; InvalidArgument naming the line for
  // malformed JSON, a merges line that is not two tokens, or a merge whose parts or result are not
  // in the vocabulary; and (as Create) for a vocabulary that lacks one of the 256 byte tokens, has
  // an id twice or past 2^21 - 1, or has a token that is not made of Gpt2ByteChar characters.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromGpt2Files(
      const std::string& vocab_path, const std::string& merges_path);

  // Everything from the pipeline. InvalidArgument naming pipeline.vocab_where (or the part's
  // `where`) for an id twice or past 2^21 - 1, a merge whose parts or result are not in the
  // vocabulary, a pattern PCRE2 cannot compile; for a byte-level pipeline, a vocabulary that lacks
  // a byte token or has one not made of Gpt2ByteChar characters (an added token may be anything);
  // an unk_token outside the vocabulary.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Create(BpePipeline pipeline);

  std::vector<Token> Encode(std::string_view text) const override {
    return Encode(text, Specials::kParse);
  }
  // Never fails. Valid UTF-8 gets exactly `tokenizers`' ids (see the limits above).
  std::vector<Token> Encode(std::string_view text, Specials specials) const;
  std::vector<Token> EncodeWithSpecials(std::string_view text) const override;

  // The decoders' text (an added token gives its content; bytes, not U+FFFD: see above).
  // InvalidArgument naming the position of a token outside the vocabulary.
  absl::StatusOr<std::string> Decode(std::span<const Token> tokens) const override {
    return DecodeImpl(tokens, /*continuation=*/false);
  }
  absl::StatusOr<std::string> DecodeContinuation(std::span<const Token> tokens) const override {
    return DecodeImpl(tokens, /*continuation=*/true);
  }

  // One more than the largest id of the vocabulary and added tokens (50257 for GPT-2).
  int32_t vocab_size() const override { return static_cast<int32_t>(token_text_.size()); }
  std::optional<Token> eot() const override { return eot_; }
  std::vector<Token> stop_tokens() const override;
  std::string Describe() const override;

  ~BpeTokenizer() override;

 private:
  struct Merge {
    int32_t rank;
    Token result;
  };
  struct Regex;  // a compiled pattern (PCRE2 types stay in the .cc)
  // A piece of text on its way through the pipeline; `at_start` when it begins at the start of
  // Encode's input (Metaspace's prepend_scheme "first" asks).
  struct Piece {
    std::string text;
    bool at_start;
  };
  // One added-token matcher: the added tokens (by index) and the text each is matched as.
  struct AddedMatcher {
    std::vector<std::pair<std::string, size_t>> patterns;
  };

  BpeTokenizer() = default;

  // Cuts `text` at the added tokens `matcher` finds (`tokenizers`' find_matches): calls
  // on_text(piece, offset) for the text between them and appends the tokens' ids to `out`.
  template <typename OnText>
  void SplitOnAdded(std::string_view text, const AddedMatcher& matcher, Specials specials,
                    std::vector<Token>& out, const OnText& on_text) const;
  void EncodeSegment(std::string_view text, bool at_start, Specials specials,
                     std::vector<Token>& out) const;
  std::string Normalize(std::string_view text) const;
  std::vector<Piece> PreTokenize(std::string piece, bool at_start) const;
  void EncodePreToken(std::string_view piece, std::vector<Token>& out) const;
  std::vector<Token> Bpe(std::string_view piece) const;
  absl::StatusOr<std::string> DecodeImpl(std::span<const Token> tokens, bool continuation) const;

  BpePipeline pipeline_;  // the parts Encode and Decode follow (vocab and merges moved out)
  bool byte_level_ = false;
  // Indexed by id: the token's text as the vocabulary or added tokens spell it (what the decoders
  // start from); nullopt for an id nothing has.
  std::vector<std::optional<std::string>> token_text_;
  // A pre-token's bytes → its id, for ignore_merges and the characters of a SentencePiece-style
  // vocabulary (byte-level tokens keyed by the bytes they stand for).
  absl::flat_hash_map<std::string, Token> ids_by_bytes_;
  std::array<Token, 256> byte_tokens_{};  // byte-level: byte → token; byte_fallback: "<0xXX>"
  std::array<bool, 256> has_byte_token_{};
  std::optional<Token> unk_;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // key: (left id << 32) | right id
  AddedMatcher raw_added_, normalized_added_;
  std::optional<Token> eot_;
  // Compiled patterns, by the index of their normalizer or pre-tokenizer; GPT-2's for ByteLevel.
  std::vector<std::unique_ptr<Regex>> normalizer_regex_, pre_tokenizer_regex_;
  std::unique_ptr<Regex> byte_level_regex_;

  mutable std::mutex cache_mutex_;
  mutable absl::flat_hash_map<std::string, std::vector<Token>> cache_;  // pre-token → ids
};

}  // namespace shardline::data
