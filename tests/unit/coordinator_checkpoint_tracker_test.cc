// The checkpoint tracker (coordinator/checkpoint_tracker.h): a step is committed once every rank
// of the generation has saved its shard, a shard in another folder, of a committed step or past
// the job's steps is refused, ranks training on different data fail the job, and the commit
// writes the manifest and `latest` (in a temporary folder, through the real file system).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/layout.h"
#include "checkpoint/memory_step.h"
#include "coordinator/checkpoint_tracker.h"
#include "tests/unit/coordinator_test_jobs.h"

namespace shardline::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::LayOut;
using testing::MakeJob;

// Rank `rank`'s report of its half of a 4-float tensor "w" at `step`, saved into `dir` as `file`
// of `bytes`, trained on 1000 tokens of checksum `data_xxh3`: the part disk and memory shards
// share.
ShardReport HalfOfW(int rank, int64_t step, std::string dir, std::string file, uint64_t bytes,
                    uint64_t data_xxh3 = 7) {
  ShardReport report;
  report.shard.rank = rank;
  report.step = static_cast<uint64_t>(step);
  report.dir = std::move(dir);
  report.shard.file = std::move(file);
  report.shard.bytes = bytes;
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
    return HalfOfW(rank, step, dir, file, 8, data_xxh3);
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

// The memory tier's bookkeeping: memory steps (checkpoint.memory_interval) committed in memory
// once every rank reported, with the nodes holding each file; the choice of a memory step for a
// new generation from where its ranks are; buddies on other nodes; what submit refuses.
class MemoryTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_ = MakeJob("parallel: {dp: 2}\ncheckpoint: {memory_interval: 1, memory_replicas: 1}\n");
    ManualClock clock;
    LayOut(job_, {{"a", 0}, {"b", 0}}, clock.Now());
  }

  // Rank `rank`'s half of a 4-float tensor "w", as its memory step report says it.
  ShardReport Shard(int rank, int64_t step, uint32_t generation = 1) {
    return HalfOfW(
        rank, step,
        job_.id + "/g" + std::to_string(generation) + "/" + checkpoint::StepDirName(step),
        checkpoint::ShardFileName(rank), 100 + rank);
  }

  // Both ranks' step `step`, each holding the other's replica.
  void CommitBoth(int64_t step) {
    auto first = AddMemoryShard(job_, Shard(0, step), "a", {1});
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_FALSE(first->complete);
    auto second = AddMemoryShard(job_, Shard(1, step), "b", {0});
    ASSERT_TRUE(second.ok()) << second.status();
    ASSERT_TRUE(second->complete);
    ASSERT_TRUE(CommitMemoryStep(job_, step).ok());
  }

  Job job_;
};

