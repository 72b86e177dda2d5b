// The scheduler (coordinator/scheduler.h): a fixed layout fills one node's devices before the
// next and waits, saying for what, when too few are free; an elastic job takes the largest dp
// within min..max that divides the batch, waits below min_actors, and grows when devices free;
// a `parallel: auto` job is planned on the free devices. Membership is filled directly: no agent.
#include "coordinator/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/coordinator_test_jobs.h"

namespace shardline::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using testing::CpuNode;
using testing::MakeJob;

class SchedulerTest : public ::testing::Test {
 protected:
  void AddNode(const std::string& id, int devices) {
    ASSERT_TRUE(membership_.Register(CpuNode(id, devices), clock_.Now()).ok());
  }
  ManualClock clock_;
  Membership membership_{std::chrono::milliseconds(1500)};
  CalibrationBook calibration_;
  Scheduler scheduler_{membership_, calibration_, "test"};
};

TEST_F(SchedulerTest, AFixedLayoutFillsOneNodeBeforeTheNext) {
  AddNode("a", 3);
  AddNode("b", 2);
  membership_.Find("a")->devices[1].busy_job = "other-1";
  Job job = MakeJob("parallel: {tp: 2, dp: 2}\n");
  const StartChoice choice = scheduler_.Choose(job);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart) << choice.reason;
  EXPECT_THAT(choice.placement, ElementsAre(Pair("a", 0), Pair("a", 2), Pair("b", 0), Pair("b", 1)));
}

TEST_F(SchedulerTest, AFixedLayoutWaitsSayingHowManyDevicesAreFree) {
  AddNode("a", 2);
  AddNode("b", 2);
  membership_.Find("b")->alive = false;
  Job job = MakeJob("parallel: {tp: 2, dp: 2}\n");
  const StartChoice choice = scheduler_.Choose(job);
  EXPECT_EQ(choice.verdict, StartChoice::Verdict::kWait);
  EXPECT_EQ(choice.reason, "waiting for 4 free cpu devices (2 free of 2 alive)");
}

TEST_F(SchedulerTest, AnElasticJobTakesTheLargestDpThatDividesTheBatch) {
  AddNode("a", 4);
  AddNode("b", 3);  // 7 free: tp 2 × dp 3 = 6 would not divide the batch of 8
  Job job = MakeJob("parallel: {tp: 2, dp: 1}\nelastic: {min_actors: 2, max_actors: 8}\n");
  const StartChoice choice = scheduler_.Choose(job);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart) << choice.reason;
  EXPECT_EQ(job.spec.parallel.dp, 2);
  EXPECT_EQ(job.World(), 4);
  EXPECT_EQ(choice.placement.size(), 4u);
}

TEST_F(SchedulerTest, AnElasticJobBelowMinActorsWaitsSayingForWhat) {
  AddNode("a", 3);
  membership_.Find("a")->devices[0].busy_job = "other-1";
  Job job = MakeJob("parallel: {tp: 2, dp: 2}\nelastic: {min_actors: 4, max_actors: 4}\n");
  const StartChoice choice = scheduler_.Choose(job);
  EXPECT_EQ(choice.verdict, StartChoice::Verdict::kWait);
  EXPECT_EQ(choice.reason, "waiting for 2 more cpu devices: 2 free of 3 alive, min 4");
  // Between generations the reason says which generation it restarts after.
  job.state = JobState::kRunning;
  job.phase = Phase::kRestarting;
  job.generation = 3;
  EXPECT_EQ(scheduler_.Choose(job).reason,
            "restarting after generation 3: waiting for 2 more cpu devices: 2 free of 3 alive, "
            "min 4");
}

TEST_F(SchedulerTest, AnElasticJobGrowsOnlyWhenFreeDevicesMakeALargerLayout) {
  AddNode("a", 2);
  Job job = MakeJob("parallel: {tp: 2, dp: 1}\nelastic: {min_actors: 2, max_actors: 4}\n");
  StartChoice choice = scheduler_.Choose(job);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart);
  HoldDevices(membership_, job.id, choice.placement);
  job.state = JobState::kRunning;
  job.phase = Phase::kRunning;
  job.train.last_committed_step = 10;
  EXPECT_EQ(scheduler_.GrowTarget(job), std::nullopt);  // nothing free
  AddNode("b", 1);
  EXPECT_EQ(scheduler_.GrowTarget(job), std::nullopt);  // 3 devices: no dp of tp 2 fits
  AddNode("c", 1);
  EXPECT_EQ(scheduler_.GrowTarget(job), 4);
  job.train.last_committed_step = job.spec.train.steps;  // done: nothing to grow for
  EXPECT_EQ(scheduler_.GrowTarget(job), std::nullopt);
}

