// The bootstrap tracker (coordinator/bootstrap_tracker.h): ranks join and ready their groups, a
// group is ready once all its ranks are (timed from the generation's start on a manual clock),
// the generation once every group is, and at the deadline the report names the ranks that
// never came and counts those that waited.
#include "coordinator/bootstrap_tracker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/coordinator_test_jobs.h"

namespace shardline::coordinator {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing::LayOut;
using testing::MakeJob;

class BootstrapTrackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_ = MakeJob("parallel: {tp: 2, dp: 1}\n");
    LayOut(job_, {{"a", 0}, {"b", 0}}, clock_.Now());
    for (ActorRecord& actor : job_.actors) actor.state = ActorState::kRegistered;
  }
  GroupRecord& Group(const std::string& id, int rank) {
    auto group = MemberGroup(job_, id, rank);
    EXPECT_TRUE(group.ok()) << group.status();
    return **group;
  }
  ManualClock clock_;
  Job job_;
};

TEST_F(BootstrapTrackerTest, TheGenerationIsReadyWhenEveryGroupIs) {
  ASSERT_GE(job_.groups.size(), 2u);  // world, tp, pp and dp groups of a 2-rank layout
  clock_.Advance(250ms);
  int groups_ready = 0;
  bool generation_ready = false;
  for (int rank : {0, 1}) {
    for (GroupRecord& group : job_.groups) {
      OnJoin(group, job_.actors[rank]);
      EXPECT_EQ(job_.actors[rank].state, ActorState::kBootstrapping);
    }
  }
  for (int rank : {0, 1}) {
    for (GroupRecord& group : job_.groups) {
      if (!MemberGroup(job_, group.id, rank).ok()) continue;
      EXPECT_FALSE(generation_ready);
      const ReadyOutcome outcome = OnReady(job_, group, job_.actors[rank], clock_.Now());
      if (outcome.group_ready_seconds) {
        ++groups_ready;
        EXPECT_DOUBLE_EQ(*outcome.group_ready_seconds, 0.25);
      }
      generation_ready = generation_ready || outcome.generation_ready;
    }
  }
  EXPECT_EQ(groups_ready, static_cast<int>(job_.groups.size()));
  EXPECT_TRUE(generation_ready);
  EXPECT_EQ(job_.phase, Phase::kRunning);
  EXPECT_EQ(job_.actors[0].state, ActorState::kRunning);
  EXPECT_EQ(job_.actors[1].state, ActorState::kRunning);
  EXPECT_EQ(DescribeMissingRanks(job_), "");
  // A repeated report changes nothing.
  const ReadyOutcome again = OnReady(job_, job_.groups.front(), job_.actors[0], clock_.Now());
  EXPECT_FALSE(again.group_ready_seconds);
  EXPECT_FALSE(again.generation_ready);
}

TEST_F(BootstrapTrackerTest, AReportForAGroupTheRankIsNotInIsRefused) {
  auto none = MemberGroup(job_, "no-such-group", 0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  // Each rank's own pp group has only that rank in a tp-2 layout.
  const GroupRecord* pp_of_1 = nullptr;
  for (const GroupRecord& group : job_.groups) {
    if (group.kind == "pp" && group.ranks == std::vector<int>{1}) pp_of_1 = &group;
  }
  ASSERT_NE(pp_of_1, nullptr);
  auto foreign = MemberGroup(job_, pp_of_1->id, 0);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(foreign.status().message(), HasSubstr("rank 0 is not a member of group"));
}

TEST_F(BootstrapTrackerTest, TheDeadlineReportNamesWhoNeverCameAndCountsWhoWaited) {
  job_.actors[1].state = ActorState::kSpawning;  // never registered
  job_.actors[1].pid = 0;
  GroupRecord* world = nullptr;
  for (GroupRecord& group : job_.groups) {
    if (group.kind == "tp") world = &group;
  }
  ASSERT_NE(world, nullptr);
  OnJoin(*world, job_.actors[0]);
  const std::string report = DescribeMissingRanks(job_);
  EXPECT_THAT(report, HasSubstr("group " + world->id +
                                " is missing rank 1 (node b, cpu:0, never registered), while "
                                "ranks 0 joined and waited"));
  job_.actors[1].state = ActorState::kRegistered;
  job_.actors[1].pid = 42;
  EXPECT_THAT(DescribeMissingRanks(job_), HasSubstr("rank 1 (node b, cpu:0, pid 42, never joined)"));
}

}  // namespace
}  // namespace shardline::coordinator
