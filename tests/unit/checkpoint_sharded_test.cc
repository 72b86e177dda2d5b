// ShardedReader: boxes of global tensors put together from the rank files a manifest lists, for
// every box of a 3-D tensor and random boxes of a 4-D one, replicas, lazy opening, dtypes, and
// errors that name the manifest, the shard file and the tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/status_macros.h"
#include "tests/support/box_reference.h"
#include "tests/support/file_damage.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/sharded_reader.h"

namespace shardline::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

std::string TempDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("shardline-sharded-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Element i of every global tensor here is i + 0.25 (exact in f32 and bf16 for small i), so a
// misplaced element shows.
std::vector<float> Iota(int64_t count) {
  std::vector<float> values(count);
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<float>(i) + 0.25f;
  return values;
}

std::vector<float> Slice(std::span<const float> full, const std::vector<int64_t>& global,
                         const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape) {
  return shardline::testing::ReferenceBox(full, global, offsets, shape);
}

// Builds rank files and their manifest: each Add puts a box of a global tensor into a rank's file.
class Shards {
 public:
  explicit Shards(std::string dir) : dir_(std::move(dir)) {
    manifest_.step = 5;
    manifest_.world_size = 3;
  }

  // `stored` names the piece in the rank's file when that is not the global name.
  void Add(const std::string& name, const std::vector<int64_t>& global, int64_t rank,
           std::vector<int64_t> offsets, std::vector<int64_t> shape, std::string stored = "") {
    if (stored.empty()) stored = name;
    const std::vector<float> full = Iota(*NumElements(global));
    files_[rank][stored] = HostTensor{shape, Slice(full, global, offsets, shape)};
    ManifestTensor& tensor = manifest_.tensors[name];
    tensor.global_shape = global;
    tensor.shards.push_back({rank, File(rank), stored, std::move(offsets), std::move(shape)});
  }

  static std::string File(int64_t rank) { return "rank-" + std::to_string(rank) + ".safetensors"; }
  std::string Path(int64_t rank) const { return dir_ + "/" + File(rank); }
  std::string ManifestPath() const { return dir_ + "/manifest.json"; }
  Manifest& manifest() { return manifest_; }

  // Writes every rank file and the manifest, with the files' and pieces' checksums.
  void Write() {
    for (const auto& [rank, tensors] : files_) {
      SafetensorsWriter writer(Path(rank));
      for (const auto& [name, tensor] : tensors) ASSERT_TRUE(writer.Add(tensor.View(name)).ok());
      absl::StatusOr<SafetensorsWriter::Written> written = writer.Finish();
      ASSERT_TRUE(written.ok()) << written.status();
      manifest_.files[File(rank)] = ShardFileInfo{rank, written->bytes, written->xxh3};
      for (auto& [name, tensor] : manifest_.tensors) {
        for (ShardSlice& slice : tensor.shards) {
          if (slice.file == File(rank)) slice.xxh3 = written->tensor_xxh3.at(slice.tensor);
        }
      }
    }
    WriteManifestNow();
  }

  // Replaces rank `rank`'s file by `writer`'s and records its size and checksum in the manifest,
  // so that what the reader then finds wrong is the content, not the file's integrity.
  void Replace(int64_t rank, SafetensorsWriter& writer) {
    absl::StatusOr<SafetensorsWriter::Written> written = writer.Finish();
    ASSERT_TRUE(written.ok()) << written.status();
    manifest_.files[File(rank)] = ShardFileInfo{rank, written->bytes, written->xxh3};
    WriteManifestNow();
  }

  void WriteManifestNow() {
    ASSERT_TRUE(WriteManifest(DefaultFileSystem(), ManifestPath(), manifest_).ok());
  }

 private:
  std::string dir_;
  Manifest manifest_;
  std::map<int64_t, std::map<std::string, HostTensor>> files_;
};

const std::vector<int64_t> kCube = {3, 4, 6};
const std::vector<int64_t> kFour = {2, 3, 4, 5};

// "cube" (3, 4, 6): dim 1 split 2|2, the second half split again along dim 2 as 4|2, over three
// ranks. "four" (2, 3, 4, 5): dim 0 split 1|1 and dim 3 split 3|2, rank 0 holding two of the
// pieces (the second under another name in its file). "bias" (7) replicated on
// ranks 0 and 1. "scalar" () on rank 2.
Shards Standard(const std::string& dir) {
  Shards shards(dir);
  shards.Add("cube", kCube, 0, {0, 0, 0}, {3, 2, 6});
  shards.Add("cube", kCube, 1, {0, 2, 0}, {3, 2, 4});
  shards.Add("cube", kCube, 2, {0, 2, 4}, {3, 2, 2});
  shards.Add("four", kFour, 0, {0, 0, 0, 0}, {1, 3, 4, 3});
  shards.Add("four", kFour, 1, {0, 0, 0, 3}, {1, 3, 4, 2});
  shards.Add("four", kFour, 2, {1, 0, 0, 0}, {1, 3, 4, 3});
  shards.Add("four", kFour, 0, {1, 0, 0, 3}, {1, 3, 4, 2}, "four.1");
  shards.Add("bias", {7}, 0, {0}, {7});
  shards.Add("bias", {7}, 1, {0}, {7});
  shards.Add("scalar", {}, 2, {}, {});
  return shards;
}

TEST(ShardedReaderTest, EveryBoxOfA3dTensorMatchesTheSlice) {
  const std::string dir = TempDir("cube");
  Shards shards = Standard(dir);
  shards.Write();
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(shards.ManifestPath());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const std::vector<float> full = Iota(3 * 4 * 6);
  int boxes = 0;
  for (int64_t a0 = 0; a0 <= 3; ++a0)
    for (int64_t a1 = a0; a1 <= 3; ++a1)
      for (int64_t b0 = 0; b0 <= 4; ++b0)
        for (int64_t b1 = b0; b1 <= 4; ++b1)
          for (int64_t c0 = 0; c0 <= 6; ++c0)
            for (int64_t c1 = c0; c1 <= 6; ++c1) {
              const std::vector<int64_t> offsets = {a0, b0, c0},
                                         shape = {a1 - a0, b1 - b0, c1 - c0};
              absl::StatusOr<std::vector<float>> box = reader->ReadBox("cube", offsets, shape);
              ASSERT_TRUE(box.ok()) << box.status();
              ASSERT_EQ(*box, Slice(full, kCube, offsets, shape))
                  << ShapeString(offsets) << " " << ShapeString(shape);
              ++boxes;
            }
  EXPECT_EQ(boxes, 10 * 15 * 28);
  absl::StatusOr<HostTensor> whole = reader->ReadTensor("cube");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->shape, kCube);
  EXPECT_EQ(whole->values, full);
  fs::remove_all(dir);
}

