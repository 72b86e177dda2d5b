// The generation supervisor's rules: which fault is a generation's cause, the crash-loop breaker,
// the hang watchdog. A manual clock: nothing sleeps.
#include "coordinator/supervisor.h"

#include <gtest/gtest.h>

namespace shardline::coordinator {
namespace {

using namespace std::chrono_literals;

Fault MakeFault(FaultKind kind, int rank, TimePoint at, int64_t step = 140,
                std::string detail = "") {
  Fault fault;
  fault.kind = kind;
  fault.rank = rank;
  fault.node = rank >= 0 ? "node-" + std::to_string(rank) : "";
  fault.at = at;
  fault.step = step;
  fault.detail = detail.empty() ? std::string(FaultKindName(kind)) : detail;
  return fault;
}

TEST(FaultLogTest, AKilledRankIsTheCauseEvenWhenItsPeersReportFirst) {
  ManualClock clock;
  FaultLog log;
  // What the coordinator sees after kill -9 of rank 1: rank 0's broken socket arrives first,
  // then the agent's exit report, then the exits of the ranks the abort killed.
  log.Add(MakeFault(FaultKind::kCommError, 0, clock.Now(), 140,
                    "failed: all_reduce: Connection closed by peer"));
  clock.Advance(15ms);
  log.Add(MakeFault(FaultKind::kActorExit, 1, clock.Now(), 140, "killed by SIGKILL (signal 9)"));
  clock.Advance(5ms);
  log.Add(MakeFault(FaultKind::kAborted, 2, clock.Now()));
  const Fault& cause = log.RootCause();
  EXPECT_EQ(cause.kind, FaultKind::kActorExit);
  EXPECT_EQ(cause.rank, 1);
  EXPECT_EQ(DescribeFault(cause), "rank 1 on node-1 killed by SIGKILL (signal 9) at step 140");
  const std::vector<Fault> rest = log.Consequences();
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].rank, 0);
  EXPECT_EQ(rest[1].rank, 2);
}

TEST(FaultLogTest, ALostNodeExplainsAGenerationThatHungAsAWhole) {
  ManualClock clock;
  FaultLog log;
  // A cut link: every rank stalls in a collective, the watchdog fires, and the node's heartbeat
  // timeout passes a moment later.
  log.Add(MakeFault(FaultKind::kHung, -1, clock.Now(), 22, "(every rank) made no progress"));
  clock.Advance(70ms);
  log.Add(MakeFault(FaultKind::kNodeLost, -1, clock.Now(), 22, "lost rank 3"));
  EXPECT_EQ(log.RootCause().kind, FaultKind::kNodeLost);
  // A stopped rank's hang is a cause of its own, earlier than the node lost after it.
  FaultLog stopped;
  stopped.Add(MakeFault(FaultKind::kHung, 2, clock.Now(), 22, "is stopped"));
  clock.Advance(70ms);
  stopped.Add(MakeFault(FaultKind::kNodeLost, -1, clock.Now(), 22, "lost rank 3"));
  EXPECT_EQ(stopped.RootCause().kind, FaultKind::kHung);
}

TEST(FaultLogTest, OnlyCommunicatorErrorsMakeTheFirstOneTheCause) {
  ManualClock clock;
  FaultLog log;
  log.Add(MakeFault(FaultKind::kCommError, 3, clock.Now()));
  clock.Advance(1ms);
  log.Add(MakeFault(FaultKind::kCommError, 0, clock.Now()));
  EXPECT_EQ(log.RootCause().rank, 3);
  EXPECT_EQ(log.Consequences().size(), 1u);
}

TEST(FaultLogTest, ALostNodeOutranksThePeersErrorsItCaused) {
  ManualClock clock;
  FaultLog log;
  // kill -9 of an agent: its actors die with it, their peers fail at once (some errors come out
  // of Gloo outside its I/O path, as plain actor errors), the node is lost 1.5 s later.
  log.Add(MakeFault(FaultKind::kActorError, 0, clock.Now(), 40, "failed: internal error"));
  log.Add(MakeFault(FaultKind::kCommError, 1, clock.Now()));
  clock.Advance(1500ms);
  log.Add(MakeFault(FaultKind::kNodeLost, -1, clock.Now()));
  EXPECT_EQ(log.RootCause().kind, FaultKind::kNodeLost);
  // Alone, an actor's error is the cause before a communicator error that came first.
  FaultLog own;
  own.Add(MakeFault(FaultKind::kCommError, 1, clock.Now()));
  own.Add(MakeFault(FaultKind::kActorError, 0, clock.Now()));
  EXPECT_EQ(own.RootCause().kind, FaultKind::kActorError);
}

