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

// A serve job keeps what the spec cannot give a coordinator that takes it over: the checkpoint's
// shape read at submit (so `parallel: auto` can plan again) and the address its generation
// listened on (a port 0 resolved: the clients' URL), with its generations and its plan.
TEST(JobHistoryTest, AServeJobKeepsItsModelItsAddressAndItsGenerations) {
  ManualClock clock;
  Job job;
  job.id = "svc-1";
  job.spec_yaml = "name: svc\nkind: serve\ncheckpoint: m\nparallel: auto\n"
                  "listen: 127.0.0.1:0\nelastic: {max_restarts: 3}\n";
  job.spec_dir = job.work_dir = "/tmp";
  auto spec = placement::ParseJobSpec(job.spec_yaml, "test spec", {"/tmp", "/tmp"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  job.spec = *spec;
  job.state = JobState::kRunning;
  job.generation = 2;
  job.serve_listen = "127.0.0.1:41234";
  job.serve_model.layers = 12;
  job.serve_model.heads = 12;
  job.serve_model.d_model = 768;
  job.serve_model.d_ff = 3072;
  job.serve_model.vocab = 50257;
  job.serve_model.max_seq_len = 1024;
  job.serve_model.tied_embeddings = true;
  job.generations = {testing::FaultEnded(1, FaultKind::kActorExit, 1, "a", 0, "killed"),
                     GenerationRecord{.generation = 2}};
  job.spec.parallel.tp = 2;  // as the scheduler plans a serve job
  job.spec.actors = 2;
  job.plan.planned = true;
  job.plan.summary = "parallel: auto: tp 2 x pp 1";
  auto back = JobFromRecord(JobRecord(job), "job.json", clock.Now(), 5000);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->serve_listen, "127.0.0.1:41234");
  EXPECT_EQ(back->serve_model.layers, 12);
  EXPECT_EQ(back->serve_model.heads, 12);
  EXPECT_EQ(back->serve_model.d_model, 768);
  EXPECT_EQ(back->serve_model.d_ff, 3072);
  EXPECT_EQ(back->serve_model.vocab, 50257);
  EXPECT_EQ(back->serve_model.max_seq_len, 1024);
  EXPECT_TRUE(back->serve_model.tied_embeddings);
  // Taken over: the running generation ended by the restart, after the recorded ones.
  EXPECT_EQ(back->state, JobState::kRunning);
  EXPECT_EQ(back->phase, Phase::kRestarting);
  ASSERT_EQ(back->generations.size(), 2u);
  EXPECT_EQ(back->generations[0].ending, Ending::kFault);
  ASSERT_TRUE(back->generations[1].cause);
  EXPECT_EQ(back->generations[1].cause->kind, FaultKind::kCoordinatorRestart);
  // A plan for an elastic `auto` job is made again on the devices that come back.
  EXPECT_FALSE(back->plan.planned);
  // A serve job that ended keeps the plan it ran with.
  job.state = JobState::kSucceeded;
  auto ended = JobFromRecord(JobRecord(job), "job.json", clock.Now(), 5000);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->plan.planned);
  EXPECT_EQ(ended->spec.parallel.tp, 2);
  EXPECT_EQ(ended->spec.actors, 2);
  EXPECT_EQ(ended->plan.summary, "parallel: auto: tp 2 x pp 1");
}

// A `parallel: auto` job's record keeps the schedule and the recomputation the planner chose; a
// record written before they existed loads as 1F1B without recomputation.
TEST(JobHistoryTest, APlannedJobKeepsItsScheduleAndRecomputation) {
  ManualClock clock;
  Job job;
  job.id = "t-2";
  job.spec_yaml =
      "name: t\nkind: train\ndevices: cpu\n"
      "model: {layers: 4, heads: 4, d_model: 32, max_seq_len: 32}\n"
      "data: {synthetic: {seed: 1, bytes: 64KiB}}\n"
      "steps: 40\nbatch: 8\nseq_len: 32\nparallel: auto\n";
  job.spec_dir = job.work_dir = "/tmp";
  auto spec = placement::ParseJobSpec(job.spec_yaml, "test spec", {"/tmp", "/tmp"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  job.spec = *spec;
  placement::ParallelSpec plan;
  plan.pp = 2;
  plan.micro_batch = 2;  // 4 micro-batches: a multiple of pp, as interleaving needs
  plan.schedule = placement::PipelineScheduleKind::kInterleaved;
  plan.virtual_stages = 2;
  plan.recompute = placement::RecomputeMode::kSelective;
  ASSERT_TRUE(placement::ApplyPlannedLayout(job.spec, plan).ok());
  job.plan.planned = true;
  job.state = JobState::kSucceeded;
  const nlohmann::json record = JobRecord(job);
  EXPECT_EQ(record["plan"]["schedule"], "interleaved");
  EXPECT_EQ(record["plan"]["virtual_stages"], 2);
  EXPECT_EQ(record["plan"]["recompute"], "selective");
  auto back = JobFromRecord(record, "job.json", clock.Now(), 5000);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->plan.planned);
  EXPECT_EQ(back->spec.parallel.pp, 2);
  EXPECT_EQ(back->spec.parallel.schedule, placement::PipelineScheduleKind::kInterleaved);
  EXPECT_EQ(back->spec.parallel.virtual_stages, 2);
  EXPECT_EQ(back->spec.parallel.recompute, placement::RecomputeMode::kSelective);

  // From before the fields: 1F1B, one chunk, no recomputation.
  nlohmann::json old = record;
  for (const char* key : {"schedule", "virtual_stages", "recompute"}) old["plan"].erase(key);
  back = JobFromRecord(old, "old.json", clock.Now(), 5000);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->plan.planned);
  EXPECT_EQ(back->spec.parallel.pp, 2);
  EXPECT_EQ(back->spec.parallel.schedule, placement::PipelineScheduleKind::k1F1B);
  EXPECT_EQ(back->spec.parallel.virtual_stages, 1);
  EXPECT_EQ(back->spec.parallel.recompute, placement::RecomputeMode::kNone);

  // A spelling no version wrote is a malformed record, named.
  nlohmann::json bad = record;
  bad["plan"]["recompute"] = "most";
  auto refused = JobFromRecord(bad, "/state/jobs/t-2.json", clock.Now(), 5000);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("/state/jobs/t-2.json: plan.recompute: unknown recompute mode \"most\""));
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
