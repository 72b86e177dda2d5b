#include "worker/model/data/tokenizer.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "worker/model/data/byte_tokenizer.h"
#include "worker/model/data/gpt2_tokenizer.h"

namespace shardline::data {
namespace {

namespace stdfs = std::filesystem;

bool IsFile(const stdfs::path& path) {
  std::error_code ec;
  return stdfs::is_regular_file(path, ec);
}

// Which files of a tokenizer folder LoadTokenizer reads, in the order it looks for them.
enum class FolderFiles { kNone, kVocabAndMerges, kTokenizerJson, kEncoderAndBpe };

FolderFiles FilesIn(const stdfs::path& dir) {
  if (IsFile(dir / "vocab.json") && IsFile(dir / "merges.txt")) return FolderFiles::kVocabAndMerges;
  if (IsFile(dir / "tokenizer.json")) return FolderFiles::kTokenizerJson;
  if (IsFile(dir / "encoder.json") && IsFile(dir / "vocab.bpe")) return FolderFiles::kEncoderAndBpe;
  return FolderFiles::kNone;
}

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> LoadGpt2(const std::string& spec) {
  const stdfs::path path(spec);
  std::error_code ec;
  if (stdfs::is_directory(path, ec)) {
    switch (FilesIn(path)) {
      case FolderFiles::kVocabAndMerges:
        return Gpt2Tokenizer::FromFiles((path / "vocab.json").string(),
                                        (path / "merges.txt").string());
      case FolderFiles::kTokenizerJson:
        return Gpt2Tokenizer::FromTokenizerJson((path / "tokenizer.json").string());
      case FolderFiles::kEncoderAndBpe:
        return Gpt2Tokenizer::FromFiles((path / "encoder.json").string(),
                                        (path / "vocab.bpe").string());
      case FolderFiles::kNone:
        break;
    }
    return absl::NotFoundError(absl::StrCat(spec,
                                            " holds no tokenizer: neither vocab.json + merges.txt,"
                                            " tokenizer.json nor encoder.json + vocab.bpe"));
  }
  // A vocabulary or merges file names its partner in the same folder.
  const std::string name = path.filename().string();
  const stdfs::path dir = path.parent_path();
  if (name == "vocab.json") return Gpt2Tokenizer::FromFiles(spec, (dir / "merges.txt").string());
  if (name == "merges.txt") return Gpt2Tokenizer::FromFiles((dir / "vocab.json").string(), spec);
  if (name == "encoder.json") return Gpt2Tokenizer::FromFiles(spec, (dir / "vocab.bpe").string());
  if (name == "vocab.bpe") return Gpt2Tokenizer::FromFiles((dir / "encoder.json").string(), spec);
  if (path.extension() == ".json") return Gpt2Tokenizer::FromTokenizerJson(spec);
  if (!stdfs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("no tokenizer at ", spec,
                                            " (expected \"bytes\", a folder or a tokenizer file)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(spec,
                   ": not a tokenizer file (vocab.json, merges.txt, encoder.json, vocab.bpe or a "
                   "tokenizer.json)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec) {
  if (spec == "bytes") return std::make_unique<ByteTokenizer>(/*with_eot=*/true);
  absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> gpt2 = LoadGpt2(spec);
  if (!gpt2.ok()) return gpt2.status();
  return std::unique_ptr<Tokenizer>(std::move(*gpt2));
}

bool HoldsTokenizerFiles(const std::string& dir) { return FilesIn(dir) != FolderFiles::kNone; }

}  // namespace shardline::data
