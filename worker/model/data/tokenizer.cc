#include "worker/model/data/tokenizer.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "worker/model/data/bpe_tokenizer.h"
#include "worker/model/data/byte_tokenizer.h"
#include "worker/model/data/tokenizer_json.h"

namespace shardline::data {
namespace {

namespace stdfs = std::filesystem;

bool IsFile(const stdfs::path& path) {
  std::error_code ec;
  return stdfs::is_regular_file(path, ec);
}

// Which files of a tokenizer folder LoadTokenizer reads, in the order it looks for them.
// tokenizer.json first: it is the whole tokenizer (added tokens, normalizer, pre-tokenizer), where
// vocab.json + merges.txt beside it (a GPT-2 folder has both) are only its model.
enum class FolderFiles { kNone, kTokenizerJson, kVocabAndMerges, kEncoderAndBpe };

FolderFiles FilesIn(const stdfs::path& dir) {
  if (IsFile(dir / "tokenizer.json")) return FolderFiles::kTokenizerJson;
  if (IsFile(dir / "vocab.json") && IsFile(dir / "merges.txt")) return FolderFiles::kVocabAndMerges;
  if (IsFile(dir / "encoder.json") && IsFile(dir / "vocab.bpe")) return FolderFiles::kEncoderAndBpe;
  return FolderFiles::kNone;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> LoadBpe(const std::string& spec) {
  const stdfs::path path(spec);
  std::error_code ec;
  if (stdfs::is_directory(path, ec)) {
    switch (FilesIn(path)) {
      case FolderFiles::kTokenizerJson:
        return LoadTokenizerJson((path / "tokenizer.json").string());
      case FolderFiles::kVocabAndMerges:
        return BpeTokenizer::FromGpt2Files((path / "vocab.json").string(),
                                           (path / "merges.txt").string());
      case FolderFiles::kEncoderAndBpe:
        return BpeTokenizer::FromGpt2Files((path / "encoder.json").string(),
                                           (path / "vocab.bpe").string());
      case FolderFiles::kNone:
        break;
    }
    return absl::NotFoundError(
        absl::StrCat(spec,
                     " holds no tokenizer: neither tokenizer.json,"
                     " vocab.json + merges.txt nor encoder.json + vocab.bpe"));
  }
  // A vocabulary or merges file names its partner in the same folder.
  const std::string name = path.filename().string();
  const stdfs::path dir = path.parent_path();
  if (name == "vocab.json") return BpeTokenizer::FromGpt2Files(spec, (dir / "merges.txt").string());
  if (name == "merges.txt") return BpeTokenizer::FromGpt2Files((dir / "vocab.json").string(), spec);
  if (name == "encoder.json")
    return BpeTokenizer::FromGpt2Files(spec, (dir / "vocab.bpe").string());
  if (name == "vocab.bpe")
    return BpeTokenizer::FromGpt2Files((dir / "encoder.json").string(), spec);
  if (path.extension() == ".json") return LoadTokenizerJson(spec);
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
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> bpe = LoadBpe(spec);
  if (!bpe.ok()) return bpe.status();
  return std::unique_ptr<Tokenizer>(std::move(*bpe));
}

bool HoldsTokenizerFiles(const std::string& dir) { return FilesIn(dir) != FolderFiles::kNone; }

absl::Status CheckTokenizerFitsModel(const Tokenizer& tokenizer, int64_t model_vocab) {
  if (tokenizer.vocab_size() <= model_vocab) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(tokenizer.Describe(), " has ", tokenizer.vocab_size(),
                   " tokens but the model's vocabulary is ", model_vocab));
}

}  // namespace shardline::data
