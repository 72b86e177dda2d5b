// The memory tier of checkpoints with real processes, signals and sockets: every K steps each rank
// copies its shard into its node's memory store (which outlives it) and, with memory_replicas, to
// a rank on another node. A killed actor or a lost node then costs the steps since the newest
// memory step, not since the newest disk step: the next generation fetches the files its boxes
// need from the nodes holding them, over the network, and resumes from there, ending where a
// fault-free run ends. A coordinator restart forgets the memory steps: the job resumes from disk.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "checkpoint/layout.h"
#include "tests/integration/local_cluster.h"
#include "tests/support/checkpoint_state.h"
#include "tests/support/net_namespaces.h"

namespace shardline::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using nlohmann::json;

constexpr int kSteps = 400;

// A small GPT on `parallel` saving to disk every `disk_interval` steps and, with `memory` (the
// checkpoint section's memory keys, e.g. "memory_interval: 1"), to memory; `elastic` is the
// elastic section's body (empty: not elastic).
std::string Job(const std::string& name, const std::string& dir, const std::string& parallel,
                const std::string& memory, const std::string& elastic, int disk_interval = 100) {
  std::string yaml = "name: " + name +
                     "\nkind: train\ndevices: cpu\nbootstrap_timeout_s: 30\n"
                     "model: {layers: 2, heads: 4, d_model: 32, max_seq_len: 16}\n"
                     "data: {synthetic: {seed: 2, bytes: 64KiB}}\n"
                     "optimizer: {lr: 1.0e-3, weight_decay: 0.1}\n"
                     "steps: " +
                     std::to_string(kSteps) +
                     "\nbatch: 8\nseq_len: 16\nseed: 3\n"
                     "checkpoint: {dir: " +
                     dir + ", interval: " + std::to_string(disk_interval) +
                     (memory.empty() ? "" : ", " + memory) +
                     "}\n"
                     "log_interval: 2\nparallel: " +
                     parallel + "\n";
  if (!elastic.empty()) yaml += "elastic: " + elastic + "\n";
  return yaml;
}

pid_t PidOfRank(const json& job, int rank) {
  for (const auto& actor : job["actors"]) {
    if (actor["rank"] == rank) return actor["pid"].get<pid_t>();
  }
  return 0;
}

// Training, with a memory step committed at `memory_step` or later.
bool PastMemoryStep(const json& job, int64_t memory_step) {
  return job["state"] == "running" && job["phase"] == "running" &&
         job["train"]["last_memory_step"].get<int64_t>() >= memory_step;
}

bool Over(const json& job) { return job["state"] != "running" && job["state"] != "pending"; }

json Ended(LocalCluster& cluster, const std::string& id) {
  auto job = cluster.WaitForJobEnd(id, 300s);
  EXPECT_TRUE(job.ok()) << job.status() << cluster.Log("coordinator");
  return job.ok() ? *job : json();
}

