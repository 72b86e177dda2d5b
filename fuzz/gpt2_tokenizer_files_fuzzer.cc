// The BPE tokenizer's loaders (worker/model/data/bpe_tokenizer.h, tokenizer_json.h) on arbitrary
// files, then its encoder with what they built. The input is "VOCAB\0MERGES\0TEXT" for
// FromGpt2Files (vocab.json, merges.txt, text to encode; JSON has no raw NUL, so the split is
// unambiguous), or, without a NUL, a tokenizer.json for LoadTokenizerJson. A loader must refuse bad
// files with InvalidArgument; a tokenizer it builds must give ids below its vocab_size that decode
// back to the text, as Tokenizer promises.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "worker/model/data/bpe_tokenizer.h"
#include "worker/model/data/tokenizer_json.h"

namespace {

using shardline::data::BpeTokenizer;
using shardline::data::LoadTokenizerJson;
using shardline::data::Token;

void CheckRoundTrip(const BpeTokenizer& tokenizer, std::string_view text,
                    BpeTokenizer::Specials specials) {
  const std::vector<Token> ids = tokenizer.Encode(text, specials);
  for (const Token id : ids) {
    FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size(),
               "id " + std::to_string(id) + " outside the vocabulary");
  }
  absl::StatusOr<std::string> decoded = tokenizer.Decode(ids);
  FUZZ_CHECK(decoded.ok(), "Decode(Encode(text)) failed: " + decoded.status().ToString());
  FUZZ_CHECK(*decoded == text, "Decode(Encode(text)) differs from the text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t vocab_end = input.find('\0');
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tokenizer;
  std::string_view text;
  if (vocab_end == std::string_view::npos) {
    const shardline::fuzz::MemoryFile json(input);
    tokenizer = LoadTokenizerJson(json.path());
  } else {
    size_t merges_end = input.find('\0', vocab_end + 1);
    if (merges_end == std::string_view::npos) merges_end = input.size();
    const shardline::fuzz::MemoryFile vocab(input.substr(0, vocab_end));
    const shardline::fuzz::MemoryFile merges(
        input.substr(vocab_end + 1, merges_end - vocab_end - 1));
    tokenizer = BpeTokenizer::FromGpt2Files(vocab.path(), merges.path());
    if (merges_end < input.size()) text = input.substr(merges_end + 1);
  }
  if (!tokenizer.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(tokenizer.status()),
               "not InvalidArgument: " + tokenizer.status().ToString());
    return 0;
  }
  CheckRoundTrip(**tokenizer, text, BpeTokenizer::Specials::kParse);
  CheckRoundTrip(**tokenizer, text, BpeTokenizer::Specials::kAsText);
  return 0;
}
