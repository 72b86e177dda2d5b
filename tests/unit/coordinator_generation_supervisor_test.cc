// The generation supervisor (coordinator/generation_supervisor.h) on a manual clock: the first
// fault aborts and the cascade is only recorded; the generation closes once its actors are gone
// or the grace is over, naming the root cause; an elastic job restarts until the breaker trips,
// a fixed one fails; the watchdog, the bootstrap and run deadlines and the wait for devices come
// due at their times.
#include "coordinator/generation_supervisor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/coordinator_test_jobs.h"

namespace shardline::coordinator {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::LayOut;
using testing::MakeJob;
using Due = GenerationSupervisor::Due;

constexpr const char* kElastic =
    "parallel: {tp: 1, dp: 2}\nelastic: {min_actors: 1, max_actors: 2, max_restarts: 2, "
    "progress_timeout_s: 2}\nbootstrap_timeout_s: 5\nrun_timeout_s: 100\n";

class GenerationSupervisorTest : public ::testing::Test {
 protected:
  void Start(const std::string& extra) {
    job_ = MakeJob(extra);
    LayOut(job_, {{"a", 0}, {"b", 0}}, clock_.Now(), ++generation_);
    job_.phase = Phase::kRunning;
    job_.watchdog = ProgressWatchdog(WatchdogFloor(job_));
    job_.watchdog.Arm(clock_.Now());
  }
  Fault Make(FaultKind kind, int rank, std::string detail) {
    return supervisor_.MakeFault(job_, kind, rank, rank >= 0 ? job_.actors[rank].node_id : "",
                                 std::move(detail), clock_.Now());
  }
  void ExitAll() {
    for (ActorRecord& actor : job_.actors) actor.exited = true;
  }
  ManualClock clock_;
  GenerationSupervisor supervisor_{3s};
  Job job_;
  uint32_t generation_ = 0;
};

TEST_F(GenerationSupervisorTest, TheFirstFaultAbortsAndTheKilledRankIsTheCause) {
  Start(kElastic);
  job_.train.step = 14;
  const auto abort =
      supervisor_.OnFault(job_, Make(FaultKind::kCommError, 0, "failed: connection closed"),
                          clock_.Now());
  ASSERT_TRUE(abort);
  EXPECT_EQ(*abort, "rank 0 on a failed: connection closed at step 14");
  EXPECT_EQ(job_.phase, Phase::kAborting);
  EXPECT_FALSE(job_.watchdog.armed());
  clock_.Advance(20ms);
  EXPECT_FALSE(supervisor_.OnFault(
      job_, Make(FaultKind::kActorExit, 1, "killed by SIGKILL (signal 9)"), clock_.Now()));
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now()), Due::kNothing);  // actors still there
  ExitAll();
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now()), Due::kClose);
  const auto closure = supervisor_.Close(job_, clock_.Now(), 1000);
  EXPECT_TRUE(closure.restart);
  EXPECT_EQ(closure.restart_cause, "actor_exit");
  EXPECT_EQ(closure.blamed_rank, 1);  // placements avoid its device
  EXPECT_THAT(closure.error, StartsWith("generation 1: rank 1 on b killed by SIGKILL (signal 9) "
                                        "at step 14 (then 1 consequence: rank 0 on a failed"));
  const GenerationRecord& record = job_.generations.back();
  EXPECT_EQ(record.ending, Ending::kFault);
  EXPECT_EQ(record.cause->rank, 1);
  EXPECT_DOUBLE_EQ(record.abort_seconds, 0.02);
  EXPECT_EQ(job_.phase, Phase::kRestarting);
  EXPECT_EQ(job_.train.start, TrainRecord::Start::kUndecided);
  ASSERT_TRUE(job_.recovering_since);
  EXPECT_EQ(*job_.recovering_since, job_.abort_started);
}

TEST_F(GenerationSupervisorTest, ActorsThatNeverExitAreGivenUpAfterTheGrace) {
  Start(kElastic);
  ASSERT_TRUE(supervisor_.OnFault(job_, Make(FaultKind::kActorError, 0, "failed"), clock_.Now()));
  job_.actors[0].exited = true;
  clock_.Advance(2999ms);
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now()), Due::kNothing);
  clock_.Advance(1ms);
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now()), Due::kClose);
  // An error the actor reported is not its device's fault.
  EXPECT_EQ(supervisor_.Close(job_, clock_.Now(), 1000).blamed_rank, -1);
  EXPECT_EQ(job_.actors[1].state, ActorState::kLost);
  EXPECT_EQ(job_.actors[1].detail, "had not exited 3.0 s after the abort");
}

