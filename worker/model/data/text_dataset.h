// A dataset is one long token stream held in memory; samples are windows of it (see sampler.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/data/byte_tokenizer.h"

namespace shardline::data {

class TextDataset {
 public:
  // Reads the whole file at `path` and tokenizes it. NotFound when the file does not exist,
  // PermissionDenied when it cannot be opened for reading, InvalidArgument when it is a directory,
  // empty, or fails to read; every message names the path.
  static absl::StatusOr<TextDataset> FromFile(const std::string& path,
                                              const ByteTokenizer& tokenizer = ByteTokenizer());

  // A dataset over text already in memory; `source` names it in error messages and logs.
  static TextDataset FromText(std::string_view text, std::string source,
                              const ByteTokenizer& tokenizer = ByteTokenizer());

  // The token stream. Shared, not copied, by the samplers made from this dataset.
  const std::vector<Token>& tokens() const { return *tokens_; }
  std::shared_ptr<const std::vector<Token>> shared_tokens() const { return tokens_; }
  size_t size() const { return tokens_->size(); }
  // The file path, or the name given to FromText.
  const std::string& source() const { return source_; }

 private:
  TextDataset(std::shared_ptr<const std::vector<Token>> tokens, std::string source)
      : tokens_(std::move(tokens)), source_(std::move(source)) {}

  std::shared_ptr<const std::vector<Token>> tokens_;
  std::string source_;
};

}  // namespace shardline::data
