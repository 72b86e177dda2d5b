// What the tokenizer loaders (bpe_tokenizer.cc's GPT-2 files, tokenizer_json.cc's Hugging Face
// files) share: reading a file and its JSON with errors that name the file and the line, the
// bound on token ids, and UTF-8 lengths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/model/data/tokenizer.h"

namespace shardline::data {

// Ids are indices into tables sized by the largest id, so a few bytes of vocabulary naming id
// 2^31 - 2 would make the loader allocate about 100 GB. 2^21 is 8 times the largest vocabularies
// in use (Gemma's 262,144) and keeps what a hostile file can make us allocate near 100 MB.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 21) - 1;

// Whether a JSON value is an id the tokenizer takes: an integer in [0, kMaxTokenId].
bool IsTokenId(const nlohmann::json& id);

// `s` as a JSON string, for messages; bytes that are not UTF-8 (a merges file may have them) are
// shown as U+FFFD rather than thrown about.
std::string Quote(std::string_view s);

// The whole file. NotFound for a missing one, PermissionDenied, InvalidArgument for a directory.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// `contents` (of `path`) as JSON; InvalidArgument naming the line and column of a syntax error.
absl::StatusOr<nlohmann::json> ParseJson(const std::string& path, const std::string& contents);

// `object` (a JSON object of token → id, named `where`) as pairs.
absl::StatusOr<std::vector<std::pair<std::string, Token>>> VocabEntries(
    const nlohmann::json& object, const std::string& where);

// The length of the well-formed UTF-8 sequence at text[i] (Unicode's Table 3-7: no overlong
// forms, no surrogates, nothing past U+10FFFF), or 0 when the bytes there are not one.
size_t Utf8SequenceLength(std::string_view text, size_t i);

}  // namespace shardline::data
