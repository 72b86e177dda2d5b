// The checkpoint tracker (coordinator/checkpoint_tracker.h): a step is committed once every rank
// of the generation has saved its shard, a shard in another folder, of a committed step or past
// the job's steps is refused, ranks training on different data fail the job, and the commit
// writes the manifest and `latest` (in a temporary folder, through the real file system).
#include "coordinator/checkpoint_tracker.h"

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "checkpoint/layout.h"
#include "tests/unit/coordinator_test_jobs.h"

namespace shardline::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::LayOut;
using testing::MakeJob;

class CheckpointTrackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("shardline-ckpt-tracker-" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    job_ = MakeJob("parallel: {dp: 2}\ncheckpoint: {dir: ckpt, interval: 5}\n", "t-1",
                   root_.string());
    ManualClock clock;
    LayOut(job_, {{"a", 0}, {"a", 1}}, clock.Now());
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Rank `rank`'s half of a 4-float tensor "w", written to its file in the step's folder.
  ShardReport Shard(int rank, int64_t step, uint64_t data_xxh3 = 7) {
    const std::string dir = checkpoint::StepDir(job_.train.saving_dir, step);
    std::filesystem::create_directories(dir);
    const std::string file = "rank-" + std::to_string(rank) + ".safetensors";
    std::ofstream(dir + "/" + file) << std::string(8, 'x');
    ShardReport report;
    report.shard.rank = rank;
    report.step = static_cast<uint64_t>(step);
    report.dir = dir;
    report.shard.file = file;
    report.shard.bytes = 8;
    report.shard.xxh3 = 1;
    checkpoint::SavedPiece piece;
    piece.name = piece.tensor = "w";
    piece.global_shape = {4};
    piece.offsets = {2 * rank};
    piece.shape = {2};
    report.shard.pieces.push_back(piece);
    report.data.tokens = 1000;
    report.data.xxh3 = data_xxh3;
    return report;
  }

  std::filesystem::path root_;
  Job job_;
};

TEST_F(CheckpointTrackerTest, AStepIsCommittedOnceEveryRankSavedIt) {
  auto first = AddShard(job_, Shard(0, 5));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->complete);
  auto second = AddShard(job_, Shard(1, 5));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->complete);
  ASSERT_TRUE(CommitStep(job_, 5, checkpoint::DefaultFileSystem()).ok());
  EXPECT_EQ(job_.train.last_committed_step, 5);
  EXPECT_TRUE(job_.train.committed_here);
  EXPECT_TRUE(job_.train.saving.empty());
  auto latest = checkpoint::ReadLatest(job_.train.saving_dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 5);
  EXPECT_TRUE(std::filesystem::exists(checkpoint::StepDir(job_.train.saving_dir, 5) +
                                      "/manifest.json"));
  // A committed step cannot be saved again.
  auto again = AddShard(job_, Shard(0, 5));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("step 5 is already committed"));
}

TEST_F(CheckpointTrackerTest, ShardsOutsideTheJobsStepsOrFolderAreRefused) {
  ShardReport elsewhere = Shard(0, 10);
  elsewhere.dir = "/tmp/not-the-spec-dir/step-00000010";
  auto moved = AddShard(job_, elsewhere);
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(moved.status().message(), HasSubstr("but the step's folder is"));
  auto late = AddShard(job_, Shard(0, 41));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(late.status().message(), HasSubstr("the job has only 40 steps"));
  EXPECT_TRUE(job_.train.saving.empty());  // nothing was added
}

TEST_F(CheckpointTrackerTest, RanksOnDifferentDataFailTheJob) {
  ASSERT_TRUE(AddShard(job_, Shard(0, 5, 7)).ok());
  auto other = AddShard(job_, Shard(1, 5, 8));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE(other->complete);
  EXPECT_THAT(other->job_error, HasSubstr("rank 1, step 5: the rank trains on 1000 tokens"));
}

TEST_F(CheckpointTrackerTest, ShardsThatDoNotMakeACheckpointAreNotCommitted) {
  ASSERT_TRUE(AddShard(job_, Shard(0, 5)).ok());
  ShardReport overlap = Shard(1, 5);
  overlap.shard.pieces[0].offsets = {0};  // the same half again: the other half is a hole
  auto second = AddShard(job_, overlap);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(second->complete);
  const absl::Status status = CommitStep(job_, 5, checkpoint::DefaultFileSystem());
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("checkpoint step 5 could not be committed"));
  EXPECT_EQ(job_.train.last_committed_step, -1);
  auto latest = checkpoint::ReadLatest(job_.train.saving_dir);
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(*latest);
}

}  // namespace
}  // namespace shardline::coordinator