TEST(ShardedReaderTest, RandomBoxesOfA4dTensorAScalarAndAReplicatedVector) {
  const std::string dir = TempDir("four");
  Shards shards = Standard(dir);
  shards.Write();
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(shards.ManifestPath());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const std::vector<float> full = Iota(2 * 3 * 4 * 5);
  std::mt19937 rng(42);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int64_t> offsets, shape;
    for (int64_t size : kFour) {
      int64_t a = std::uniform_int_distribution<int64_t>(0, size)(rng);
      int64_t b = std::uniform_int_distribution<int64_t>(0, size)(rng);
      if (a > b) std::swap(a, b);
      offsets.push_back(a);
      shape.push_back(b - a);
    }
    absl::StatusOr<std::vector<float>> box = reader->ReadBox("four", offsets, shape);
    ASSERT_TRUE(box.ok()) << box.status();
    ASSERT_EQ(*box, Slice(full, kFour, offsets, shape))
        << ShapeString(offsets) << " " << ShapeString(shape);
  }
  absl::StatusOr<HostTensor> scalar = reader->ReadTensor("scalar");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->values, std::vector<float>{0.25f});
  const std::vector<int64_t> offsets = {2}, shape = {3};
  absl::StatusOr<std::vector<float>> bias = reader->ReadBox("bias", offsets, shape);
  ASSERT_TRUE(bias.ok()) << bias.status();
  EXPECT_EQ(*bias, (std::vector<float>{2.25f, 3.25f, 4.25f}));
  fs::remove_all(dir);
}

TEST(ShardedReaderTest, OpensOnlyTheFilesABoxNeedsAndEachOnce) {
  const std::string dir = TempDir("lazy");
  Shards shards = Standard(dir);
  shards.Write();
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(shards.ManifestPath());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->open_files(), 0u);
  // Rows 0..1 of dim 1 lie in rank 0's box only.
  const std::vector<int64_t> offsets = {0, 0, 0}, shape = {3, 2, 6};
  ASSERT_TRUE(reader->ReadBox("cube", offsets, shape).ok());
  EXPECT_EQ(reader->open_files(), 1u);
  ASSERT_TRUE(reader->ReadBox("cube", offsets, shape).ok());
  EXPECT_EQ(reader->open_files(), 1u);
  // "bias" is on ranks 0 and 1: the open file serves it, even though rank 1 is listed too.
  fs::remove(shards.Path(1));
  ASSERT_TRUE(reader->ReadTensor("bias").ok());
  EXPECT_EQ(reader->open_files(), 1u);
  fs::remove_all(dir);
}

