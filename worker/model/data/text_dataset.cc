#include "worker/model/data/text_dataset.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace shardline::data {
namespace {

absl::Status OpenError(const std::string& path, int error) {
  const std::string message =
      absl::StrCat("data file ", path, ": cannot open: ", std::strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

}  // namespace

absl::StatusOr<TextDataset> TextDataset::FromFile(const std::string& path,
                                                  const ByteTokenizer& tokenizer) {
  // stat first: std::ifstream opens a directory "successfully" on Linux and then fails to read,
  // which would give a far less useful message.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return OpenError(path, errno);
  if (S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file ", path, ": is a directory, expected a text file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return OpenError(path, errno);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file ", path, ": read failed: ", std::strerror(errno)));
  }
  const std::string text = std::move(contents).str();
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file ", path, ": is empty, there is nothing to train on"));
  }
  return FromText(text, path, tokenizer);
}

TextDataset TextDataset::FromText(std::string_view text, std::string source,
                                  const ByteTokenizer& tokenizer) {
  return TextDataset(std::make_shared<const std::vector<Token>>(tokenizer.Encode(text)),
                     std::move(source));
}

}  // namespace shardline::data