TEST_F(MemoryTierTest, AMemoryStepIsCommittedOnceEveryRankReportedWithTheNodesHoldingEachFile) {
  CommitBoth(3);
  ASSERT_TRUE(job_.train.memory_step.has_value());
  const TrainRecord::MemoryStep& step = *job_.train.memory_step;
  EXPECT_EQ(step.manifest.step, 3);
  EXPECT_EQ(step.generation, 1u);
  // The writer's node first, then the buddy's copy.
  EXPECT_EQ(step.holders.at("rank-00000.safetensors"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(step.holders.at("rank-00001.safetensors"), (std::vector<std::string>{"b", "a"}));
  // The disk layer is untouched: nothing committed there.
  EXPECT_EQ(job_.train.last_committed_step, -1);
  // 3 steps kept of the files on the fullest node (both files, 100 + 101 bytes).
  EXPECT_EQ(MemoryStoreBytes(step), 3u * 201u);
}

TEST_F(MemoryTierTest, ReportsThatDoNotBelongToTheStepAreRefusedAndAddNothing) {
  CommitBoth(3);
  // Of a committed step, of another generation's folder, holding its own replica, past the job.
  auto old = AddMemoryShard(job_, Shard(0, 3), "a", {});
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  auto other_generation = AddMemoryShard(job_, Shard(0, 4, /*generation=*/2), "a", {});
  EXPECT_EQ(other_generation.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other_generation.status().message(), HasSubstr("the step's folder is t-1/g1/"));
  auto self = AddMemoryShard(job_, Shard(0, 4), "a", {0});
  EXPECT_THAT(self.status().message(), HasSubstr("holds a replica of rank 0"));
  auto past = AddMemoryShard(job_, Shard(0, 41), "a", {});
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(job_.train.memory_saving.empty());
  // Another token stream fails the job.
  ShardReport other_data = Shard(0, 4);
  other_data.data.xxh3 = 8;
  auto data = AddMemoryShard(job_, other_data, "a", {});
  ASSERT_TRUE(data.ok());
  EXPECT_THAT(data->job_error, HasSubstr("other ranks on 1000"));
}

TEST_F(MemoryTierTest, AStepOneRankNeverReportedIsNotUsedTheNewestCommittedOneIs) {
  CommitBoth(3);
  // Rank 1 died inside step 4 (its optimizer step, say): only rank 0 reported it.
  ASSERT_TRUE(AddMemoryShard(job_, Shard(0, 4), "a", {1}).ok());
  EXPECT_EQ(job_.train.memory_step->manifest.step, 3);
  const MemoryChoice choice = ChooseMemoryResume(job_, {"a", "b"});
  ASSERT_TRUE(choice.used) << choice.note;
  EXPECT_EQ(choice.kind, "survivors");
  EXPECT_EQ(job_.train.resumed_step, 3);
  auto resume = checkpoint::ParseMemoryResume(job_.train.memory_resume, 2, "test");
  ASSERT_TRUE(resume.ok()) << resume.status();
  EXPECT_EQ(resume->manifest.step, 3);
  ASSERT_EQ(resume->sources.size(), 2u);
  EXPECT_EQ(resume->sources[0].rank, 0);  // rank-00000 from node a
  EXPECT_EQ(resume->sources[1].rank, 1);  // rank-00001 from node b
  // The half-reported step is forgotten.
  EXPECT_TRUE(job_.train.memory_saving.empty());
}

TEST_F(MemoryTierTest, ALostNodesFilesComeFromTheReplicaAndWithoutOneFromDiskSayingWhy) {
  CommitBoth(3);
  // Node b lost; the new generation on a and c: b's file comes from its copy on a.
  MemoryChoice choice = ChooseMemoryResume(job_, {"a", "c"});
  ASSERT_TRUE(choice.used) << choice.note;
  EXPECT_EQ(choice.kind, "memory replica");
  auto resume = checkpoint::ParseMemoryResume(job_.train.memory_resume, 2, "test");
  ASSERT_TRUE(resume.ok()) << resume.status();
  EXPECT_EQ(resume->sources[1].file, "rank-00001.safetensors");
  EXPECT_EQ(resume->sources[1].rank, 0);  // the rank on node a sends it

  // Without replicas a lost node's file is out of reach: the disk's step, and the reason.
  Job alone = MakeJob("parallel: {dp: 2}\ncheckpoint: {memory_interval: 1}\n");
  ManualClock clock;
  LayOut(alone, {{"a", 0}, {"b", 0}}, clock.Now());
  ShardReport zero = Shard(0, 5), one = Shard(1, 5);
  ASSERT_TRUE(AddMemoryShard(alone, zero, "a", {}).ok());
  ASSERT_TRUE(AddMemoryShard(alone, one, "b", {}).ok());
  ASSERT_TRUE(CommitMemoryStep(alone, 5).ok());
  alone.train.resumed_step = 2;  // the disk's newest
  choice = ChooseMemoryResume(alone, {"a", "c"});
  EXPECT_FALSE(choice.used);
  EXPECT_EQ(choice.note,
            "memory step 5 was not used: rank-00001.safetensors was held only on b, where this "
            "generation has no rank, and the files its nodes hold miss boxes of it");
  EXPECT_TRUE(alone.train.memory_resume.empty());
  EXPECT_EQ(alone.train.resumed_step, 2);
  EXPECT_FALSE(alone.train.memory_step.has_value());
}

TEST_F(MemoryTierTest, DataParallelRanksHoldingTheWholeStateCoverALostNodeWithoutReplicas) {
  // Without ZeRO each data-parallel rank's memory step holds all it trains with: the same boxes.
  Job job = MakeJob("parallel: {dp: 2}\ncheckpoint: {memory_interval: 1}\n");
  ManualClock clock;
  LayOut(job, {{"a", 0}, {"b", 0}}, clock.Now());
  for (int rank = 0; rank < 2; ++rank) {
    ShardReport whole = Shard(rank, 6);
    whole.shard.pieces[0].offsets = {0};
    whole.shard.pieces[0].shape = {4};
    auto added = AddMemoryShard(job, whole, rank == 0 ? "a" : "b", {});
    ASSERT_TRUE(added.ok()) << added.status();
  }
  ASSERT_TRUE(CommitMemoryStep(job, 6).ok());
  const MemoryChoice choice = ChooseMemoryResume(job, {"a", "c"});
  ASSERT_TRUE(choice.used) << choice.note;
  EXPECT_EQ(choice.kind, "survivors");
  auto resume = checkpoint::ParseMemoryResume(job.train.memory_resume, 2, "test");
  ASSERT_TRUE(resume.ok()) << resume.status();
  // Only the reachable file, and the manifest without the lost one.
  ASSERT_EQ(resume->sources.size(), 1u);
  EXPECT_EQ(resume->sources[0].file, "rank-00000.safetensors");
  EXPECT_EQ(resume->manifest.files.size(), 1u);
  EXPECT_EQ(resume->manifest.tensors.at("w").shards.size(), 1u);
}

TEST_F(MemoryTierTest, ADiskStepAsNewAsTheMemoryStepIsKept) {
  CommitBoth(3);
  job_.train.resumed_step = 3;
  const MemoryChoice choice = ChooseMemoryResume(job_, {"a", "b"});
  EXPECT_FALSE(choice.used);
  EXPECT_TRUE(choice.note.empty());
  EXPECT_TRUE(job_.train.memory_resume.empty());
}

TEST(MemoryBuddiesTest, EachRanksCopyGoesToTheNextNode) {
  // a: ranks 0, 1; b: rank 2; c: rank 3.
  EXPECT_EQ(MemoryBuddies({"a", "a", "b", "c"}), (std::vector<uint32_t>{2, 2, 3, 0}));
  EXPECT_EQ(MemoryBuddies({"a", "b", "a", "b"}), (std::vector<uint32_t>{1, 0, 3, 2}));
  EXPECT_TRUE(MemoryBuddies({"a", "a"}).empty());
}

TEST(MemoryTierSubmitTest, ReplicasOnOneNodeAndABudgetTheNodesCannotHoldAreRefused) {
  Membership membership(std::chrono::milliseconds(1000));
  ManualClock clock;
  ASSERT_TRUE(membership.Register(testing::CpuNode("a", 2), clock.Now()).ok());
  const Job replicas = MakeJob(
      "parallel: {dp: 2}\n"
      "checkpoint: {memory_interval: 1, memory_replicas: 1}\n");
  const absl::Status one_node = CheckMemoryTier(replicas.spec, membership);
  EXPECT_EQ(one_node.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(one_node.message(),
              HasSubstr("checkpoint.memory_replicas: 1 needs a second node to hold each shard's "
                        "copy, and the cluster has 1 alive node with cpu devices"));
  ASSERT_TRUE(membership.Register(testing::CpuNode("b", 2), clock.Now()).ok());
  EXPECT_TRUE(CheckMemoryTier(replicas.spec, membership).ok());

  // d_model 8192 × 48 layers: some 39 G parameters, 470 GB of state over 2 ranks, far past the
  // 8 GiB a device's share is here.
  Job big = MakeJob("parallel: {dp: 2}\ncheckpoint: {memory_interval: 1}\n");
  big.spec.train.model.d_model = 8192;
  big.spec.train.model.layers = 48;
  big.spec.train.model.heads = 64;
  const absl::Status budget = CheckMemoryTier(big.spec, membership);
  EXPECT_EQ(budget.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(budget.message(), HasSubstr("checkpoint.memory_interval: the memory tier needs "));
  EXPECT_THAT(budget.message(), HasSubstr("more than a device's share of its node's memory"));
}

}  // namespace
}  // namespace shardline::coordinator