TEST(ShardedReaderTest, ConcurrentReadsAgree) {
  const std::string dir = TempDir("threads");
  Shards shards = Standard(dir);
  shards.Write();
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(shards.ManifestPath());
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      absl::StatusOr<HostTensor> cube = reader->ReadTensor(t % 2 ? "cube" : "four");
      ok[t] = cube.ok() && cube->values == Iota(t % 2 ? 72 : 120);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(ok, std::vector<int>(8, 1));
  EXPECT_EQ(reader->open_files(), 3u);
  fs::remove_all(dir);
}

TEST(ShardedReaderTest, HalfPrecisionShardsAreWidened) {
  const std::string dir = TempDir("bf16");
  // Two BF16 halves of a (2, 3) tensor; i + 0.25 for small i is exact in bf16.
  const std::vector<float> full = Iota(6);
  std::vector<std::vector<uint16_t>> bits(2);
  Manifest manifest;
  manifest.world_size = 2;
  ManifestTensor& tensor = manifest.tensors["w"];
  tensor.dtype = SafetensorsDType::kBF16;
  tensor.global_shape = {2, 3};
  for (int rank = 0; rank < 2; ++rank) {
    for (int i = 0; i < 3; ++i) {
      bits[rank].push_back(
          static_cast<uint16_t>(std::bit_cast<uint32_t>(full[rank * 3 + i]) >> 16));
    }
    SafetensorsWriter writer(dir + "/r" + std::to_string(rank) + ".safetensors");
    ASSERT_TRUE(writer
                    .Add(TensorView{"w",
                                    SafetensorsDType::kBF16,
                                    {1, 3},
                                    std::as_bytes(std::span<const uint16_t>(bits[rank]))})
                    .ok());
    absl::StatusOr<SafetensorsWriter::Written> written = writer.Finish();
    ASSERT_TRUE(written.ok()) << written.status();
    const std::string file = "r" + std::to_string(rank) + ".safetensors";
    manifest.files[file] = ShardFileInfo{rank, written->bytes, written->xxh3};
    tensor.shards.push_back({rank, file, "w", {rank, 0}, {1, 3}, written->tensor_xxh3.at("w")});
  }
  ASSERT_TRUE(WriteManifest(DefaultFileSystem(), dir + "/manifest.json", manifest).ok());
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(dir + "/manifest.json");
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<HostTensor> read = reader->ReadTensor("w");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->values, full);
  fs::remove_all(dir);
}

TEST(ShardedReaderTest, AMissingShardFileNamesTheManifestTheFileAndTheTensor) {
  const std::string dir = TempDir("missing");
  Shards shards = Standard(dir);
  shards.Write();
  fs::remove(shards.Path(2));
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(shards.ManifestPath());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const absl::Status status = reader->ReadTensor("cube").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(shards.ManifestPath()), HasSubstr("tensor 'cube'"),
                                     HasSubstr("rank-2.safetensors"), HasSubstr("rank 2")));
  // A box that does not reach rank 2's piece still reads.
  const std::vector<int64_t> offsets = {0, 0, 0}, shape = {3, 4, 4};
  EXPECT_TRUE(reader->ReadBox("cube", offsets, shape).ok());
  fs::remove_all(dir);
}

TEST(ShardedReaderTest, AShardWhoseShapeDisagreesWithTheManifestIsAnError) {
  const std::string dir = TempDir("shape");
  Shards shards = Standard(dir);
  shards.Write();
  // Rank 1's file rewritten with a (3, 2, 3) "cube" where the manifest says (3, 2, 4).
  // Named: the view's bytes must outlive Finish() in Replace.
  const HostTensor cube{{3, 2, 3}, std::vector<float>(18, 1.0f)};
  SafetensorsWriter writer(shards.Path(1));
  ASSERT_TRUE(writer.Add(cube.View("cube")).ok());
  shards.Replace(1, writer);
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(shards.ManifestPath());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const absl::Status status = reader->ReadTensor("cube").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(shards.ManifestPath()), HasSubstr("tensor 'cube'"),
                                     HasSubstr("rank-1.safetensors"),
                                     HasSubstr("has shape [3, 2, 3]"), HasSubstr("[3, 2, 4]")));
  // A tensor the rewritten file no longer has.
  const absl::Status four =
      reader->ReadBox("four", std::vector<int64_t>{0, 0, 0, 3}, std::vector<int64_t>{1, 1, 1, 1})
          .status();
  EXPECT_EQ(four.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(four), AllOf(HasSubstr("tensor 'four'"), HasSubstr("rank-1.safetensors"),
                                   HasSubstr("no tensor 'four'")));
  fs::remove_all(dir);
}

