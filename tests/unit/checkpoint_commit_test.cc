// The checkpoint layer's commit path without a model: the names of a checkpoint folder, boxes of a
// flat range (what a ZeRO-partitioned rank stores), assembling the ranks' shards into a manifest
// (agreement, coverage), committing a step (files on disk, manifest, `latest`) and retention.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "checkpoint/box.h"
#include "checkpoint/commit.h"
#include "checkpoint/layout.h"
#include "checkpoint/resume.h"
#include "checkpoint/safetensors_writer.h"
#include "common/status_macros.h"

namespace shardline::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

std::string TempDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("shardline-commit-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// The row-major flat index of every element of `box` inside a tensor of `shape`.
std::vector<int64_t> FlatIndices(const std::vector<int64_t>& shape, const Box& box) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  std::vector<int64_t> out;
  const int64_t count = static_cast<int64_t>(*NumElements(box.shape));
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t n = 0; n < count; ++n) {
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat += (box.offsets[d] + index[d]) * stride[d];
    out.push_back(flat);
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < box.shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

TEST(SplitFlatRangeTest, EveryRangeOfSmallShapesIsExactlyItsBoxesInOrder) {
  const std::vector<std::vector<int64_t>> shapes = {{7}, {3, 4}, {2, 3, 4}, {3, 1, 2, 5}, {1, 1}};
  int ranges = 0;
  for (const std::vector<int64_t>& shape : shapes) {
    const int64_t count = static_cast<int64_t>(*NumElements(shape));
    for (int64_t begin = 0; begin <= count; ++begin) {
      for (int64_t end = begin; end <= count; ++end) {
        const std::vector<Box> boxes = SplitFlatRange(shape, begin, end);
        std::vector<int64_t> covered;
        for (const Box& box : boxes) {
          ASSERT_TRUE(CheckBox(shape, box.offsets, box.shape, "box").ok());
          ASSERT_GT(*NumElements(box.shape), 0u) << "an empty box";
          const std::vector<int64_t> flat = FlatIndices(shape, box);
          // Each box is one contiguous run of the row-major order.
          for (size_t i = 1; i < flat.size(); ++i) ASSERT_EQ(flat[i], flat[i - 1] + 1);
          covered.insert(covered.end(), flat.begin(), flat.end());
        }
        std::vector<int64_t> want(static_cast<size_t>(end - begin));
        std::iota(want.begin(), want.end(), begin);
        ASSERT_EQ(covered, want) << "[" << begin << ", " << end << ") of "
                                 << ShapeString(shape);
        EXPECT_LE(boxes.size(), 2 * shape.size() - 1);
        ++ranges;
      }
    }
  }
  EXPECT_GT(ranges, 500);
  // A scalar is one box of rank 0, or none.
  EXPECT_EQ(SplitFlatRange({}, 0, 1).size(), 1u);
  EXPECT_TRUE(SplitFlatRange({}, 0, 0).empty());
}

TEST(LayoutTest, NamesAndTheirInverses) {
  EXPECT_EQ(StepDirName(42), "step-00000042");
  EXPECT_EQ(StepDirName(123456789), "step-123456789");
  EXPECT_EQ(ParseStepDirName("step-00000042"), 42);
  EXPECT_EQ(ParseStepDirName("step-123456789"), 123456789);
  for (const char* not_a_step : {"step-", "step-00000042.corrupt", "step-4x", "latest", "step-+4",
                                 "Step-1", "step--1"}) {
    EXPECT_FALSE(ParseStepDirName(not_a_step).has_value()) << not_a_step;
  }
  EXPECT_EQ(ShardFileName(3), "rank-00003.safetensors");
  EXPECT_EQ(ManifestPath("/ckpt", 7), "/ckpt/step-00000007/manifest.json");
}

TEST(LayoutTest, LatestAndTheStepFoldersOfADir) {
  const std::string dir = TempDir("layout");
  EXPECT_FALSE(ReadLatest(dir)->has_value());
  for (const char* name : {"step-00000002", "step-00000010", "step-00000004", "step-00000006",
                           "step-00000008.corrupt", "other"}) {
    fs::create_directories(fs::path(dir) / name);
  }
  std::ofstream(fs::path(dir) / "step-00000002" / "manifest.json") << "{}";
  std::ofstream(fs::path(dir) / "step-00000010" / "manifest.json") << "{}";
  absl::StatusOr<std::vector<StepFolder>> folders = ListStepFolders(dir);
  ASSERT_TRUE(folders.ok()) << folders.status();
  std::vector<int64_t> steps;
  std::vector<bool> committed;
  for (const StepFolder& folder : *folders) {
    steps.push_back(folder.step);
    committed.push_back(folder.committed);
  }
  EXPECT_THAT(steps, ElementsAre(2, 4, 6, 10));
  EXPECT_THAT(committed, ElementsAre(true, false, false, true));
  EXPECT_THAT(*CommittedSteps(dir), ElementsAre(2, 10));
  ASSERT_TRUE(SetLatest(DefaultFileSystem(), dir, 10).ok());
  EXPECT_EQ(*ReadLatest(dir), 10);
  std::ofstream(fs::path(dir) / "latest") << "garbage\n";
  EXPECT_THAT(Message(ReadLatest(dir).status()),
              AllOf(HasSubstr(dir + "/latest"), HasSubstr("\"garbage\"")));
  EXPECT_TRUE(ListStepFolders(dir + "/missing")->empty());
  fs::remove_all(dir);
}

// A rank's shard of a (4, 6) "w" split by rows between 2 ranks, and a replicated "b" (6).
SavedShard RankShard(int64_t rank) {
  SavedShard shard;
  shard.rank = rank;
  shard.file = ShardFileName(rank);
  shard.pieces.push_back({"w", "w", SafetensorsDType::kF32, {4, 6}, {2 * rank, 0}, {2, 6}, 11});
  shard.pieces.push_back({"b", "b", SafetensorsDType::kF32, {6}, {0}, {6}, 12});
  return shard;
}

StepHeader Header(int64_t step) {
  StepHeader header;
  header.step = step;
  header.world_size = 2;
  header.metadata = {{"format", "shardline"}};
  header.train.seed = 5;
  return header;
}

TEST(StepAssemblyTest, TheRanksShardsMakeAManifest) {
  StepAssembly assembly;
  ASSERT_TRUE(assembly.Add(RankShard(0)).ok());
  EXPECT_EQ(assembly.Add(RankShard(0)).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(assembly.Add(RankShard(1)).ok());
  // A rank that holds only replicas reports no file.
  SavedShard empty;
  empty.rank = 2;
  ASSERT_TRUE(assembly.Add(empty).ok());
  StepHeader header = Header(9);
  header.world_size = 3;
  absl::StatusOr<Manifest> manifest = assembly.Build(header);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 9);
  EXPECT_EQ(manifest->train.seed, 5u);
  EXPECT_EQ(manifest->files.size(), 2u);
  EXPECT_EQ(manifest->tensors.at("w").shards.size(), 2u);
  EXPECT_EQ(manifest->tensors.at("w").shards[1].offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(manifest->tensors.at("b").shards.size(), 2u);  // replicas
}

TEST(StepAssemblyTest, ShardsThatDisagreeOrLeaveAHoleAreRefusedNamingRankAndTensor) {
  StepAssembly assembly;
  ASSERT_TRUE(assembly.Add(RankShard(0)).ok());
  SavedShard other_shape = RankShard(1);
  other_shape.pieces[0].global_shape = {5, 6};
  other_shape.pieces[0].shape = {3, 6};
  EXPECT_THAT(Message(assembly.Add(other_shape)),
              AllOf(HasSubstr("rank 1"), HasSubstr("tensor 'w'"), HasSubstr("[5, 6]"),
                    HasSubstr("disagrees with rank 0's [4, 6]")));
  EXPECT_FALSE(assembly.Has(1)) << "nothing is added on error";
  SavedShard outside = RankShard(1);
  outside.pieces[0].offsets = {3, 0};
  EXPECT_THAT(Message(assembly.Add(outside)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("does not fit in the global shape")));
  SavedShard escape = RankShard(1);
  escape.file = "../rank-00001.safetensors";
  EXPECT_THAT(Message(assembly.Add(escape)), HasSubstr("a name inside the step's folder"));
  SavedShard twice = RankShard(1);
  twice.pieces.push_back(twice.pieces[0]);
  EXPECT_THAT(Message(assembly.Add(twice)), HasSubstr("listed twice"));
  // Only rank 0's rows of w: a hole the manifest must not hide.
  EXPECT_THAT(Message(assembly.Build(Header(9)).status()),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("cover 12 of 24")));
}

// Writes the rank files of RankShard(0) and (1) into DIR's step folder and returns the manifest
// that commits them.
Manifest WriteStep(const std::string& dir, int64_t step) {
  StepAssembly assembly;
  for (int64_t rank = 0; rank < 2; ++rank) {
    // Named: a view's bytes must outlive Finish(), and a temporary HostTensor's die with the
    // statement that adds them.
    const HostTensor w{{2, 6}, std::vector<float>(12, static_cast<float>(rank))};
    const HostTensor b{{6}, std::vector<float>(6, 1.0f)};
    fs::create_directories(StepDir(dir, step));
    SafetensorsWriter writer((fs::path(StepDir(dir, step)) / ShardFileName(rank)).string());
    EXPECT_TRUE(writer.Add(w.View("w")).ok());
    EXPECT_TRUE(writer.Add(b.View("b")).ok());
    absl::StatusOr<SafetensorsWriter::Written> written = writer.Finish();
    EXPECT_TRUE(written.ok());
    SavedShard shard = RankShard(rank);
    shard.bytes = written->bytes;
    shard.xxh3 = written->xxh3;
    for (SavedPiece& piece : shard.pieces) piece.xxh3 = written->tensor_xxh3.at(piece.tensor);
    EXPECT_TRUE(assembly.Add(shard).ok());
  }
  absl::StatusOr<Manifest> manifest = assembly.Build(Header(step));
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return *manifest;
}

TEST(CommitStepTest, WritesTheManifestThenLatestWhichNeverGoesBack) {
  const std::string dir = TempDir("commit");
  ASSERT_TRUE(CommitStep(DefaultFileSystem(), dir, WriteStep(dir, 4)).ok());
  EXPECT_TRUE(fs::exists(ManifestPath(dir, 4)));
  EXPECT_EQ(*ReadLatest(dir), 4);
  ASSERT_TRUE(CommitStep(DefaultFileSystem(), dir, WriteStep(dir, 8)).ok());
  EXPECT_EQ(*ReadLatest(dir), 8);
  // A late commit of an older step gets its manifest, but `latest` stays at the newest.
  ASSERT_TRUE(CommitStep(DefaultFileSystem(), dir, WriteStep(dir, 6)).ok());
  EXPECT_TRUE(fs::exists(ManifestPath(dir, 6)));
  EXPECT_EQ(*ReadLatest(dir), 8);
  EXPECT_EQ(*ResolveCheckpoint(dir), ManifestPath(dir, 8));
  fs::remove_all(dir);
}

TEST(CommitStepTest, AReportedFileThatIsNotThereOrOfAnotherSizeIsNotCommitted) {
  const std::string dir = TempDir("commit-missing");
  Manifest missing = WriteStep(dir, 3);
  fs::remove(fs::path(StepDir(dir, 3)) / ShardFileName(1));
  EXPECT_THAT(Message(CommitStep(DefaultFileSystem(), dir, missing)),
              AllOf(HasSubstr("checkpoint step 3"), HasSubstr("rank 1's file"),
                    HasSubstr("rank-00001.safetensors"), HasSubstr("is not there")));
  Manifest resized = WriteStep(dir, 5);
  fs::resize_file(fs::path(StepDir(dir, 5)) / ShardFileName(0), 10);
  EXPECT_THAT(Message(CommitStep(DefaultFileSystem(), dir, resized)),
              AllOf(HasSubstr("rank 0's file"), HasSubstr("has 10 bytes")));
  EXPECT_TRUE(CommittedSteps(dir)->empty());
  EXPECT_FALSE(ReadLatest(dir)->has_value());
  fs::remove_all(dir);
}

TEST(RetentionTest, KeepsTheNewestAndProtectedStepsAndClearsInterruptedSaves) {
  const std::string dir = TempDir("retention");
  for (const int64_t step : {2, 4, 6, 8, 10}) {
    ASSERT_TRUE(CommitStep(DefaultFileSystem(), dir, WriteStep(dir, step)).ok());
  }
  fs::create_directories(StepDir(dir, 5));   // an interrupted save, older than the newest
  fs::create_directories(StepDir(dir, 12));  // a save in progress
  const int64_t protect[] = {4};
  absl::StatusOr<std::vector<std::string>> removed =
      ApplyRetention(DefaultFileSystem(), dir, 2, protect);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(StepDir(dir, 2), StepDir(dir, 5), StepDir(dir, 6)));
  EXPECT_THAT(*CommittedSteps(dir), ElementsAre(4, 8, 10));
  EXPECT_TRUE(fs::exists(StepDir(dir, 12)));
  EXPECT_EQ(*ReadLatest(dir), 10);
  // keep 0 keeps every committed step.
  ASSERT_TRUE(ApplyRetention(DefaultFileSystem(), dir, 0).ok());
  EXPECT_THAT(*CommittedSteps(dir), ElementsAre(4, 8, 10));
  fs::remove_all(dir);
}

