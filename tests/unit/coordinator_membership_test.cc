// Membership (coordinator/membership.h) on a manual clock: heartbeats keep a node alive and its
// silence past the timeout makes it dead (once); a second live agent cannot take a node's id; a
// node registering again is told apart — a restarted agent, another device set, the same agent
// after a lost reply (its held devices kept) — so the coordinator never merges new capacity
// into a running generation.
#include "coordinator/membership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/coordinator_test_jobs.h"

namespace shardline::coordinator {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::CpuNode;
using Rejoin = Membership::Rejoin;

TEST(MembershipTest, SilenceBeyondTheTimeoutMakesANodeDeadOnce) {
  ManualClock clock;
  Membership membership(1500ms);
  ASSERT_TRUE(membership.Register(CpuNode("a", 1), clock.Now()).ok());
  membership.Find("a")->devices[0].busy_job = "j-1";
  clock.Advance(1000ms);
  ASSERT_TRUE(membership.Heartbeat("a", "i1", clock.Now()).ok());
  clock.Advance(1499ms);
  EXPECT_TRUE(membership.ExpireSilentNodes(clock.Now()).empty());
  clock.Advance(1ms);
  EXPECT_THAT(membership.ExpireSilentNodes(clock.Now()), ElementsAre("a"));
  EXPECT_TRUE(membership.ExpireSilentNodes(clock.Now()).empty());
  EXPECT_FALSE(membership.Find("a")->alive);
  EXPECT_EQ(membership.Find("a")->devices[0].busy_job, "");  // a dead node holds nothing
  EXPECT_EQ(membership.Heartbeat("a", "i1", clock.Now()).code(), absl::StatusCode::kNotFound);
}

TEST(MembershipTest, ASecondLiveAgentCannotTakeANodesId) {
  ManualClock clock;
  Membership membership(1500ms);
  ASSERT_TRUE(membership.Register(CpuNode("a", 1, "i1"), clock.Now()).ok());
  auto second = membership.Register(CpuNode("a", 1, "i2"), clock.Now());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(second.status().message(), HasSubstr("pick another --node-id"));
  // Once the first is silent past the timeout, a new agent may take the id.
  clock.Advance(1500ms);
  auto restarted = membership.Register(CpuNode("a", 1, "i2"), clock.Now());
  ASSERT_TRUE(restarted.ok());
  EXPECT_EQ(*restarted, Rejoin::kAgentRestarted);
}

TEST(MembershipTest, ARegistrationAgainIsToldApart) {
  ManualClock clock;
  Membership membership(1500ms);
  ASSERT_EQ(*membership.Register(CpuNode("a", 2), clock.Now()), Rejoin::kNew);
  // Nothing held: the same agent again is just the node.
  ASSERT_EQ(*membership.Register(CpuNode("a", 2), clock.Now()), Rejoin::kNew);
  membership.Find("a")->devices[1].busy_job = "j-1";
  // The same agent after a lost reply: the generation keeps its device.
  ASSERT_EQ(*membership.Register(CpuNode("a", 2), clock.Now()), Rejoin::kSameAgent);
  EXPECT_EQ(membership.Find("a")->devices[1].busy_job, "j-1");
  // Another device set while a job holds one: new capacity, nothing held carried over.
  ASSERT_EQ(*membership.Register(CpuNode("a", 3), clock.Now()), Rejoin::kDevicesChanged);
  for (const DeviceInfo& device : membership.Find("a")->devices) EXPECT_EQ(device.busy_job, "");
  // Back after it was dead: new capacity.
  clock.Advance(2s);
  membership.ExpireSilentNodes(clock.Now());
  ASSERT_EQ(*membership.Register(CpuNode("a", 3), clock.Now()), Rejoin::kNew);
}

TEST(MembershipTest, ANodeWithoutDevicesIsRefused) {
  ManualClock clock;
  Membership membership(1500ms);
  EXPECT_EQ(membership.Register(CpuNode("a", 0), clock.Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(membership.Register(CpuNode("", 1), clock.Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::coordinator