TEST(ShardedReaderTest, ATruncatedShardFileIsAnErrorNamingIt) {
  const std::string dir = TempDir("truncated");
  Shards shards = Standard(dir);
  shards.Write();
  fs::resize_file(shards.Path(0), fs::file_size(shards.Path(0)) - 16);
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(shards.ManifestPath());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const absl::Status status = reader->ReadTensor("cube").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(shards.ManifestPath()), HasSubstr("tensor 'cube'"),
                                     HasSubstr("rank-0.safetensors"), HasSubstr("truncated")));
  fs::remove_all(dir);
}

TEST(ShardedReaderTest, AChangedByteFailsTheChecksumOfThePieceThatHoldsIt) {
  const std::string dir = TempDir("flipped");
  Shards shards = Standard(dir);
  shards.Write();
  // Flip one bit of the last byte of rank 1's file: the data of its last piece.
  shardline::testing::FlipBits(shards.Path(1), -1, 0x10);
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(shards.ManifestPath());
  ASSERT_TRUE(reader.ok()) << reader.status();
  // Rank 1's file holds "cube" [0:3, 2:4, 0:4], "four" [0:1, 0:3, 0:4, 3:5] and "bias": the one
  // laid out last (by element size, then name) is "four".
  const absl::Status status = reader->ReadTensor("four").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(shards.ManifestPath()), HasSubstr("tensor 'four'"),
                                     HasSubstr("rank-1.safetensors"),
                                     HasSubstr("fail their checksum")));
  // The other pieces of the same file are intact and still read.
  EXPECT_TRUE(reader->ReadTensor("cube").ok());
  fs::remove_all(dir);
}

TEST(ShardedReaderTest, AShardWithAnotherDtypeThanTheManifestIsAnError) {
  const std::string dir = TempDir("dtype");
  Shards shards = Standard(dir);
  shards.Write();
  const std::vector<int32_t> ints(7, 1);
  SafetensorsWriter writer(shards.Path(1));
  ASSERT_TRUE(
      writer.Add(TensorView{"bias", SafetensorsDType::kI32, {7}, std::as_bytes(std::span(ints))})
          .ok());
  // Rank 1's replica is read only when rank 0's file is not open yet and it is listed first.
  std::swap(shards.manifest().tensors["bias"].shards[0],
            shards.manifest().tensors["bias"].shards[1]);
  shards.Replace(1, writer);
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(shards.ManifestPath());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const absl::Status status = reader->ReadTensor("bias").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), AllOf(HasSubstr("tensor 'bias'"), HasSubstr("rank-1.safetensors"),
                                     HasSubstr("dtype I32, the manifest says F32")));
  fs::remove_all(dir);
}

TEST(ShardedReaderTest, BadBoxesUnknownTensorsAndManifestHolesAreErrors) {
  const std::string dir = TempDir("boxes");
  Shards shards = Standard(dir);
  shards.Write();
  absl::StatusOr<ShardedReader> reader = ShardedReader::Open(shards.ManifestPath());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_THAT(
      Message(reader->ReadBox("cube", std::vector<int64_t>{0, 3, 0}, std::vector<int64_t>{3, 2, 6})
                  .status()),
      AllOf(HasSubstr("tensor 'cube'"), HasSubstr("leaves the global shape [3, 4, 6]")));
  EXPECT_THAT(
      Message(
          reader->ReadBox("cube", std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 1}).status()),
      HasSubstr("does not have the rank"));
  EXPECT_EQ(reader->ReadTensor("nothing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reader->open_files(), 0u);

  // A hole: WriteManifest refuses one, so the text is written directly.
  shards.manifest().tensors["cube"].shards.pop_back();
  std::ofstream(shards.ManifestPath()) << ManifestToJson(shards.manifest());
  const absl::Status hole = ShardedReader::Open(shards.ManifestPath()).status();
  EXPECT_THAT(Message(hole), AllOf(HasSubstr(shards.ManifestPath()), HasSubstr("tensor 'cube'"),
                                   HasSubstr("cover 60 of 72")));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardline::checkpoint
