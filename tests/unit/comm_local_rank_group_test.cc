// comm::LocalRankGroup with followers that are real processes: shell commands that exit or hang
// (the failures rank 0 must name at once, or at its deadline, and clean up after), and forked
// children that join their world, tp and pp groups through the store (tp only, and tp × pp) and
// all-reduce over each with the other ranks of that group (the spawn is passed in).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/local_rank_group.h"

namespace shardline::comm {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

CpuCommOptions Comm() {
  CpuCommOptions options;
  options.gloo.timeout = std::chrono::seconds(20);
  options.shm.timeout = std::chrono::seconds(20);
  return options;
}

// Followers that run `script` under /bin/sh.
LocalRankGroupOptions ShellFollowers(int size, const std::string& script) {
  LocalRankGroupOptions options;
  options.tp = size;
  options.command = [script](int, const std::string&) {
    return std::vector<std::string>{"/bin/sh", "-c", script};
  };
  options.comm = Comm();
  return options;
}

bool Alive(pid_t pid) { return std::filesystem::exists("/proc/" + std::to_string(pid)); }

TEST(LocalRankGroupTest, FollowerThatExitsBeforeItIsReadyIsNamedAtOnce) {
  // Rank 1 fails; rank 2 would be ready some day.
  LocalRankGroupOptions options = ShellFollowers(3, "");
  options.command = [](int rank, const std::string&) {
    return std::vector<std::string>{"/bin/sh", "-c", rank == 1 ? "exit 3" : "exec sleep 60"};
  };
  auto group = LocalRankGroup::Start(std::move(options));
  ASSERT_TRUE(group.ok()) << group.status();
  const std::string dir = (*group)->store_dir();
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  std::atomic<bool> cancel{false};
  const auto start = Clock::now();
  auto joined = (*group)->Join(cancel);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(joined.status())) << joined.status();
  EXPECT_THAT(joined.status().message(),
              HasSubstr("rank 1 exited before it was ready (exit code 3)"));
  group->reset();
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(LocalRankGroupTest, FollowerNeverReadyMeetsTheDeadlineAndIsKilled) {
  LocalRankGroupOptions options = ShellFollowers(2, "exec sleep 60");
  options.ready_timeout = std::chrono::milliseconds(300);
  pid_t follower = -1;
  options.spawn = [&follower](const SpawnOptions& spawn) {
    absl::StatusOr<pid_t> pid = Spawn(spawn);
    if (pid.ok()) follower = *pid;
    return pid;
  };
  auto group = LocalRankGroup::Start(std::move(options));
  ASSERT_TRUE(group.ok()) << group.status();
  std::atomic<bool> cancel{false};
  auto joined = (*group)->Join(cancel);
  EXPECT_TRUE(absl::IsDeadlineExceeded(joined.status())) << joined.status();
  EXPECT_THAT(joined.status().message(), HasSubstr("rank 1 not ready"));
  ASSERT_GT(follower, 0);
  EXPECT_TRUE((*group)->CheckFollowers().ok());
  group->reset();
  EXPECT_FALSE(Alive(follower)) << "the group left its follower running";
}

TEST(LocalRankGroupTest, JoinEndsWhenCancelled) {
  auto group = LocalRankGroup::Start(ShellFollowers(2, "exec sleep 60"));
  ASSERT_TRUE(group.ok()) << group.status();
  std::atomic<bool> cancel{true};
  EXPECT_TRUE(absl::IsCancelled((*group)->Join(cancel).status()));
}

TEST(LocalRankGroupTest, OneRankIsNoGroup) {
  LocalRankGroupOptions one;
  auto group = LocalRankGroup::Start(one);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->size(), 1);
  std::atomic<bool> cancel{false};
  auto joined = (*group)->Join(cancel);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_NE(*joined, nullptr);
  EXPECT_EQ((*joined)->world, nullptr);
  EXPECT_EQ((*joined)->tp, nullptr);
  EXPECT_EQ((*joined)->pp, nullptr);
  EXPECT_TRUE((*group)->Finish(std::chrono::seconds(1)).ok());
  for (const auto& [tp, pp] : {std::pair{0, 1}, std::pair{1, 0}, std::pair{-2, 2}}) {
    LocalRankGroupOptions bad;
    bad.tp = tp;
    bad.pp = pp;
    auto started = LocalRankGroup::Start(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(started.status())) << tp << " x " << pp;
  }
}

// The communicators of the kinds world, tp, pp that `rank`'s groups of `grid` have (a group of
// one has none), each with the sum over the group of every member's rank + 1, as an all-reduce
// of rank + 1 must give.
struct Expected {
  std::string kind;
  Communicator* communicator;
  int index, size;
  float sum;
};
std::vector<Expected> ExpectedGroups(const placement::RankGrid& grid, int rank,
                                     const RankCommunicators& c) {
  std::vector<Expected> out;
  for (const placement::CommGroup& g : grid.GroupsOf(rank)) {
    if (g.ranks.size() == 1) continue;
    Communicator* communicator = g.kind == "world" ? c.world.get()
                                 : g.kind == "tp"  ? c.tp.get()
                                 : g.kind == "pp"  ? c.pp.get()
                                                   : nullptr;
    const int index =
        static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), rank) - g.ranks.begin());
    const float sum = std::accumulate(g.ranks.begin(), g.ranks.end(), 0.0f,
                                      [](float s, int r) { return s + r + 1; });
    out.push_back({g.kind, communicator, index, static_cast<int>(g.ranks.size()), sum});
  }
  return out;
}

