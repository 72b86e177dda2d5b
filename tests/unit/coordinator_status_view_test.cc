// The status view (coordinator/status_view.h): the status reply carries the nodes with their
// devices, each job with its actors, a train job's layout, progress and one entry per
// generation (cause, consequences, steps lost), and only the job asked for; the gauges count
// nodes, devices, actors and jobs by state.
#include "coordinator/status_view.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include "tests/unit/coordinator_test_jobs.h"

namespace shardline::coordinator {
namespace {

using protocol::Str;
using testing::CpuNode;
using testing::LayOut;
using testing::MakeJob;

class StatusViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(membership_.Register(CpuNode("a", 2), clock_.Now()).ok());
    ASSERT_TRUE(membership_.Register(CpuNode("b", 1), clock_.Now()).ok());
    membership_.Find("b")->alive = false;
    Job train = MakeJob("parallel: {dp: 2}\nelastic: {min_actors: 1, max_actors: 2}\n", "t-1");
    LayOut(train, {{"a", 0}, {"a", 1}}, clock_.Now(), 2);
    HoldDevices(membership_, "t-1", {{"a", 0}, {"a", 1}});
    train.phase = Phase::kRunning;
    train.train.step = 12;
    train.train.last_committed_step = 10;
    GenerationRecord first = testing::FaultEnded(1, FaultKind::kActorExit, 1, "a", 8,
                                                 "killed by SIGKILL (signal 9)");
    first.consequences = {"rank 0 on a was stopped by the abort"};
    first.steps_lost = 3;
    train.generations.insert(train.generations.begin(), first);
    jobs_["t-1"] = train;
    Job pending = MakeJob("", "t-2");
    pending.waiting_reason = "waiting for devices";
    jobs_["t-2"] = pending;
    order_ = {"t-1", "t-2"};
  }
  ManualClock clock_;
  Membership membership_{std::chrono::milliseconds(1500)};
  CalibrationBook calibration_;
  std::map<std::string, Job> jobs_;
  std::vector<std::string> order_;
  const std::string cluster_ = "test";
};

TEST_F(StatusViewTest, TheReplyShowsNodesJobsAndGenerations) {
  capnp::MallocMessageBuilder message;
  auto status = message.initRoot<wire::ClusterStatus>();
  const StatusSource source{cluster_, "127.0.0.1:9", clock_.Now(), membership_, calibration_,
                            jobs_,    order_};
  FillStatus(status, source, "", clock_.Now());
  ASSERT_EQ(status.getNodes().size(), 2u);
  EXPECT_EQ(Str(status.getNodes()[0].getState()), "alive");
  EXPECT_EQ(status.getNodes()[0].getActors(), 2u);
  EXPECT_EQ(Str(status.getNodes()[1].getState()), "dead");
  ASSERT_EQ(status.getJobs().size(), 2u);
  auto train = status.getJobs()[0];
  EXPECT_EQ(Str(train.getJobId()), "t-1");
  EXPECT_EQ(train.getGeneration(), 2u);
  EXPECT_EQ(train.getActors().size(), 2u);
  EXPECT_EQ(train.getTrain().getDp(), 2u);
  EXPECT_EQ(train.getTrain().getStep(), 12u);
  EXPECT_EQ(train.getTrain().getLastCommittedStep(), 10);
  EXPECT_TRUE(train.getTrain().getElastic());
  auto generations = train.getTrain().getGenerations();
  ASSERT_EQ(generations.size(), 2u);
  EXPECT_EQ(Str(generations[0].getEnding()), "fault");
  EXPECT_EQ(Str(generations[0].getCauseKind()), "actor_exit");
  EXPECT_EQ(Str(generations[0].getCause()), "rank 1 on a killed by SIGKILL (signal 9) at step 8");
  EXPECT_EQ(generations[0].getConsequences().size(), 1u);
  EXPECT_EQ(generations[0].getStepsLost(), 3);
  EXPECT_EQ(Str(generations[1].getEnding()), "running");
  // A pending job shows why it waits in its error field.
  EXPECT_EQ(Str(status.getJobs()[1].getError()), "waiting for devices");
}

TEST_F(StatusViewTest, OneJobAskedForIsTheOnlyOneShown) {
  capnp::MallocMessageBuilder message;
  auto status = message.initRoot<wire::ClusterStatus>();
  const StatusSource source{cluster_, "", clock_.Now(), membership_, calibration_, jobs_, order_};
  FillStatus(status, source, "t-2", clock_.Now());
  ASSERT_EQ(status.getJobs().size(), 1u);
  EXPECT_EQ(Str(status.getJobs()[0].getJobId()), "t-2");
}

TEST_F(StatusViewTest, TheGaugesCountByState) {
  const ClusterGauges gauges = CountGauges(membership_, jobs_);
  EXPECT_EQ(gauges.nodes.at("alive"), 1);
  EXPECT_EQ(gauges.nodes.at("dead"), 1);
  EXPECT_EQ(gauges.devices.at({"cpu", "busy"}), 2);
  EXPECT_EQ(gauges.devices.at({"cpu", "dead"}), 1);
  EXPECT_EQ(gauges.jobs.at("running"), 1);
  EXPECT_EQ(gauges.jobs.at("pending"), 1);
  EXPECT_EQ(gauges.actors.at("spawning"), 2);
  ASSERT_EQ(gauges.train.count("t-1"), 1u);
  EXPECT_EQ(gauges.train.at("t-1").generation, 2);
  EXPECT_EQ(gauges.train.at("t-1").last_committed_step, 10);
}

}  // namespace
}  // namespace shardline::coordinator
