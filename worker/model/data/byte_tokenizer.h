// A byte-level tokenizer: every byte is its own token, so any file is valid input and nothing needs
// a vocabulary file. Token 256 is an optional end-of-text marker between documents.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline::data {

// Token ids are int32 because the model's embedding lookups index with them; only 0..256 occur.
using Token = int32_t;

class ByteTokenizer {
 public:
  static constexpr Token kEotToken = 256;
  static constexpr std::string_view kEotText = "<|endoftext|>";

  // With `with_eot`, the vocabulary has 257 entries and kEotToken is valid; otherwise 256.
  explicit ByteTokenizer(bool with_eot = true) : with_eot_(with_eot) {}

  int32_t vocab_size() const { return with_eot_ ? 257 : 256; }
  bool has_eot() const { return with_eot_; }

  // One token per byte (bytes are read as unsigned, so 0x80..0xFF map to 128..255). Never fails:
  // no byte sequence is invalid, and kEotText in the input is just bytes, not the EOT token.
  std::vector<Token> Encode(std::string_view text) const;

  // The exact bytes back; kEotToken becomes kEotText. InvalidArgument naming the position for a
  // token outside the vocabulary.
  absl::StatusOr<std::string> Decode(std::span<const Token> tokens) const;

 private:
  bool with_eot_;
};

}  // namespace shardline::data
