// A train job's progress (coordinator/progress.h): the slowest rank's split stands for a step,
// the last rank's loss wins, logged steps are tracked apart, the watchdog is fed, the
// generation's newest step kept, and a restarted job's first step ends its recovery, timed on a
// manual clock.
#include "coordinator/progress.h"

#include <cmath>

#include <gtest/gtest.h>

#include "tests/unit/coordinator_test_jobs.h"

namespace shardline::coordinator {
namespace {

using namespace std::chrono_literals;
using testing::LayOut;
using testing::MakeJob;

StepSample Sample(int64_t step, double loss, double compute, bool logged = false) {
  StepSample sample;
  sample.step = step;
  sample.loss = loss;
  sample.compute_seconds = compute;
  sample.tokens_per_second = 100 / compute;
  sample.logged = logged;
  return sample;
}

TEST(ProgressTest, TheSlowestRankAndTheLastRanksLossStandForAStep) {
  ManualClock clock;
  Job job = MakeJob("parallel: {pp: 2}\n");
  LayOut(job, {{"a", 0}, {"a", 1}}, clock.Now());
  const double nan = std::nan("");
  EXPECT_FALSE(RecordStep(job, 0, Sample(1, nan, 0.5), clock.Now()));
  EXPECT_TRUE(std::isnan(job.train.loss));  // the first stage has no loss
  EXPECT_EQ(job.train.compute_seconds, 0.5);
  RecordStep(job, 1, Sample(1, 4.25, 0.25), clock.Now());
  EXPECT_EQ(job.train.loss, 4.25);
  EXPECT_EQ(job.train.compute_seconds, 0.5);  // rank 0 was slower
  EXPECT_EQ(job.train.step, 1);
  EXPECT_EQ(job.train.logged_step, 0);
  RecordStep(job, 1, Sample(5, 3.5, 0.25, true), clock.Now());
  EXPECT_EQ(job.train.logged_step, 5);
  EXPECT_EQ(job.generations.back().last_step, 5);
  // A late report of an older step does not move the job back.
  RecordStep(job, 0, Sample(2, nan, 0.5), clock.Now());
  EXPECT_EQ(job.train.step, 5);
}

// Network bytes per step: the rank that moved the most stands for the step, with its own
// breakdown; a report without a measurement keeps the last one shown.
TEST(ProgressTest, TheBusiestRanksNetworkBytesStandForAStep) {
  ManualClock clock;
  Job job = MakeJob("parallel: {tp: 2, dp: 2}\n");
  LayOut(job, {{"a", 0}, {"a", 1}, {"b", 2}, {"b", 3}}, clock.Now());
  const double nan = std::nan("");
  RecordStep(job, 0, Sample(1, nan, 0.1), clock.Now());
  EXPECT_FALSE(job.train.network_bytes_per_step) << "nothing measured yet";
  StepSample light = Sample(2, nan, 0.1);
  light.network_bytes_per_step = GroupBytes{0, 3e6, 0, 1e6};
  StepSample heavy = Sample(2, nan, 0.1);
  heavy.network_bytes_per_step = GroupBytes{0, 0.5e6, 0, 8e6};
  RecordStep(job, 0, light, clock.Now());
  RecordStep(job, 3, heavy, clock.Now());
  RecordStep(job, 1, light, clock.Now());
  ASSERT_TRUE(job.train.network_bytes_per_step);
  EXPECT_EQ(job.train.network_bytes_per_step->dp, 8e6);
  EXPECT_EQ(job.train.network_bytes_per_step->tp, 0.5e6) << "one rank's breakdown, not a mix";
  RecordStep(job, 2, Sample(3, 3.0, 0.1), clock.Now());
  ASSERT_TRUE(job.train.network_bytes_per_step);
  EXPECT_EQ(job.train.network_bytes_per_step->Total(), 8.5e6);
}

TEST(ProgressTest, StepsFeedTheWatchdogAndTheEta) {
  ManualClock clock;
  Job job = MakeJob("");
  LayOut(job, {{"a", 0}}, clock.Now());
  job.watchdog = ProgressWatchdog(std::chrono::seconds(1));
  job.watchdog.Arm(clock.Now());
  for (int64_t step = 1; step <= 4; ++step) {
    clock.Advance(2s);
    RecordStep(job, 0, Sample(step, 3.0, 0.1), clock.Now());
  }
  EXPECT_EQ(job.watchdog.newest_step(), 4);
  EXPECT_DOUBLE_EQ(job.watchdog.report_interval_seconds(), 2.0);
  EXPECT_FALSE(job.watchdog.Expired(clock.Now() + 9s));
  EXPECT_TRUE(job.watchdog.Expired(clock.Now() + 10s));  // 5 × 2 s
  // 3 steps in 6 s, 36 steps to go.
  EXPECT_DOUBLE_EQ(EtaSeconds(job), 72.0);
}

TEST(ProgressTest, TheFirstStepOfARestartedJobEndsItsRecovery) {
  ManualClock clock;
  Job job = MakeJob("parallel: {dp: 1}\nelastic: {min_actors: 1, max_actors: 2}\n");
  LayOut(job, {{"a", 0}, {"a", 1}}, clock.Now());
  GenerationRecord& first = job.generations.back();
  first.ending = Ending::kFault;
  Fault cause;
  cause.kind = FaultKind::kActorExit;
  first.cause = cause;
  first.steps_lost = 3;
  job.recovering_since = clock.Now();
  clock.Advance(180ms);
  LayOut(job, {{"a", 0}}, clock.Now(), 2);
  clock.Advance(70ms);
  const std::optional<Recovery> recovery = RecordStep(job, 0, Sample(11, 3.0, 0.1), clock.Now());
  ASSERT_TRUE(recovery);
  EXPECT_EQ(recovery->ended_generation, 1u);
  EXPECT_EQ(recovery->cause, "actor_exit");
  EXPECT_DOUBLE_EQ(recovery->seconds, 0.25);
  EXPECT_EQ(recovery->steps_lost, 3);
  EXPECT_DOUBLE_EQ(job.generations[0].recovery_seconds, 0.25);
  EXPECT_FALSE(job.recovering_since);
  EXPECT_FALSE(RecordStep(job, 0, Sample(12, 3.0, 0.1), clock.Now()));  // only once
}

// A serve job's leader replaces its last report; once a restarted service reports ready, its
// recovery ends (no steps lost), and the port it listens on is kept for the next restart.
TEST(ProgressTest, TheFirstReadyReportOfARestartedServiceEndsItsRecovery) {
  ManualClock clock;
  Job job;
  job.id = "svc-1";
  auto spec = placement::ParseJobSpec(
      "name: svc\nkind: serve\ncheckpoint: m\nparallel: {tp: 2}\nlisten: 127.0.0.1:0\n"
      "elastic: {}\n",
      "test spec");
  ASSERT_TRUE(spec.ok()) << spec.status();
  job.spec = *spec;
  LayOut(job, {{"a", 0}, {"a", 1}}, clock.Now());
  ServingRecord loading;
  loading.reported = true;
  EXPECT_FALSE(RecordServing(job, loading, clock.Now()));
  EXPECT_TRUE(job.serve_listen.empty());
  ServingRecord ready = loading;
  ready.ready = true;
  ready.url = "http://127.0.0.1:40123";
  ready.tokens_generated = 7;
  EXPECT_FALSE(RecordServing(job, ready, clock.Now()));  // no restart to recover from
  EXPECT_EQ(job.serving.tokens_generated, 7);
  EXPECT_EQ(job.serve_listen, "127.0.0.1:40123");

  GenerationRecord& first = job.generations.back();
  first.ending = Ending::kFault;
  Fault cause;
  cause.kind = FaultKind::kActorExit;
  first.cause = cause;
  job.recovering_since = clock.Now();
  clock.Advance(300ms);
  LayOut(job, {{"a", 0}, {"a", 1}}, clock.Now(), 2);
  job.serving = ServingRecord{};  // as StartGeneration leaves it
  EXPECT_FALSE(RecordServing(job, loading, clock.Now()));  // loading: not back yet
  clock.Advance(200ms);
  const std::optional<Recovery> recovery = RecordServing(job, ready, clock.Now());
  ASSERT_TRUE(recovery);
  EXPECT_EQ(recovery->ended_generation, 1u);
  EXPECT_EQ(recovery->cause, "actor_exit");
  EXPECT_DOUBLE_EQ(recovery->seconds, 0.5);
  EXPECT_EQ(recovery->steps_lost, 0);
  EXPECT_DOUBLE_EQ(job.generations[0].recovery_seconds, 0.5);
  EXPECT_FALSE(RecordServing(job, ready, clock.Now()));  // only once
}

}  // namespace
}  // namespace shardline::coordinator
