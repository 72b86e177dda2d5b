// What `generate` (and anything else that turns text into a model's tokens) needs of a tokenizer,
// whichever one it is: the byte tokenizer (byte_tokenizer.h) or GPT-2's BPE (gpt2_tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline::data {

// Token ids are int32 because the model's embedding lookups index with them.
using Token = int32_t;

// Implementations are immutable after construction; every method may be called from any thread.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Never fails: every byte string, valid UTF-8 or not, has an encoding that Decode gives back.
  virtual std::vector<Token> Encode(std::string_view text) const = 0;
  // The bytes back. InvalidArgument naming the position of a token outside the vocabulary.
  virtual absl::StatusOr<std::string> Decode(std::span<const Token> tokens) const = 0;
  // Every id Encode gives is below this: a model must have at least this many embeddings.
  virtual int32_t vocab_size() const = 0;
  // The end-of-text token between documents, if the vocabulary has one.
  virtual std::optional<Token> eot() const = 0;
  // For messages: "the byte tokenizer", "the GPT-2 BPE tokenizer of DIR/vocab.json".
  virtual std::string Describe() const = 0;
};

// The tokenizer `spec` names:
//   - "bytes": the byte tokenizer, with its end-of-text token;
//   - a folder holding vocab.json + merges.txt, tokenizer.json, or GPT-2's original
//     encoder.json + vocab.bpe (looked for in that order);
//   - one of those files (a vocabulary or merges file takes its partner from the same folder; any
//     other .json file is read as a Hugging Face tokenizer.json).
// Errors name the path and what was wrong (Gpt2Tokenizer's loaders say which line).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec);

// Whether folder `dir` holds the files LoadTokenizer(dir) would read (a Hugging Face model folder
// usually does).
bool HoldsTokenizerFiles(const std::string& dir);

}  // namespace shardline::data
