// The job history (coordinator/job_history.h): a job's record round-trips with its progress and
// generations; a coordinator taking over a state dir restarts a running elastic job as its next
// generation (cause coordinator_restart) and fails any other running job; a malformed record is
// an error naming where it came from.
#include "coordinator/job_history.h"

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/coordinator_test_jobs.h"

namespace shardline::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::LayOut;
using testing::MakeJob;

constexpr const char* kElastic = "parallel: {dp: 2}\nelastic: {min_actors: 1, max_actors: 2}\n";

Job RunningJob(const std::string& extra, const ManualClock& clock) {
  Job job = MakeJob(extra);
  job.submitted_unix_ms = 1000;
  LayOut(job, {{"a", 0}, {"a", 1}}, clock.Now());
  job.phase = Phase::kRunning;
  job.train.step = 17;
  job.train.loss = 3.25;
  job.train.last_committed_step = 15;
  job.train.committed_here = true;
  job.generations.back().last_step = 17;
  return job;
}

TEST(JobHistoryTest, ARecordRoundTripsWithItsGenerations) {
  ManualClock clock;
  Job job = MakeJob(kElastic);
  job.state = JobState::kSucceeded;
  job.generation = 2;
  GenerationRecord first = testing::FaultEnded(1, FaultKind::kHung, 1, "b", 12, "is stopped");
  first.consequences = {"rank 0 was stopped by the abort"};
  first.steps_lost = 2;
  first.recovery_seconds = 0.5;
  GenerationRecord second;
  second.generation = 2;
  second.ending = Ending::kSucceeded;
  job.generations = {first, second};
  job.train.step = 40;
  auto back = JobFromRecord(JobRecord(job), "job.json", clock.Now(), 2000);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->state, JobState::kSucceeded);
  EXPECT_EQ(back->train.step, 40);
  ASSERT_EQ(back->generations.size(), 2u);
  const GenerationRecord& g = back->generations[0];
  EXPECT_EQ(g.ending, Ending::kFault);
  ASSERT_TRUE(g.cause);
  EXPECT_EQ(g.cause->kind, FaultKind::kHung);
  EXPECT_EQ(g.cause->node, "b");
  EXPECT_EQ(g.consequences, first.consequences);
  EXPECT_EQ(g.steps_lost, 2);
  EXPECT_EQ(g.recovery_seconds, 0.5);
  EXPECT_EQ(back->generations[1].ending, Ending::kSucceeded);
}

TEST(JobHistoryTest, ARunningElasticJobRestartsAsItsNextGeneration) {
  ManualClock clock;
  const Job job = RunningJob(kElastic, clock);
  auto back = JobFromRecord(JobRecord(job), "job.json", clock.Now(), 5000);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->state, JobState::kRunning);
  EXPECT_EQ(back->phase, Phase::kRestarting);
  EXPECT_EQ(back->train.last_committed_step, 15);
  EXPECT_TRUE(back->train.committed_here);  // it resumes from its own newest step
  ASSERT_EQ(back->generations.size(), 1u);
  const GenerationRecord& ended = back->generations.back();
  EXPECT_EQ(ended.ending, Ending::kFault);
  ASSERT_TRUE(ended.cause);
  EXPECT_EQ(ended.cause->kind, FaultKind::kCoordinatorRestart);
  EXPECT_EQ(ended.cause->step, 17);
  EXPECT_EQ(ended.ended_unix_ms, 5000);
  EXPECT_TRUE(back->recovering_since);
  EXPECT_THAT(back->waiting_reason, HasSubstr("the coordinator restarted"));
}

TEST(JobHistoryTest, ARunningFixedJobFailedWithItsCoordinator) {
  ManualClock clock;
  const Job job = RunningJob("parallel: {dp: 2}\n", clock);
  auto back = JobFromRecord(JobRecord(job), "job.json", clock.Now(), 5000);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->state, JobState::kFailed);
  EXPECT_EQ(back->error, "the coordinator restarted while generation 1 was running");
  EXPECT_EQ(back->finished_unix_ms, 5000);
}

TEST(JobHistoryTest, AMalformedRecordIsAnErrorNamingItsFile) {
  ManualClock clock;
  auto missing = JobFromRecord(nlohmann::json{{"id", "x-1"}}, "/state/jobs/x-1.json",
                               clock.Now(), 0);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("/state/jobs/x-1.json"));
  nlohmann::json bad_spec = JobRecord(MakeJob(""));
  bad_spec["spec_yaml"] = "name: [unclosed";
  EXPECT_FALSE(JobFromRecord(bad_spec, "y.json", clock.Now(), 0).ok());
}

TEST(JobHistoryTest, TheStoreKeepsJobsInSubmissionOrder) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("shardline-history-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "jobs");
  ManualClock clock;
  JobHistory history(dir.string());
  Job later = MakeJob("", "t-2");
  later.submitted_unix_ms = 20;
  Job earlier = MakeJob("", "t-1");
  earlier.submitted_unix_ms = 10;
  history.Save(later);
  history.Save(earlier);
  std::ofstream(dir / "jobs" / "garbage.json") << "{not json";
  const std::vector<Job> loaded = history.Load(clock.Now());
  ASSERT_EQ(loaded.size(), 2u);  // the unreadable record is skipped
  EXPECT_EQ(loaded[0].id, "t-1");
  EXPECT_EQ(loaded[1].id, "t-2");
  EXPECT_EQ(loaded[0].state, JobState::kPending);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardline::coordinator