TEST_F(GenerationSupervisorTest, AJobWithoutElasticFailsOnItsFirstFault) {
  Start("parallel: {dp: 2}\n");
  ASSERT_TRUE(supervisor_.OnFault(job_, Make(FaultKind::kActorExit, 1, "exited with code 3"),
                                  clock_.Now()));
  ExitAll();
  const auto closure = supervisor_.Close(job_, clock_.Now(), 1000);
  EXPECT_FALSE(closure.restart);
  EXPECT_EQ(closure.error, "generation 1: rank 1 on b exited with code 3 before its first step");
  EXPECT_EQ(job_.phase, Phase::kNone);
}

TEST_F(GenerationSupervisorTest, TheBreakerStopsRestartsPastMaxRestarts) {
  for (int i = 0; i < 3; ++i) {
    std::vector<GenerationRecord> history = job_.generations;
    Start(kElastic);
    history.push_back(job_.generations.back());
    job_.generations = history;
    job_.train.step = 10 * (i + 1);  // a new step each time: only the count trips it
    ASSERT_TRUE(supervisor_.OnFault(job_, Make(FaultKind::kActorExit, 0, "killed"), clock_.Now()));
    ExitAll();
    const auto closure = supervisor_.Close(job_, clock_.Now(), 1000 + i);
    if (i < 2) {
      EXPECT_TRUE(closure.restart) << i;
    } else {
      EXPECT_FALSE(closure.restart);
      EXPECT_THAT(closure.error, StartsWith("restarts stopped: "));
    }
  }
}

TEST_F(GenerationSupervisorTest, AGrowIsARestartWithoutACause) {
  Start(kElastic);
  supervisor_.BeginAbort(job_, Ending::kGrow, clock_.Now());
  ExitAll();
  const auto closure = supervisor_.Close(job_, clock_.Now(), 1000);
  EXPECT_TRUE(closure.restart);
  EXPECT_EQ(closure.restart_cause, "");
  EXPECT_EQ(job_.generations.back().ending, Ending::kGrow);
  EXPECT_FALSE(job_.generations.back().cause);
}

TEST_F(GenerationSupervisorTest, ASilentGenerationIsHungAndTheStoppedRankNamed) {
  Start(kElastic);
  // Before the first step the watchdog allows 3 floors (6 s).
  clock_.Advance(5999ms);
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now()), Due::kNothing);
  clock_.Advance(1ms);
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now()), Due::kHung);
  const Fault hung = supervisor_.HangFault(job_, {1}, clock_.Now());
  EXPECT_EQ(hung.kind, FaultKind::kHung);
  EXPECT_EQ(hung.rank, 1);
  EXPECT_EQ(hung.node, "b");
  EXPECT_DOUBLE_EQ(hung.unseen_seconds, 6.0);
  EXPECT_THAT(hung.detail, StartsWith("is stopped and made no progress for 6.0 s"));
  EXPECT_THAT(supervisor_.HangFault(job_, {}, clock_.Now()).detail,
              StartsWith("(every rank) made no progress"));
}

TEST_F(GenerationSupervisorTest, BootstrapRunAndWaitDeadlinesComeDue) {
  Start(kElastic);
  job_.phase = Phase::kBootstrapping;
  clock_.Advance(5s);
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now()), Due::kBootstrapTimeout);
  EXPECT_THAT(supervisor_.BootstrapFault(job_, clock_.Now()).detail,
              HasSubstr("bootstrap timed out after 5.0 s: group"));
  job_.phase = Phase::kRunning;
  job_.watchdog.Disarm();
  clock_.Advance(95s);
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now()), Due::kRunTimeout);
  job_.phase = Phase::kRestarting;
  job_.restart_waiting_since = clock_.Now();
  clock_.Advance(job_.spec.elastic.wait_timeout - 1ms);
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now()), Due::kNothing);
  clock_.Advance(1ms);
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now()), Due::kWaitTimeout);
}

TEST_F(GenerationSupervisorTest, FaultsOfAJobNotRunningAreDropped) {
  Start(kElastic);
  job_.state = JobState::kSucceeded;
  EXPECT_FALSE(supervisor_.OnFault(job_, Make(FaultKind::kActorExit, 0, "x"), clock_.Now()));
  EXPECT_TRUE(job_.faults.empty());
  EXPECT_EQ(supervisor_.Check(job_, clock_.Now() + 1h), Due::kNothing);
}

}  // namespace
}  // namespace shardline::coordinator
