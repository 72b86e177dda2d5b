// A byte-level tokenizer: every byte is its own token, so any file is valid input and nothing needs
// a vocabulary file. Token 256 is an optional end-of-text marker between documents.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/data/tokenizer.h"

namespace shardline::data {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr Token kEotToken = 256;
  static constexpr std::string_view kEotText = "<|endoftext|>";

  // With `with_eot`, the vocabulary has 257 entries and kEotToken is valid; otherwise 256.
  explicit ByteTokenizer(bool with_eot = true) : with_eot_(with_eot) {}

  int32_t vocab_size() const override { return with_eot_ ? 257 : 256; }
  bool has_eot() const { return with_eot_; }
  std::optional<Token> eot() const override {
    return with_eot_ ? std::optional<Token>(kEotToken) : std::nullopt;
  }
  std::string Describe() const override { return "the byte tokenizer"; }

  // One token per byte (bytes are read as unsigned, so 0x80..0xFF map to 128..255). Never fails:
  // no byte sequence is invalid, and kEotText in the input is just bytes, not the EOT token.
  std::vector<Token> Encode(std::string_view text) const override;

  // The exact bytes back; kEotToken becomes kEotText. InvalidArgument naming the position for a
  // token outside the vocabulary.
  absl::StatusOr<std::string> Decode(std::span<const Token> tokens) const override;

 private:
  bool with_eot_;
};

}  // namespace shardline::data
