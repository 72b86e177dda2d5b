// What `generate` (and anything else that turns text into a model's tokens) needs of a tokenizer,
// whichever one it is: the byte tokenizer (byte_tokenizer.h) or a byte-level or SentencePiece-style
// BPE from GPT-2's files or a Hugging Face tokenizer.json (bpe_tokenizer.h, tokenizer_json.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardline::data {

// Token ids are int32 because the model's embedding lookups index with them.
using Token = int32_t;

// Implementations are immutable after construction; every method may be called from any thread.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The text's tokens and nothing else (Hugging Face's encode with add_special_tokens=False). Never
  // fails: every byte string, valid UTF-8 or not, has an encoding (Decode gives it back where the
  // tokenizer can spell every byte; bpe_tokenizer.h says where it cannot).
  virtual std::vector<Token> Encode(std::string_view text) const = 0;
  // What a model is given for `text` as a whole input: Encode's tokens with the special tokens
  // the tokenizer puts around a sequence (Hugging Face's add_special_tokens=True; Llama's BOS).
  // Prompts for generation are encoded this way.
  virtual std::vector<Token> EncodeWithSpecials(std::string_view text) const {
    return Encode(text);
  }
  // The text back. InvalidArgument naming the position of a token outside the vocabulary.
  virtual absl::StatusOr<std::string> Decode(std::span<const Token> tokens) const = 0;
  // The text `tokens` add after earlier tokens: Decode without what a decoder does only at the
  // start of a text (Llama 2's drops the space its normalizer put before the first word). What a
  // stream of generated tokens is decoded with, a token or a few at a time.
  virtual absl::StatusOr<std::string> DecodeContinuation(std::span<const Token> tokens) const {
    return Decode(tokens);
  }
  // Every id Encode gives is below this: a model must have at least this many embeddings.
  virtual int32_t vocab_size() const = 0;
  // The end-of-text token between documents, if the vocabulary has one.
  virtual std::optional<Token> eot() const = 0;
  // The tokens that end a generation (every end-of-sequence id; Llama 3 instruct has several),
  // never delivered as text. eot() by default.
  virtual std::vector<Token> stop_tokens() const {
    std::optional<Token> end = eot();
    return end ? std::vector<Token>{*end} : std::vector<Token>{};
  }
  // For messages: "the byte tokenizer", "the BPE tokenizer of DIR/tokenizer.json".
  virtual std::string Describe() const = 0;
};

// The tokenizer `spec` names:
//   - "bytes": the byte tokenizer, with its end-of-text token;
//   - a folder holding tokenizer.json (with the folder's tokenizer_config.json and
//     generation_config.json for its special tokens: tokenizer_json.h), vocab.json + merges.txt,
//     or GPT-2's original encoder.json + vocab.bpe (looked for in that order);
//   - one of those files (a vocabulary or merges file takes its partner from the same folder; any
//     other .json file is read as a Hugging Face tokenizer.json).
// Errors name the path and what was wrong (the file's line, or the JSON field of a tokenizer.json).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec);

// Whether folder `dir` holds the files LoadTokenizer(dir) would read (a Hugging Face model folder
// usually does).
bool HoldsTokenizerFiles(const std::string& dir);

// OK when a model with `model_vocab` embeddings has one for every id `tokenizer` gives (it may have
// more: vocabularies are often padded to a multiple of 64). Else InvalidArgument saying both sizes:
// "the BPE tokenizer of DIR/tokenizer.json has 32005 tokens but the model's vocabulary is 32000".
absl::Status CheckTokenizerFitsModel(const Tokenizer& tokenizer, int64_t model_vocab);

}  // namespace shardline::data