TEST_F(SchedulerTest, ADeviceAFaultPointedAtIsLeftOutWhileOthersAreEnough) {
  AddNode("a", 2);
  AddNode("b", 2);
  ActorRecord killed;
  killed.node_id = "a";
  killed.device = membership_.Find("a")->devices[1];
  AvoidDevice(membership_, killed, "rank 1 on a killed by SIGKILL (signal 9) at step 8");
  EXPECT_EQ(membership_.Find("a")->devices[1].avoided,
            "rank 1 on a killed by SIGKILL (signal 9) at step 8");
  const DeviceCount count = CountDevices(membership_, DeviceInfo::Kind::kCpu);
  EXPECT_EQ(count.free, 4);
  EXPECT_EQ(count.trusted, 3);
  // An elastic job takes the smaller layout on the trusted devices...
  Job elastic = MakeJob("parallel: {tp: 1, dp: 2}\nelastic: {min_actors: 1, max_actors: 4}\n");
  StartChoice choice = scheduler_.Choose(elastic);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart) << choice.reason;
  EXPECT_EQ(elastic.World(), 2);  // 3 trusted: dp 3 does not divide the batch of 8
  EXPECT_THAT(choice.placement, ElementsAre(Pair("a", 0), Pair("b", 0)));
  // ... and does not grow onto the avoided one.
  HoldDevices(membership_, elastic.id, choice.placement);
  elastic.state = JobState::kRunning;
  elastic.phase = Phase::kRunning;
  EXPECT_EQ(scheduler_.GrowTarget(elastic), std::nullopt);
  FreeDevices(membership_, elastic.id);
  // A job that cannot start without it takes it rather than wait.
  Job fixed = MakeJob("parallel: {tp: 2, dp: 2}\n");
  choice = scheduler_.Choose(fixed);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart) << choice.reason;
  EXPECT_THAT(choice.placement, ElementsAre(Pair("a", 0), Pair("a", 1), Pair("b", 0), Pair("b", 1)));
  // An elastic job that the trusted devices cannot hold takes as few avoided ones as it can.
  killed.node_id = "b";
  killed.device = membership_.Find("b")->devices[0];
  AvoidDevice(membership_, killed, "hung");
  killed.device = membership_.Find("b")->devices[1];
  AvoidDevice(membership_, killed, "hung");
  Job tight = MakeJob("parallel: {tp: 2, dp: 1}\nelastic: {min_actors: 2, max_actors: 4}\n");
  choice = scheduler_.Choose(tight);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart) << choice.reason;
  EXPECT_EQ(tight.World(), 2);
  EXPECT_THAT(choice.placement, ElementsAre(Pair("a", 0), Pair("a", 1)));
  // A node registering again trusts its devices again.
  AddNode("b", 2);
  EXPECT_EQ(CountDevices(membership_, DeviceInfo::Kind::kCpu).trusted, 3);
  AddNode("a", 2);
  EXPECT_EQ(CountDevices(membership_, DeviceInfo::Kind::kCpu).trusted, 4);
}

TEST_F(SchedulerTest, HeldDevicesAreFreedByJob) {
  AddNode("a", 2);
  HoldDevices(membership_, "j-1", {{"a", 1}});
  EXPECT_EQ(CountDevices(membership_, DeviceInfo::Kind::kCpu).free, 1);
  FreeDevices(membership_, "other-1");
  EXPECT_EQ(membership_.Find("a")->devices[1].busy_job, "j-1");
  FreeDevices(membership_, "j-1");
  EXPECT_EQ(CountDevices(membership_, DeviceInfo::Kind::kCpu).free, 2);
}

TEST_F(SchedulerTest, AnAutoJobIsPlannedOnTheFreeDevicesAndForgetsItsPlanToRestart) {
  AddNode("a", 2);
  Job job = MakeJob("parallel: auto\n");
  const StartChoice choice = scheduler_.Choose(job);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart) << choice.reason;
  EXPECT_TRUE(job.plan.planned);
  EXPECT_EQ(choice.placement.size(), static_cast<size_t>(job.World()));
  EXPECT_THAT(job.plan.summary, HasSubstr("free cpu devices on 1 node"));
  ForgetAutoPlan(job);
  EXPECT_FALSE(job.plan.planned);
  EXPECT_EQ(job.spec.parallel.tp, placement::ParallelSpec().tp);
}

TEST_F(SchedulerTest, AnElasticAutoJobGrowsToThePlanItWouldGetOnMoreDevices) {
  AddNode("a", 1);
  Job job = MakeJob("parallel: auto\nelastic: {min_actors: 1}\n");
  StartChoice choice = scheduler_.Choose(job);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart) << choice.reason;
  ASSERT_EQ(job.World(), 1);
  HoldDevices(membership_, job.id, choice.placement);
  job.state = JobState::kRunning;
  job.phase = Phase::kRunning;
  job.train.last_committed_step = 10;
  EXPECT_EQ(scheduler_.GrowTarget(job), std::nullopt);  // nothing free
  AddNode("b", 4);
  const std::optional<int> grown = scheduler_.GrowTarget(job);
  // What a restart would plan on the job's device and the free ones; pricing it changed nothing.
  Job restarted = job;
  ForgetAutoPlan(restarted);
  FreeDevices(membership_, job.id);
  const StartChoice replanned = scheduler_.Choose(restarted);
  ASSERT_EQ(replanned.verdict, StartChoice::Verdict::kStart) << replanned.reason;
  ASSERT_GT(restarted.World(), 1) << "the planner prices a larger plan faster for this model";
  EXPECT_EQ(grown, restarted.World());
  EXPECT_EQ(job.World(), 1);
  EXPECT_TRUE(job.plan.planned);
}