TEST(FaultLogTest, ACauseOtherThanAnEchoWinsByArrival) {
  ManualClock clock;
  FaultLog log;
  log.Add(MakeFault(FaultKind::kNodeLost, -1, clock.Now()));
  clock.Advance(1ms);
  log.Add(MakeFault(FaultKind::kActorExit, 2, clock.Now()));
  EXPECT_EQ(log.RootCause().kind, FaultKind::kNodeLost);
}

TEST(DescribeFaultTest, NamesNodesAndStepsAndTheStartBeforeTheFirstStep) {
  Fault node = MakeFault(FaultKind::kNodeLost, -1, TimePoint(), 40,
                         "lost rank 2, rank 3 (no heartbeat for 1.6 s)");
  node.node = "node-b";
  EXPECT_EQ(DescribeFault(node), "node node-b lost rank 2, rank 3 (no heartbeat for 1.6 s) at step 40");
  Fault early = MakeFault(FaultKind::kBootstrap, -1, TimePoint(), 0, "bootstrap timed out");
  EXPECT_EQ(DescribeFault(early), "bootstrap timed out before its first step");
}

GenerationRecord Ended(uint32_t generation, int64_t ended_unix_ms, FaultKind kind, int64_t step) {
  GenerationRecord record;
  record.generation = generation;
  record.ended_unix_ms = ended_unix_ms;
  record.ending = Ending::kFault;
  record.cause = MakeFault(kind, 1, TimePoint(), step);
  return record;
}

