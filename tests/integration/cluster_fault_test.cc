// Liveness with real processes and real signals: a killed agent, a stopped actor, a silent
// coordinator, a restarted agent.
#include <signal.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "tests/integration/local_cluster.h"

namespace shardline::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// A comm-check that runs for minutes unless something stops it.
std::string LongJob(const std::string& name, int actors) {
  return "name: " + name + "\nkind: comm-check\nactors: " + std::to_string(actors) +
         "\ndevices: cpu\nrun_timeout_s: 600\n"
         "comm_check:\n  min_bytes: 4MiB\n  max_bytes: 4MiB\n  iterations: 1000\n"
         "  uneven_sizes: false\n";
}

// `shardline actor` whose rank $SHARDLINE_TEST_STOP_RANK stops itself as its bootstrap begins
// (tests/support/stopping_actor_main.cc).
std::string StoppingActorBinary() {
  const char* path = std::getenv("SHARDLINE_STOPPING_ACTOR");
  return path ? path : SHARDLINE_STOPPING_ACTOR_PATH;
}

bool Running(const json& job) { return job["state"] == "running" && job["phase"] == "running"; }

std::vector<pid_t> ActorPids(const json& job) {
  std::vector<pid_t> pids;
  for (const auto& actor : job["actors"]) pids.push_back(actor["pid"].get<pid_t>());
  return pids;
}

bool AllGone(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    bool any = false;
    for (pid_t pid : pids) any = any || ProcessAlive(pid);
    if (!any) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

TEST(ClusterFaultTest, KilledAgentIsDeadWithinTheTimeoutAndItsActorsAreLost) {
  LocalCluster::Options options;
  options.heartbeat_interval = 200ms;
  options.heartbeat_timeout = 1500ms;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("node-a", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  auto survivor = cluster.Submit(LongJob("survivor", 2));  // fills node-a
  ASSERT_TRUE(survivor.ok());
  auto b = cluster.StartAgent("node-b", "cpu:2");
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(2, 20s).ok());
  auto victim = cluster.Submit(LongJob("victim", 2));  // node-a is busy: lands on node-b
  ASSERT_TRUE(victim.ok());
  auto running = cluster.WaitForJob(*victim, Running, 60s);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(cluster.WaitForJob(*survivor, Running, 60s).ok());
  for (const auto& actor : (*running)["actors"]) ASSERT_EQ(actor["node_id"], "node-b");
  const auto victim_pids = ActorPids(*running);

  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(*b, SIGKILL), 0);
  auto failed = cluster.WaitForJobEnd(*victim, 10s);
  const auto detected_after = std::chrono::steady_clock::now() - killed_at;
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ((*failed)["state"], "failed");
  // Declared dead within the timeout, plus one heartbeat interval and the loop's tick.
  EXPECT_LT(detected_after, options.heartbeat_timeout + options.heartbeat_interval + 1000ms);
  const std::string error = (*failed)["error"];
  EXPECT_NE(error.find("generation 1: node node-b lost rank 0, rank 1 (no heartbeat for"),
            std::string::npos)
      << error;
  for (const auto& actor : (*failed)["actors"]) EXPECT_EQ(actor["state"], "lost") << actor.dump();

  auto status = cluster.Status();
  ASSERT_TRUE(status.ok());
  for (const auto& node : (*status)["nodes"]) {
    EXPECT_EQ(node["state"], node["node_id"] == "node-b" ? "dead" : "alive") << node.dump();
  }
  // The killed agent's actors died with it (no orphans), and the other job goes on.
  EXPECT_TRUE(AllGone(victim_pids, 5s));
  auto other = cluster.Job(*survivor);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)["state"], "running");
}

TEST(ClusterFaultTest, ActorStoppedDuringBootstrapFailsTheGenerationNamingIt) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  // The agent's actors are the stopping actor, and inherit its environment: rank 1 stops itself
  // (SIGSTOP) as its bootstrap begins.
  ASSERT_TRUE(cluster
                  .StartAgent("node-s", "cpu:2", {{"SHARDLINE_TEST_STOP_RANK", "1"}},
                              {"--actor-binary", StoppingActorBinary()})
                  .ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  auto job_id = cluster.Submit(
      "name: stopped\nkind: comm-check\nactors: 2\nbootstrap_timeout_s: 3\n"
      "comm_check:\n  max_bytes: 1KiB\n");
  ASSERT_TRUE(job_id.ok());
  auto job = cluster.WaitForJobEnd(*job_id, 30s);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ((*job)["state"], "failed");
  const std::string error = (*job)["error"];
  EXPECT_NE(error.find("generation 1: bootstrap timed out after 3.0 s"), std::string::npos)
      << error;
  EXPECT_NE(error.find("group world is missing rank 1 (node node-s, cpu:1"), std::string::npos) << error;
  EXPECT_NE(error.find("never joined"), std::string::npos) << error;
  EXPECT_NE(error.find("ranks 0 joined and waited"), std::string::npos) << error;
  EXPECT_EQ(error.find("rank 0 ("), std::string::npos) << "rank 0 was ready: " << error;
  // The agent killed the stopped actor when the generation was aborted.
  EXPECT_TRUE(AllGone(ActorPids(*job), 5s));
}

TEST(ClusterFaultTest, AgentKillsItsActorsWhenTheCoordinatorGoesSilent) {
  LocalCluster::Options options;
  options.heartbeat_interval = 200ms;
  options.heartbeat_timeout = 1500ms;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("node-c", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  auto job_id = cluster.Submit(LongJob("orphan-check", 2));
  ASSERT_TRUE(job_id.ok());
  auto job = cluster.WaitForJob(*job_id, Running, 60s);
  ASSERT_TRUE(job.ok()) << job.status();
  const auto pids = ActorPids(*job);

  ASSERT_EQ(::kill(cluster.coordinator_pid(), SIGSTOP), 0);
  const bool gone = AllGone(pids, 10s);
  ::kill(cluster.coordinator_pid(), SIGCONT);
  EXPECT_TRUE(gone) << cluster.Log("agent-node-c");
  EXPECT_NE(cluster.Log("agent-node-c").find("coordinator silent"), std::string::npos);
  // Once the coordinator answers again, the agent registers again and the node is alive.
  EXPECT_TRUE(cluster.WaitForAliveNodes(1, 10s).ok());
}

TEST(ClusterFaultTest, RestartedAgentReplacesItsOldEntry) {
  LocalCluster::Options options;
  options.heartbeat_interval = 100ms;
  options.heartbeat_timeout = 800ms;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  auto first = cluster.StartAgent("node-r", "cpu:2");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  ASSERT_EQ(::kill(*first, SIGKILL), 0);
  // The new agent is refused while the old entry is live, then accepted once it has expired.
  auto second = cluster.StartAgent("node-r", "cpu:3", {}, {"--connect-timeout-s", "10"});
  ASSERT_TRUE(second.ok());
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  bool replaced = false;
  while (!replaced && std::chrono::steady_clock::now() < deadline) {
    auto status = cluster.Status();
    if (status.ok() && (*status)["nodes"].size() == 1) {
      const auto& node = (*status)["nodes"][0];
      replaced = node["state"] == "alive" && node["devices"].size() == 3;
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(replaced) << cluster.Log("coordinator");
  EXPECT_TRUE(ProcessAlive(*second));
}

}  // namespace
}  // namespace shardline::testing
