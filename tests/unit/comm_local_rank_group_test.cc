// comm::LocalRankGroup with followers that are real processes: shell commands that exit or hang
// (the failures rank 0 must name at once, or at its deadline, and clean up after), and forked
// children that join through the store and all-reduce with rank 0 (the spawn is passed in).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
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
  options.size = size;
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
  one.size = 1;
  auto group = LocalRankGroup::Start(one);
  ASSERT_TRUE(group.ok()) << group.status();
  std::atomic<bool> cancel{false};
  auto joined = (*group)->Join(cancel);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(*joined, nullptr);
  EXPECT_TRUE((*group)->Finish(std::chrono::seconds(1)).ok());
  LocalRankGroupOptions none;
  none.size = 0;
  EXPECT_FALSE(LocalRankGroup::Start(none).ok());
}

// Forked followers (this process has no threads yet) that join, all-reduce their rank + 1 with
// rank 0, and exit with `exit_code`.
LocalRankGroupOptions ForkedFollowers(int size, int exit_code) {
  LocalRankGroupOptions options;
  options.size = size;
  options.comm = Comm();
  options.command = [](int rank, const std::string& dir) {
    return std::vector<std::string>{std::to_string(rank), dir};
  };
  options.spawn = [size, exit_code](const SpawnOptions& spawn) -> absl::StatusOr<pid_t> {
    const int rank = std::stoi(spawn.argv[0]);
    const std::string dir = spawn.argv[1];
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    auto tp = JoinLocalRankGroup(dir, rank, size, Comm());
    if (!tp.ok()) ::_exit(100);
    float value = static_cast<float>(rank + 1);
    if (!(*tp)->AllReduce(&value, 1, DType::kFloat32, ReduceOp::kSum).ok()) ::_exit(101);
    ::_exit(value == size * (size + 1) / 2.0f ? exit_code : 102);
  };
  return options;
}

TEST(LocalRankGroupTest, FollowersJoinAndFinish) {
  auto group = LocalRankGroup::Start(ForkedFollowers(3, 0));
  ASSERT_TRUE(group.ok()) << group.status();
  std::atomic<bool> cancel{false};
  auto joined = (*group)->Join(cancel);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_NE(*joined, nullptr);
  EXPECT_EQ((*joined)->size(), 3);
  EXPECT_EQ((*joined)->rank(), 0);
  float value = 1.0f;
  ASSERT_TRUE((*joined)->AllReduce(&value, 1, DType::kFloat32, ReduceOp::kSum).ok());
  EXPECT_EQ(value, 6.0f);
  EXPECT_TRUE((*group)->Finish(std::chrono::seconds(10)).ok());
}

TEST(LocalRankGroupTest, FollowerThatExitsAfterJoiningIsReported) {
  auto group = LocalRankGroup::Start(ForkedFollowers(2, 7));
  ASSERT_TRUE(group.ok()) << group.status();
  std::atomic<bool> cancel{false};
  auto joined = (*group)->Join(cancel);
  ASSERT_TRUE(joined.ok()) << joined.status();
  float value = 1.0f;
  ASSERT_TRUE((*joined)->AllReduce(&value, 1, DType::kFloat32, ReduceOp::kSum).ok());
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