// Forked followers (this process has no threads yet) of a tp × pp layout that join, all-reduce
// their rank + 1 over each of their groups, and exit with `exit_code` when every group gave its
// sum (100 + the failed check otherwise).
LocalRankGroupOptions ForkedFollowers(int tp, int pp, int exit_code) {
  LocalRankGroupOptions options;
  options.tp = tp;
  options.pp = pp;
  options.comm = Comm();
  options.command = [](int rank, const std::string& dir) {
    return std::vector<std::string>{std::to_string(rank), dir};
  };
  options.spawn = [tp, pp, exit_code](const SpawnOptions& spawn) -> absl::StatusOr<pid_t> {
    const int rank = std::stoi(spawn.argv[0]);
    const std::string dir = spawn.argv[1];
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    const placement::RankGrid grid = *placement::RankGrid::Create(tp, pp, 1);
    auto joined = JoinLocalRankGroup(dir, rank, grid, Comm());
    if (!joined.ok()) ::_exit(100);
    for (const Expected& e : ExpectedGroups(grid, rank, *joined)) {
      if (e.communicator == nullptr) ::_exit(101);
      if (e.communicator->rank() != e.index || e.communicator->size() != e.size) ::_exit(102);
      float value = static_cast<float>(rank + 1);
      if (!e.communicator->AllReduce(&value, 1, DType::kFloat32, ReduceOp::kSum).ok()) {
        ::_exit(103);
      }
      if (value != e.sum) ::_exit(104);
    }
    ::_exit(exit_code);
  };
  return options;
}

// Rank 0's side of ForkedFollowers: every group it is in, with its all-reduce.
void CheckRankZero(const LocalRankGroup& group, const RankCommunicators& joined) {
  for (const Expected& e : ExpectedGroups(group.grid(), 0, joined)) {
    SCOPED_TRACE(e.kind);
    ASSERT_NE(e.communicator, nullptr);
    EXPECT_EQ(e.communicator->rank(), 0);
    EXPECT_EQ(e.communicator->size(), e.size);
    float value = 1.0f;
    ASSERT_TRUE(e.communicator->AllReduce(&value, 1, DType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_EQ(value, e.sum);
  }
}

TEST(LocalRankGroupTest, FollowersJoinAndFinish) {
  auto group = LocalRankGroup::Start(ForkedFollowers(3, 1, 0));
  ASSERT_TRUE(group.ok()) << group.status();
  std::atomic<bool> cancel{false};
  auto joined = (*group)->Join(cancel);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_NE(*joined, nullptr);
  // One stage: the world and the tensor-parallel group are the same three ranks; no pipeline.
  ASSERT_NE((*joined)->world, nullptr);
  ASSERT_NE((*joined)->tp, nullptr);
  EXPECT_EQ((*joined)->pp, nullptr);
  EXPECT_EQ((*joined)->world->size(), 3);
  CheckRankZero(**group, **joined);
  EXPECT_TRUE((*group)->Finish(std::chrono::seconds(10)).ok());
}

// tp 2 × pp 2: rank r is (tp index r % 2, stage r / 2); each rank's world, stage and pipeline
// groups all-reduce over their own members.
TEST(LocalRankGroupTest, TensorAndPipelineGroupsJoinAndFinish) {
  auto group = LocalRankGroup::Start(ForkedFollowers(2, 2, 0));
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->size(), 4);
  std::atomic<bool> cancel{false};
  auto joined = (*group)->Join(cancel);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_NE((*joined)->world, nullptr);
  ASSERT_NE((*joined)->tp, nullptr);
  ASSERT_NE((*joined)->pp, nullptr);
  EXPECT_EQ((*joined)->world->size(), 4);
  EXPECT_EQ((*joined)->tp->size(), 2);
  EXPECT_EQ((*joined)->pp->size(), 2);
  CheckRankZero(**group, **joined);
  EXPECT_TRUE((*group)->Finish(std::chrono::seconds(10)).ok()) << "a follower's check failed";
}

// Only stages, one rank each: a world and a pipeline group, no tensor-parallel one.
TEST(LocalRankGroupTest, PipelineOnlyHasNoTensorParallelGroup) {
  auto group = LocalRankGroup::Start(ForkedFollowers(1, 2, 0));
  ASSERT_TRUE(group.ok()) << group.status();
  std::atomic<bool> cancel{false};
  auto joined = (*group)->Join(cancel);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_NE((*joined)->world, nullptr);
  EXPECT_EQ((*joined)->tp, nullptr);
  ASSERT_NE((*joined)->pp, nullptr);
  CheckRankZero(**group, **joined);
  EXPECT_TRUE((*group)->Finish(std::chrono::seconds(10)).ok()) << "a follower's check failed";
}

TEST(LocalRankGroupTest, FollowerThatExitsAfterJoiningIsReported) {
  auto group = LocalRankGroup::Start(ForkedFollowers(2, 1, 7));
  ASSERT_TRUE(group.ok()) << group.status();
  std::atomic<bool> cancel{false};
  auto joined = (*group)->Join(cancel);
  ASSERT_TRUE(joined.ok()) << joined.status();
  CheckRankZero(**group, **joined);
  absl::Status followers;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((followers = (*group)->CheckFollowers()).ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(absl::IsUnavailable(followers)) << followers;
  EXPECT_THAT(followers.message(), HasSubstr("rank 1 exited: exit code 7"));
  const absl::Status finished = (*group)->Finish(std::chrono::seconds(1));
  EXPECT_THAT(finished.message(), HasSubstr("rank 1 exited: exit code 7"));
}

}  // namespace
}  // namespace shardline::comm