// A file system whose RemoveAll fails, as it does while another process still adds files.
class BusyFolders final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAtomicFile(const std::string& path) override {
    return DefaultFileSystem().NewAtomicFile(path);
  }
  absl::Status CreateDirectories(const std::string& path) override {
    return DefaultFileSystem().CreateDirectories(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return DefaultFileSystem().Rename(from, to);
  }
  absl::Status RemoveAll(const std::string& path) override {
    return absl::InternalError("cannot remove " + path + ": Directory not empty");
  }
};

TEST(PrepareForResumeTest, AnInterruptedSaveThatCannotBeRemovedIsLeftAndSaidSo) {
  const std::string dir = TempDir("prepare-busy");
  ASSERT_TRUE(CommitStep(DefaultFileSystem(), dir, WriteStep(dir, 2)).ok());
  fs::create_directories(StepDir(dir, 4));  // a save a crashed run's writer still adds to
  ResumeDecision decision;
  decision.step = 2;
  BusyFolders busy;
  absl::StatusOr<std::vector<std::string>> done = PrepareForResume(busy, dir, decision);
  ASSERT_TRUE(done.ok()) << done.status();  // the run resumes all the same
  EXPECT_THAT(*done, ElementsAre(AllOf(HasSubstr("left " + StepDir(dir, 4)),
                                       HasSubstr("Directory not empty"))));
  EXPECT_TRUE(fs::exists(StepDir(dir, 4)));
  done = PrepareForResume(DefaultFileSystem(), dir, decision);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_THAT(*done, ElementsAre(HasSubstr("removed " + StepDir(dir, 4))));
  fs::remove_all(dir);
}

TEST(RetentionTest, ClearsTheTemporaryOfALatestWhoseWriterDied) {
  const std::string dir = TempDir("retention-latest");
  ASSERT_TRUE(CommitStep(DefaultFileSystem(), dir, WriteStep(dir, 2)).ok());
  // A writer killed between writing its temporary and renaming it: a child that has exited.
  const pid_t dead = fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) _exit(0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const std::string stale = dir + "/latest.tmp." + std::to_string(dead);
  const std::string live = dir + "/latest.tmp." + std::to_string(getpid());
  std::ofstream(stale) << "step-0000000";
  std::ofstream(live) << "step-0000000";
  absl::StatusOr<std::vector<std::string>> removed = ApplyRetention(DefaultFileSystem(), dir, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(stale));
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));  // its writer (this process) may still rename it
  EXPECT_EQ(*ReadLatest(dir), 2);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardline::checkpoint
