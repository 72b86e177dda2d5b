#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "worker/model/data/byte_tokenizer.h"
#include "worker/model/data/text_dataset.h"

namespace shardline::data {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

// A fresh directory per test, so parallel ctest runs never share files.
std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "/data_test_XXXXXX";
  const char* dir = ::mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

TEST(ByteTokenizerTest, VocabularySizes) {
  EXPECT_EQ(ByteTokenizer().vocab_size(), 257);
  EXPECT_EQ(ByteTokenizer(/*with_eot=*/false).vocab_size(), 256);
}

TEST(ByteTokenizerTest, EveryByteRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const ByteTokenizer tokenizer;
  const std::vector<Token> tokens = tokenizer.Encode(all);
  ASSERT_EQ(tokens.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tokens[b], b) << "bytes are unsigned, 0x80+ too";
  absl::StatusOr<std::string> decoded = tokenizer.Decode(tokens);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, all);
}

TEST(ByteTokenizerTest, RandomBytesRoundTrip) {
  std::mt19937 rng(7);
  const ByteTokenizer tokenizer;
  for (int trial = 0; trial < 20; ++trial) {
    std::string text(rng() % 1000, '\0');
    for (char& c : text) c = static_cast<char>(rng());
    absl::StatusOr<std::string> decoded = tokenizer.Decode(tokenizer.Encode(text));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text);
  }
}

TEST(ByteTokenizerTest, EndOfTextDecodesToItsMarker) {
  const std::vector<Token> tokens = {'a', ByteTokenizer::kEotToken, 'b'};
  absl::StatusOr<std::string> decoded = ByteTokenizer().Decode(tokens);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, "a<|endoftext|>b");
  // The marker's text is ordinary bytes when encoded: only the model produces token 256.
  EXPECT_EQ(ByteTokenizer().Encode("<|endoftext|>").size(), 13u);
}

TEST(ByteTokenizerTest, OutOfVocabularyTokenIsAnErrorNamingThePosition) {
  const std::vector<Token> tokens = {'a', 'b', 300};
  absl::StatusOr<std::string> decoded = ByteTokenizer().Decode(tokens);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(decoded.status()), HasSubstr("token 300 at position 2"));

  const std::vector<Token> eot = {ByteTokenizer::kEotToken};
  EXPECT_FALSE(ByteTokenizer(/*with_eot=*/false).Decode(eot).ok());
  const std::vector<Token> negative = {-1};
  EXPECT_FALSE(ByteTokenizer().Decode(negative).ok());
}

TEST(TextDatasetTest, ReadsTheWholeFileAsBytes) {
  const std::string path = TempDir() + "/corpus.txt";
  const std::string text = std::string("hello\n\xff\x00world", 13);
  WriteFile(path, text);
  absl::StatusOr<TextDataset> dataset = TextDataset::FromFile(path);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->source(), path);
  ASSERT_EQ(dataset->size(), text.size());
  EXPECT_EQ(dataset->tokens()[6], 255);
  EXPECT_EQ(dataset->tokens()[7], 0);
  EXPECT_EQ(*ByteTokenizer().Decode(dataset->tokens()), text);
}

TEST(TextDatasetTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = TempDir() + "/no-such-file.txt";
  absl::StatusOr<TextDataset> dataset = TextDataset::FromFile(path);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(dataset.status()), HasSubstr(path));
  EXPECT_THAT(Message(dataset.status()), HasSubstr("No such file"));
}

TEST(TextDatasetTest, EmptyFileIsAnError) {
  const std::string path = TempDir() + "/empty.txt";
  WriteFile(path, "");
  absl::StatusOr<TextDataset> dataset = TextDataset::FromFile(path);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(dataset.status()), HasSubstr(path));
  EXPECT_THAT(Message(dataset.status()), HasSubstr("empty"));
}

TEST(TextDatasetTest, DirectoryIsAnError) {
  const std::string dir = TempDir();
  absl::StatusOr<TextDataset> dataset = TextDataset::FromFile(dir);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(dataset.status()), HasSubstr(dir));
  EXPECT_THAT(Message(dataset.status()), HasSubstr("directory"));
}

TEST(TextDatasetTest, UnreadableFileIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  const std::string path = TempDir() + "/secret.txt";
  WriteFile(path, "x");
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  absl::StatusOr<TextDataset> dataset = TextDataset::FromFile(path);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(Message(dataset.status()), HasSubstr(path));
}

}  // namespace
}  // namespace shardline::data
