// The in-place shard writer (worker/checkpoint/shard_writer.h, the memory tier's): the file is the
// staging buffer, a safetensors file every reader takes, with the checksums a verifier takes;
// its files are recycled, kInPlaceSlots saves apart (the same inode renamed into the new step), and
// a slot whose file someone removed gets a new one.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/checksum.h"
#include "checkpoint/commit.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors_reader.h"
#include "worker/checkpoint/shard_writer.h"

namespace shardline::worker {
namespace {

namespace fs = std::filesystem;

// A parameter of 6 floats saved as two boxes, and one of 4.
ShardPlan Plan() {
  std::vector<model::StatePiece> pieces;
  for (const auto& [param, offset, rows] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"w", 0, 2}, {"w", 2, 1}, {"b", 0, 4}}) {
    model::StatePiece piece;
    piece.param = param;
    piece.global_shape = param == "w" ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{4};
    piece.box.offsets = param == "w" ? std::vector<int64_t>{offset, 0} : std::vector<int64_t>{0};
    piece.box.shape = param == "w" ? std::vector<int64_t>{rows, 2} : std::vector<int64_t>{rows};
    piece.numel = param == "w" ? rows * 2 : rows;
    pieces.push_back(piece);
  }
  return MakeShardPlan(pieces);
}

ino_t Inode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

class InPlaceShardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        (fs::temp_directory_path() / ("shardline-inplace-" + std::to_string(::getpid()))).string();
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Saves step `step` with every value step + its index; returns what the writer reported.
  checkpoint::SavedShard Save(AsyncShardWriter& writer, int64_t step) {
    const std::string dir = checkpoint::StepDir(root_, step);
    EXPECT_TRUE(writer.Prepare(dir).ok());
    std::span<float> staging = writer.staging();
    for (size_t i = 0; i < staging.size(); ++i) staging[i] = static_cast<float>(step * 100 + i);
    EXPECT_TRUE(writer.Start(step, dir).ok());
    EXPECT_TRUE(writer.WaitIdle().ok());
    return reported_.back();
  }

  std::unique_ptr<AsyncShardWriter> MakeWriter() {
    return AsyncShardWriter::InPlace(Plan(), /*rank=*/1,
                                     [this](int64_t, const checkpoint::SavedShard& shard) {
                                       reported_.push_back(shard);
                                       return absl::OkStatus();
                                     });
  }

  std::string root_;
  std::vector<checkpoint::SavedShard> reported_;
};

TEST_F(InPlaceShardWriterTest, TheFileIsASafetensorsShardWhoseChecksumsVerify) {
  auto writer = MakeWriter();
  const checkpoint::SavedShard shard = Save(*writer, 5);
  ASSERT_EQ(shard.file, "rank-00001.safetensors");
  const std::string path = checkpoint::StepDir(root_, 5) + "/" + shard.file;
  EXPECT_EQ(fs::file_size(path), shard.bytes);
  // In plan order: w's two boxes ("w" and "w:1"), then b.
  auto reader = checkpoint::SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto w = reader->ReadFloat("w");
  auto w1 = reader->ReadFloat("w:1");
  auto b = reader->ReadFloat("b");
  ASSERT_TRUE(w.ok() && w1.ok() && b.ok());
  EXPECT_EQ(w->values, (std::vector<float>{500, 501, 502, 503}));
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(w1->values, (std::vector<float>{504, 505}));
  EXPECT_EQ(b->values, (std::vector<float>{506, 507, 508, 509}));
  // The checksums a verifier takes (checksum.h): each piece's bytes, and the file's from its
  // header region and the pieces in file order.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  const std::string header_region = bytes.substr(0, 8 + header_size);
  std::vector<uint64_t> checksums;
  ASSERT_EQ(shard.pieces.size(), 3u);
  for (const auto& [piece, values] : {std::pair{shard.pieces[0], w->values},
                                      {shard.pieces[1], w1->values},
                                      {shard.pieces[2], b->values}}) {
    checksums.push_back(checkpoint::Xxh3Of(std::as_bytes(std::span<const float>(values))));
    EXPECT_EQ(piece.xxh3, checksums.back()) << piece.tensor;
  }
  EXPECT_EQ(shard.xxh3, checkpoint::FileChecksum(
                            std::as_bytes(std::span<const char>(header_region)), checksums));
  EXPECT_EQ(shard.pieces[1].tensor, "w:1");
  EXPECT_EQ(shard.pieces[1].offsets, (std::vector<int64_t>{2, 0}));
}

TEST_F(InPlaceShardWriterTest, FilesAreRecycledEverySlotsSavesAndARemovedOneIsMadeAgain) {
  auto writer = MakeWriter();
  std::vector<ino_t> inodes;
  for (int64_t step = 1; step <= AsyncShardWriter::kInPlaceSlots; ++step) {
    Save(*writer, step);
    inodes.push_back(Inode(checkpoint::StepDir(root_, step) + "/rank-00001.safetensors"));
  }
  // The next save takes step 1's file: gone from step 1, the same inode in step 4.
  Save(*writer, 4);
  EXPECT_FALSE(fs::exists(checkpoint::StepDir(root_, 1) + "/rank-00001.safetensors"));
  EXPECT_EQ(Inode(checkpoint::StepDir(root_, 4) + "/rank-00001.safetensors"), inodes[0]);
  auto reader = checkpoint::SafetensorsReader::Open(checkpoint::StepDir(root_, 4) +
                                                    "/rank-00001.safetensors");
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(reader->ReadFloat("b")->values, (std::vector<float>{406, 407, 408, 409}));
  // Step 2's file removed behind the writer's back (a prune, the job's end): a new one.
  fs::remove_all(checkpoint::StepDir(root_, 2));
  const checkpoint::SavedShard shard = Save(*writer, 5);
  const std::string five = checkpoint::StepDir(root_, 5) + "/" + shard.file;
  EXPECT_TRUE(fs::exists(five));
  EXPECT_EQ(fs::file_size(five), shard.bytes);
  // Steps 3 and 4 are untouched.
  EXPECT_TRUE(fs::exists(checkpoint::StepDir(root_, 3) + "/rank-00001.safetensors"));
  EXPECT_TRUE(fs::exists(checkpoint::StepDir(root_, 4) + "/rank-00001.safetensors"));
}

}  // namespace
}  // namespace shardline::worker
