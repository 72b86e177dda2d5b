#include "worker/model/data/byte_tokenizer.h"

#include "absl/strings/str_cat.h"

namespace shardline::data {

std::vector<Token> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<Token> tokens;
  tokens.reserve(text.size());
  for (char c : text) tokens.push_back(static_cast<Token>(static_cast<unsigned char>(c)));
  return tokens;
}

absl::StatusOr<std::string> ByteTokenizer::Decode(std::span<const Token> tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const Token token = tokens[i];
    if (token >= 0 && token < 256) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(token)));
    } else if (token == kEotToken && with_eot_) {
      text.append(kEotText);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("byte tokenizer: token ", token, " at position ", i,
                       " is outside the vocabulary of size ", vocab_size()));
    }
  }
  return text;
}

}  // namespace shardline::data