TEST(DecideRestartTest, RestartsUntilMoreThanMaxRestartsFallInTheWindow) {
  placement::ElasticSpec elastic;
  elastic.enabled = true;
  elastic.max_restarts = 2;
  elastic.restart_window = 60s;
  std::vector<GenerationRecord> history = {Ended(1, 10'000, FaultKind::kActorExit, 10)};
  EXPECT_TRUE(DecideRestart(elastic, history, 10'000).restart);
  history.push_back(Ended(2, 20'000, FaultKind::kHung, 20));
  EXPECT_TRUE(DecideRestart(elastic, history, 20'000).restart);
  history.push_back(Ended(3, 30'000, FaultKind::kNodeLost, 30));
  const RestartVerdict verdict = DecideRestart(elastic, history, 30'000);
  EXPECT_FALSE(verdict.restart);
  EXPECT_NE(verdict.reason.find("3 faults within 60.0 s (max_restarts 2)"), std::string::npos)
      << verdict.reason;
  // Every cause is listed.
  EXPECT_NE(verdict.reason.find("generation 1: rank 1"), std::string::npos) << verdict.reason;
  EXPECT_NE(verdict.reason.find("generation 3: rank 1"), std::string::npos) << verdict.reason;
  // The same three, spread past the window: restarts go on.
  EXPECT_TRUE(DecideRestart(elastic, history, 30'000 + 60'000 - 15'000).restart);
}

TEST(DecideRestartTest, TheSameCauseAtTheSameStepThreeTimesStopsRestarts) {
  placement::ElasticSpec elastic;
  elastic.enabled = true;
  elastic.max_restarts = 100;
  std::vector<GenerationRecord> history = {Ended(1, 1'000, FaultKind::kActorError, 50),
                                           Ended(2, 2'000, FaultKind::kActorError, 50)};
  EXPECT_TRUE(DecideRestart(elastic, history, 2'000).restart);
  history.push_back(Ended(3, 3'000, FaultKind::kActorError, 60));  // another step: not the same
  EXPECT_TRUE(DecideRestart(elastic, history, 3'000).restart);
  history.push_back(Ended(4, 4'000, FaultKind::kActorError, 50));
  const RestartVerdict verdict = DecideRestart(elastic, history, 4'000);
  EXPECT_FALSE(verdict.restart);
  EXPECT_NE(verdict.reason.find("the same cause (actor_error at step 50) ended 3 generations"),
            std::string::npos)
      << verdict.reason;
}

TEST(DecideRestartTest, GrowEndingsAreNotFaults) {
  placement::ElasticSpec elastic;
  elastic.enabled = true;
  elastic.max_restarts = 0;
  GenerationRecord grow;
  grow.generation = 1;
  grow.ending = Ending::kGrow;
  grow.ended_unix_ms = 1'000;
  EXPECT_TRUE(DecideRestart(elastic, {grow}, 1'000).restart);
  EXPECT_FALSE(DecideRestart(elastic, {grow, Ended(2, 2'000, FaultKind::kHung, 3)}, 2'000).restart);
  placement::ElasticSpec fixed;  // not elastic: never restarts
  EXPECT_FALSE(DecideRestart(fixed, {Ended(1, 1'000, FaultKind::kHung, 3)}, 1'000).restart);
}

TEST(ProgressWatchdogTest, TheDeadlineFollowsTheMeasuredIntervalWithAFloor) {
  ManualClock clock;
  ProgressWatchdog watchdog(2s);
  EXPECT_FALSE(watchdog.Expired(clock.Now()));  // not armed
  watchdog.Arm(clock.Now());
  // Before the first step: 3 floors for loading, calibration and the first step.
  clock.Advance(5900ms);
  EXPECT_FALSE(watchdog.Expired(clock.Now()));
  clock.Advance(200ms);
  EXPECT_TRUE(watchdog.Expired(clock.Now()));

  watchdog.Arm(clock.Now());
  clock.Advance(1s);
  watchdog.OnStep(1, clock.Now());  // the first interval: 1 s
  EXPECT_DOUBLE_EQ(watchdog.report_interval_seconds(), 1.0);
  // 5 × 1 s = 5 s after the last step.
  clock.Advance(4900ms);
  EXPECT_FALSE(watchdog.Expired(clock.Now()));
  clock.Advance(200ms);
  EXPECT_TRUE(watchdog.Expired(clock.Now()));
  // A step that is not newer moves nothing.
  watchdog.OnStep(1, clock.Now());
  EXPECT_TRUE(watchdog.Expired(clock.Now()));
  watchdog.OnStep(2, clock.Now());
  EXPECT_FALSE(watchdog.Expired(clock.Now()));

  // Fast steps: the floor holds.
  ManualClock fast;
  ProgressWatchdog quick(2s);
  quick.Arm(fast.Now());
  for (int step = 1; step <= 20; ++step) {
    fast.Advance(10ms);
    quick.OnStep(step, fast.Now());
  }
  fast.Advance(1900ms);
  EXPECT_FALSE(quick.Expired(fast.Now()));
  fast.Advance(200ms);
  EXPECT_TRUE(quick.Expired(fast.Now()));
  EXPECT_NEAR(quick.SilentSeconds(fast.Now()), 2.1, 1e-9);
  quick.Disarm();
  EXPECT_FALSE(quick.Expired(fast.Now()));
}

TEST(ProgressWatchdogTest, AGenerationThatCalibratesHasUntilItsBootstrapDeadlineThenTheFloors) {
  ManualClock clock;
  ProgressWatchdog watchdog(2s);
  const TimePoint bootstrap_deadline = clock.Now() + 20s;
  watchdog.Arm(clock.Now(), bootstrap_deadline);
  clock.Advance(19900ms);  // a calibration slowed down by a loaded machine
  EXPECT_FALSE(watchdog.Expired(clock.Now()));
  clock.Advance(200ms);
  EXPECT_TRUE(watchdog.Expired(clock.Now()));

  // The last rank's measurement is in: the first step's 3 floors run from then.
  watchdog.Arm(clock.Now());
  clock.Advance(5900ms);
  EXPECT_FALSE(watchdog.Expired(clock.Now()));
  clock.Advance(200ms);
  EXPECT_TRUE(watchdog.Expired(clock.Now()));

  // A bootstrap deadline sooner than the floors does not shorten them.
  watchdog.Arm(clock.Now(), clock.Now() + 1s);
  clock.Advance(5900ms);
  EXPECT_FALSE(watchdog.Expired(clock.Now()));
}

}  // namespace
}  // namespace shardline::coordinator
