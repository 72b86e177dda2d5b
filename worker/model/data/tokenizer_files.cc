#include "worker/model/data/tokenizer_files.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace shardline::data {

using nlohmann::json;

bool IsTokenId(const json& id) {
  return id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= kMaxTokenId;
}

std::string Quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  // stat first: std::ifstream opens a directory "successfully" and then fails to read.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    const std::string message = absl::StrCat(path, ": cannot open: ", std::strerror(error));
    if (error == ENOENT || error == ENOTDIR) return absl::NotFoundError(message);
    if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(message);
    return absl::InvalidArgumentError(message);
  }
  if (S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, expected a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    const std::string message = absl::StrCat(path, ": cannot open: ", std::strerror(error));
    if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(message);
    return absl::InvalidArgumentError(message);
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
  }
  return std::move(contents).str();
}

absl::StatusOr<json> ParseJson(const std::string& path, const std::string& contents) {
  try {
    return json::parse(contents);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based and may be one past the end (unexpected end of input).
    const size_t at = std::min(contents.size(), e.byte > 0 ? e.byte - 1 : 0);
    const size_t line = 1 + std::count(contents.begin(), contents.begin() + at, '\n');
    const size_t line_start = at == 0 ? std::string::npos : contents.rfind('\n', at - 1);
    const size_t column = line_start == std::string::npos ? at + 1 : at - line_start;
    // what() is "[json.exception.parse_error.101] parse error at line L, column C: WHY".
    const std::string what = e.what();
    const size_t colon = what.find(": ");
    const std::string why = colon == std::string::npos ? what : what.substr(colon + 2);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " line ", line, " column ", column, ": malformed JSON: ", why));
  } catch (const json::exception& e) {
    // A number past double's range ("1e400") is out_of_range, not a parse_error, and has no
    // position.
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON: ", e.what()));
  }
}

absl::StatusOr<std::vector<std::pair<std::string, Token>>> VocabEntries(const json& object,
                                                                        const std::string& where) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a JSON object of token to id, got ", object.type_name()));
  }
  std::vector<std::pair<std::string, Token>> vocab;
  vocab.reserve(object.size());
  for (const auto& [token, id] : object.items()) {
    if (!IsTokenId(id)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": token ", Quote(token), " has id ",
                                                     id.dump(), ", expected an integer in [0, ",
                                                     kMaxTokenId, "]"));
    }
    vocab.emplace_back(token, static_cast<Token>(id.get<int64_t>()));
  }
  return vocab;
}

size_t Utf8SequenceLength(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) -> int {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : -1;
  };
  const auto in = [](int v, int lo, int hi) { return v >= lo && v <= hi; };
  const int b0 = byte(0);
  if (b0 < 0x80) return 1;
  if (in(b0, 0xC2, 0xDF)) return in(byte(1), 0x80, 0xBF) ? 2 : 0;
  if (in(b0, 0xE0, 0xEF)) {
    const int lo = b0 == 0xE0 ? 0xA0 : 0x80;
    const int hi = b0 == 0xED ? 0x9F : 0xBF;
    return in(byte(1), lo, hi) && in(byte(2), 0x80, 0xBF) ? 3 : 0;
  }
  if (in(b0, 0xF0, 0xF4)) {
    const int lo = b0 == 0xF0 ? 0x90 : 0x80;
    const int hi = b0 == 0xF4 ? 0x8F : 0xBF;
    return in(byte(1), lo, hi) && in(byte(2), 0x80, 0xBF) && in(byte(3), 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

}  // namespace shardline::data