TEST(ClusterMemoryTest, AKilledActorResumesFromTheNodesMemoryAtTheStepItReachedLikeAFaultFreeRun) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("node-a", "cpu:2").ok());
  ASSERT_TRUE(cluster.StartAgent("node-b", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(2, 15s).ok());
  const std::string parallel = "{dp: 2}";
  const std::string reference_dir = cluster.dir() + "/reference";
  auto reference = cluster.Submit(Job("reference", reference_dir, parallel, "", ""));
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(Ended(cluster, *reference)["state"], "succeeded");

  // Disk steps every 100: a restart from disk would lose up to 100 steps; memory steps every one.
  const std::string dir = cluster.dir() + "/memory";
  auto id = cluster.Submit(
      Job("memory", dir, parallel, "memory_interval: 1", "{min_actors: 2, max_actors: 2}"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = cluster.WaitForJob(
      *id, [](const json& j) { return PastMemoryStep(j, 20) || Over(j); }, 120s);
  ASSERT_TRUE(running.ok()) << running.status() << cluster.Log("coordinator");
  ASSERT_EQ((*running)["state"], "running") << running->dump(2);
  EXPECT_LT((*running)["train"]["last_committed_step"].get<int64_t>(), 20);
  EXPECT_GT((*running)["train"]["memory_store_bytes"].get<uint64_t>(), 0u);
  const pid_t victim = PidOfRank(*running, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  const json job = Ended(cluster, *id);
  ASSERT_EQ(job["state"], "succeeded") << job.dump(2) << cluster.Log("coordinator");
  const json& generations = job["train"]["generations"];
  ASSERT_EQ(generations.size(), 2u) << job.dump(2);
  EXPECT_EQ(generations[0]["cause_kind"], "actor_exit");
  const json& second = generations[1];
  EXPECT_EQ(second["resumed_from"], "survivors") << job.dump(2);
  EXPECT_GE(second["resumed_step"].get<int64_t>(), 20);
  // Lost: the step in flight at most (a rank may have finished it before the kill reached it).
  EXPECT_LE(generations[0]["steps_lost"].get<int64_t>(), 1) << job.dump(2);
  std::cout << "memory recovery: " << generations[0]["cause"].get<std::string>()
            << "; resumed from " << second["resumed_from"] << " step " << second["resumed_step"]
            << ", " << generations[0]["steps_lost"] << " steps lost, next step "
            << generations[0]["recovery_seconds"] << " s after the fault" << std::endl;
  // The killed rank's device is avoided: the new generation spans both nodes, and the files its
  // ranks lacked came over the memory group.
  std::set<std::string> nodes;
  for (const json& actor : job["actors"]) nodes.insert(actor["node_id"].get<std::string>());
  EXPECT_EQ(nodes.size(), 2u) << job.dump(2);
  ExpectSameState(checkpoint::ManifestPath(dir, kSteps),
                  checkpoint::ManifestPath(reference_dir, kSteps));

  CommandResult status = RunShardline(
      {"status", *id, "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()});
  EXPECT_THAT(status.output,
              HasSubstr("resumed after step " +
                        std::to_string(second["resumed_step"].get<int64_t>()) + " (survivors)"));
  // The job's memory steps go with it.
  const auto gone = [&] {
    return !fs::exists(cluster.MemoryStore("node-a") + "/" + *id) &&
           !fs::exists(cluster.MemoryStore("node-b") + "/" + *id);
  };
  for (int i = 0; i < 100 && !gone(); ++i) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(gone());
}

// ZeRO 3 over two namespaced hosts, each shard's copy on the other: cutting one host's link loses
// its node, and the next generation (on the survivor and a spare host) takes the lost node's files
// from their copies on the survivor.
TEST(ClusterMemoryTest, ZeroThreeAcrossHostsResumesFromTheReplicaWhenAHostsLinkIsCut) {
  absl::StatusOr<NetNamespaces> hosts = NetNamespaces::Create(3);
  if (!hosts.ok()) GTEST_SKIP() << "cannot make network namespaces: " << hosts.status();
  LocalCluster::Options options;
  options.coordinator_host = hosts->address(0);
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  for (int host = 1; host <= 2; ++host) {
    ASSERT_TRUE(
        cluster.StartAgentIn(hosts->netns(host), "host-" + std::to_string(host), "cpu:1").ok());
  }
  ASSERT_TRUE(cluster.WaitForAliveNodes(2, 20s).ok()) << cluster.Log("coordinator");
  const std::string parallel = "{dp: 2, zero: 3}";
  const std::string reference_dir = cluster.dir() + "/reference";
  auto reference = cluster.Submit(Job("reference", reference_dir, parallel, "", ""));
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(Ended(cluster, *reference)["state"], "succeeded") << cluster.Log("coordinator");

  ASSERT_TRUE(cluster.StartAgentIn(hosts->netns(3), "host-3", "cpu:1").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(3, 20s).ok()) << cluster.Log("coordinator");
  constexpr int kMemoryInterval = 2;
  const std::string dir = cluster.dir() + "/replica";
  auto id = cluster.Submit(
      Job("replica", dir, parallel,
          "memory_interval: " + std::to_string(kMemoryInterval) + ", memory_replicas: 1",
          "{min_actors: 2, max_actors: 2}"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = cluster.WaitForJob(
      *id, [](const json& j) { return PastMemoryStep(j, 20) || Over(j); }, 120s);
  ASSERT_TRUE(running.ok()) << running.status() << cluster.Log("coordinator");
  ASSERT_EQ((*running)["state"], "running") << running->dump(2);
  // The host of rank 1 goes: its link cut, its node lost at the heartbeat timeout.
  const std::string lost = (*running)["actors"][1]["node_id"];
  const int lost_host = lost.back() - '0';
  ASSERT_TRUE(hosts->SetLink(lost_host, false).ok());

  const json job = Ended(cluster, *id);
  ASSERT_EQ(job["state"], "succeeded") << job.dump(2) << cluster.Log("coordinator");
  const json& generations = job["train"]["generations"];
  ASSERT_EQ(generations.size(), 2u) << job.dump(2);
  EXPECT_EQ(generations[0]["cause_kind"], "node_lost");
  EXPECT_EQ(generations[1]["resumed_from"], "memory replica") << job.dump(2);
  EXPECT_LE(generations[0]["steps_lost"].get<int64_t>(), kMemoryInterval) << job.dump(2);
  std::cout << "replica recovery: " << generations[0]["cause"].get<std::string>()
            << "; resumed from step " << generations[1]["resumed_step"] << ", "
            << generations[0]["steps_lost"] << " steps lost, next step "
            << generations[0]["recovery_seconds"] << " s after the abort (detection "
            << generations[0]["detection_seconds"] << " s)" << std::endl;
  for (const json& actor : job["actors"]) EXPECT_NE(actor["node_id"], lost);
  ExpectSameState(checkpoint::ManifestPath(dir, kSteps),
                  checkpoint::ManifestPath(reference_dir, kSteps));
}

// Data parallelism without ZeRO-3: every rank's memory step holds all it trains with, so the
// surviving nodes alone hold every box. A lost node scales the job in from dp 3 to dp 2 with no
// replica kept, and the survivors' memory step is resharded to the new plan as a disk step would
// be: the batch and the sample order stay, so the run ends near the fault-free dp 3 run (other
// sums, in fp32), having lost at most the step in flight.
TEST(ClusterMemoryTest, ALostNodeScalesInFromDpThreeToTwoResumingFromTheSurvivorsOntoTheNewPlan) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("node-a", "cpu:2").ok());
  auto b = cluster.StartAgent("node-b", "cpu:1");
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(2, 15s).ok());
  // A batch dp 3 and dp 2 both divide.
  const auto job = [&](const std::string& name, const std::string& memory,
                       const std::string& elastic) {
    std::string yaml = Job(name, cluster.dir() + "/" + name, "{dp: 3}", memory, elastic);
    const size_t batch = yaml.find("batch: 8");
    return yaml.replace(batch, 8, "batch: 12");
  };
  auto reference = cluster.Submit(job("reference", "", ""));
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(Ended(cluster, *reference)["state"], "succeeded");

  auto id = cluster.Submit(job("scale-in", "memory_interval: 1", "{min_actors: 2, max_actors: 3}"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = cluster.WaitForJob(
      *id, [](const json& j) { return PastMemoryStep(j, 20) || Over(j); }, 120s);
  ASSERT_TRUE(running.ok()) << running.status() << cluster.Log("coordinator");
  ASSERT_EQ((*running)["state"], "running") << running->dump(2);
  ASSERT_EQ(::kill(*b, SIGKILL), 0);  // node-b's agent and, with it, rank 2

  const json ended = Ended(cluster, *id);
  ASSERT_EQ(ended["state"], "succeeded") << ended.dump(2) << cluster.Log("coordinator");
  const json& generations = ended["train"]["generations"];
  ASSERT_EQ(generations.size(), 2u) << ended.dump(2);
  EXPECT_EQ(generations[1]["plan"], "tp 1 x pp 1 x dp 2, zero 0 on 2 actors");
  EXPECT_EQ(generations[1]["resumed_from"], "survivors") << ended.dump(2);
  EXPECT_LE(generations[0]["steps_lost"].get<int64_t>(), 1) << ended.dump(2);
  SameStateOptions loose;
  loose.skip_key_bias = true;
  ExpectSameState(checkpoint::ManifestPath(cluster.dir() + "/scale-in", kSteps),
                  checkpoint::ManifestPath(cluster.dir() + "/reference", kSteps), loose);
}

// A shard and its copy both lost (the two nodes of a dp 2 job killed at once): no memory step is
// whole on the nodes left, and the job resumes from disk on the spare one, saying which file was
// out of reach.
TEST(ClusterMemoryTest, AShardAndItsReplicaLostTogetherFallBackToDiskSayingWhy) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  auto a = cluster.StartAgent("node-a", "cpu:1");
  auto b = cluster.StartAgent("node-b", "cpu:1");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(cluster.StartAgent("node-c", "cpu:1").ok());  // the spare (nodes place in id order)
  ASSERT_TRUE(cluster.WaitForAliveNodes(3, 15s).ok());
  // ZeRO 3: each rank holds its own part only, so a node's part is on it and its buddy alone.
  // Disk steps every 50: once one is committed, the fault lands with the memory step ahead of it
  // (the next disk step is 50 steps away; the kill follows the poll at once).
  auto id = cluster.Submit(Job("both", cluster.dir() + "/both", "{dp: 2, zero: 3}",
                               "memory_interval: 1, memory_replicas: 1",
                               "{min_actors: 1, max_actors: 2}", /*disk_interval=*/50));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = cluster.WaitForJob(
      *id,
      [](const json& j) {
        return (j["train"]["last_committed_step"].get<int64_t>() >= 50 && PastMemoryStep(j, 51)) ||
               Over(j);
      },
      120s);
  ASSERT_TRUE(running.ok()) << running.status() << cluster.Log("coordinator");
  ASSERT_EQ((*running)["state"], "running") << running->dump(2);
  for (const json& actor : (*running)["actors"]) EXPECT_NE(actor["node_id"], "node-c");
  ASSERT_EQ(::kill(*a, SIGKILL), 0);
  ASSERT_EQ(::kill(*b, SIGKILL), 0);

  auto restarted = cluster.WaitForJob(
      *id,
      [](const json& j) {
        for (const json& g : j["train"]["generations"]) {
          if (g["generation"].get<int>() >= 2 && g["resumed_from"] != "") return true;
        }
        return Over(j);
      },
      120s);
  ASSERT_TRUE(restarted.ok()) << restarted.status() << cluster.Log("coordinator");
  const json& generations = (*restarted)["train"]["generations"];
  const json& next = generations[generations.size() - 1];
  EXPECT_EQ(next["resumed_from"], "disk") << restarted->dump(2);
  EXPECT_THAT(next["resume_note"].get<std::string>(),
              ::testing::ContainsRegex("memory step [0-9]+ was not used: rank-0000[01]"
                                       ".safetensors was held only on node-[ab], node-[ab], "
                                       "where this generation has no rank, and the files its "
                                       "nodes hold miss boxes of it"))
      << restarted->dump(2);
  ASSERT_EQ(RunShardline(
                {"cancel", *id, "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()})
                .exit_code,
            0);
}

// The memory steps live in the coordinator's memory: a coordinator restarted between the commit
// and the fault resumes the job from disk, and says why it did not use memory.
TEST(ClusterMemoryTest, ACoordinatorRestartFallsBackToDiskAndSaysSo) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("node-a", "cpu:2").ok());
  ASSERT_TRUE(cluster.StartAgent("node-b", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(2, 15s).ok());
  const std::string dir = cluster.dir() + "/restart";
  auto id = cluster.Submit(Job("restart", dir, "{dp: 2}", "memory_interval: 1",
                               "{min_actors: 2, max_actors: 2}", /*disk_interval=*/4));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = cluster.WaitForJob(
      *id,
      [](const json& j) {
        return (PastMemoryStep(j, 10) && j["train"]["last_committed_step"].get<int64_t>() >= 4) ||
               Over(j);
      },
      120s);
  ASSERT_TRUE(running.ok()) << running.status() << cluster.Log("coordinator");
  ASSERT_EQ((*running)["state"], "running") << running->dump(2);
  ASSERT_TRUE(cluster.RestartCoordinator().ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(2, 30s).ok()) << cluster.Log("coordinator");

  auto restarted = cluster.WaitForJob(
      *id,
      [](const json& j) {
        return (j["train"]["generations"].size() >= 2 && j["phase"] == "running") || Over(j);
      },
      120s);
  ASSERT_TRUE(restarted.ok()) << restarted.status() << cluster.Log("coordinator");
  const json& generations = (*restarted)["train"]["generations"];
  ASSERT_GE(generations.size(), 2u) << restarted->dump(2);
  const json& next = generations[generations.size() - 1];
  EXPECT_EQ(next["resumed_from"], "disk") << restarted->dump(2);
  EXPECT_THAT(next["resume_note"].get<std::string>(), HasSubstr("the coordinator restarted"));
  ASSERT_EQ(RunShardline(
                {"cancel", *id, "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()})
                .exit_code,
            0);
}

TEST(ClusterMemoryTest, ReplicasOnASingleNodeAreRefusedAtSubmitNamingTheKeyAndTheNodeCount) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("node-a", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 15s).ok());
  auto id = cluster.Submit(Job("single", cluster.dir() + "/single", "{dp: 2}",
                               "memory_interval: 1, memory_replicas: 1", ""));
  ASSERT_FALSE(id.ok());
  EXPECT_THAT(id.status().message(),
              HasSubstr("checkpoint.memory_replicas: 1 needs a second node to hold each shard's "
                        "copy, and the cluster has 1 alive node with cpu devices"));
}

}  // namespace
}  // namespace shardline::testing