TEST_F(SchedulerTest, AnAutoJobWaitsWhenNothingIsFree) {
  AddNode("a", 1);
  membership_.Find("a")->devices[0].busy_job = "other-1";
  Job job = MakeJob("parallel: auto\n");
  const StartChoice choice = scheduler_.Choose(job);
  EXPECT_EQ(choice.verdict, StartChoice::Verdict::kWait);
  EXPECT_EQ(choice.reason, "waiting for free cpu devices to plan on (0 free of 1 alive)");
}

// A serve job of a GPT-2-small shape whose model the coordinator read at submit.
Job ServeJob(const std::string& parallel, const std::string& limits = "") {
  Job job;
  job.id = "svc-1";
  auto spec = placement::ParseJobSpec(
      "name: svc\nkind: serve\ncheckpoint: m\nparallel: " + parallel + "\n" + limits,
      "test spec");
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (spec.ok()) job.spec = *spec;
  if (job.spec.parallel_auto) job.auto_max_actors = AutoMaxActors(job.spec);
  job.serve_model.layers = 12;
  job.serve_model.heads = 12;
  job.serve_model.d_model = 768;
  job.serve_model.d_ff = 3072;
  job.serve_model.vocab = 50257;
  job.serve_model.max_seq_len = 1024;
  return job;
}

TEST_F(SchedulerTest, AServeJobIsPlacedOnlyOnDevicesThatHoldItsFullestRank) {
  AddNode("a", 2);
  AddNode("b", 2);
  for (auto& device : membership_.Find("a")->devices) device.memory_bytes = 64 << 20;
  Job job = ServeJob("{tp: 2}");
  const StartChoice choice = scheduler_.Choose(job);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart) << choice.reason;
  EXPECT_THAT(choice.placement, ElementsAre(Pair("b", 0), Pair("b", 1)));
  // Every device too small: refused, saying by how much, at submit and at the start.
  for (auto& device : membership_.Find("b")->devices) device.memory_bytes = 64 << 20;
  const absl::Status fits = scheduler_.CheckServeFits(job);
  EXPECT_EQ(fits.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fits.message(), HasSubstr("each rank of tp 2 x pp 1 needs"));
  EXPECT_THAT(fits.message(), HasSubstr("the largest cpu device has 64.0 MiB"));
  const StartChoice refused = scheduler_.Choose(job);
  EXPECT_EQ(refused.verdict, StartChoice::Verdict::kFail);
  EXPECT_EQ(refused.reason, fits.message());
}

TEST_F(SchedulerTest, AnAutoServeJobTakesTheFewestDevicesThatHoldIt) {
  AddNode("a", 4);
  // GPT-2 small on one rank needs about 1 GiB (weights, packed copies, 8 whole contexts): with
  // 600 MiB devices it takes tensor parallelism of 4 (12 heads; 2 ranks are still too big).
  for (auto& device : membership_.Find("a")->devices) device.memory_bytes = 600 << 20;
  Job job = ServeJob("auto");
  StartChoice choice = scheduler_.Choose(job);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart) << choice.reason;
  EXPECT_TRUE(job.plan.planned);
  EXPECT_GT(job.spec.parallel.tp, 1);
  EXPECT_EQ(job.spec.parallel.pp, 1);
  EXPECT_EQ(job.World(), job.spec.parallel.tp);
  EXPECT_EQ(choice.placement.size(), static_cast<size_t>(job.World()));
  EXPECT_THAT(job.plan.summary, HasSubstr("parallel: auto: tp "));
  // Large devices: one.
  for (auto& device : membership_.Find("a")->devices) device.memory_bytes = uint64_t{8} << 30;
  Job small = ServeJob("auto");
  choice = scheduler_.Choose(small);
  ASSERT_EQ(choice.verdict, StartChoice::Verdict::kStart) << choice.reason;
  EXPECT_EQ(small.World(), 1);
  // Tiny ones: none fits, and the job fails saying how close it came.
  for (auto& device : membership_.Find("a")->devices) device.memory_bytes = 16 << 20;
  Job none = ServeJob("auto");
  choice = scheduler_.Choose(none);
  EXPECT_EQ(choice.verdict, StartChoice::Verdict::kFail);
  EXPECT_THAT(choice.reason, HasSubstr("no layout of at most 4 devices fits"));
}

}  // namespace
}  // namespace shardline::coordinator
