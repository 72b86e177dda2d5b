// Several hosts for real: each agent in a network namespace of its own (ip netns + veth on a
// bridge, made and removed by the test), the coordinator on the bridge's address, actors talking
// Gloo across the namespaces by their hosts' addresses. A job spans the hosts; cutting one host's
// link mid-training loses that node and the job goes on with the other; restoring it brings the
// node back and the job grows back onto it. Skipped, with the reason, where namespaces cannot be
// made (no root, no `ip`).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "tests/integration/local_cluster.h"
#include "tests/support/net_namespaces.h"

namespace shardline::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using nlohmann::json;

TEST(ClusterMultiHostTest, ACutLinkLosesTheNodeTheJobGoesOnAndGrowsBackWhenItReturns) {
  absl::StatusOr<NetNamespaces> hosts = NetNamespaces::Create(2);
  if (!hosts.ok()) GTEST_SKIP() << "cannot make network namespaces: " << hosts.status();
  LocalCluster::Options options;
  options.coordinator_host = hosts->address(0);
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgentIn(hosts->netns(1), "host-1", "cpu:2").ok());
  ASSERT_TRUE(cluster.StartAgentIn(hosts->netns(2), "host-2", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(2, 20s).ok()) << cluster.Log("coordinator")
                                                      << cluster.Log("agent-host-2");
  // Each node registered from its own namespace's address.
  auto status = cluster.Status();
  ASSERT_TRUE(status.ok());
  std::set<std::string> addresses;
  for (const auto& node : (*status)["nodes"]) addresses.insert(node["address"].get<std::string>());
  EXPECT_EQ(addresses, (std::set<std::string>{hosts->address(1), hosts->address(2)}));

  auto id = cluster.Submit(
      "name: spans\nkind: train\ndevices: cpu\nbootstrap_timeout_s: 30\n"
      "model: {layers: 2, heads: 4, d_model: 32, max_seq_len: 16}\n"
      "data: {synthetic: {seed: 2, bytes: 64KiB}}\n"
      "steps: 100000\nbatch: 8\nseq_len: 16\nlog_interval: 2\n"
      "checkpoint: {dir: " + cluster.dir() + "/ckpt, interval: 4, keep: 2}\n"
      "parallel: {tp: 1, dp: 4}\nelastic: {min_actors: 2, max_actors: 4}\n");
  ASSERT_TRUE(id.ok()) << id.status();
  auto spanning = cluster.WaitForJob(
      *id,
      [](const json& j) {
        return j["phase"] == "running" && j["train"]["last_committed_step"].get<int64_t>() >= 4;
      },
      90s);
  ASSERT_TRUE(spanning.ok()) << spanning.status() << cluster.Log("coordinator");
  std::set<std::string> nodes;
  for (const auto& actor : (*spanning)["actors"]) nodes.insert(actor["node_id"].get<std::string>());
  EXPECT_EQ(nodes.size(), 2u) << "the job spans both hosts";
  // Two ranks per namespaced host: shared memory inside each, Gloo between them.
  EXPECT_THAT(cluster.Log("coordinator"),
              ContainsRegex("generation 1: group dp-t0-p0 ready in [0-9.]+ s over shm\\+gloo"));

  // Cut host 2 off: declared lost after the heartbeat timeout, the job goes on on host 1.
  ASSERT_TRUE(hosts->SetLink(2, false).ok());
  auto alone = cluster.WaitForJob(
      *id,
      [](const json& j) {
        return j["generation"].get<int>() >= 2 && j["phase"] == "running" && j["world_size"] == 2;
      },
      60s);
  ASSERT_TRUE(alone.ok()) << alone.status() << cluster.Log("coordinator");
  const json& cut = (*alone)["train"]["generations"][0];
  EXPECT_EQ(cut["cause_kind"], "node_lost") << alone->dump(2);
  EXPECT_THAT(cut["cause"].get<std::string>(), HasSubstr("node host-2 lost"));
  for (const auto& actor : (*alone)["actors"]) EXPECT_EQ(actor["node_id"], "host-1");
  EXPECT_THAT(cluster.Log("coordinator"),
              ContainsRegex("generation 2: group dp-t0-p0 ready in [0-9.]+ s over shm\n"));
  const int64_t step_alone = (*alone)["train"]["step"];
  auto progressed = cluster.WaitForJob(
      *id, [&](const json& j) { return j["train"]["step"].get<int64_t>() > step_alone + 4; }, 60s);
  ASSERT_TRUE(progressed.ok()) << progressed.status();

  // Restore it: the node re-registers and the job grows back onto it at its next commit.
  ASSERT_TRUE(hosts->SetLink(2, true).ok());
  auto back = cluster.WaitForJob(
      *id,
      [](const json& j) { return j["phase"] == "running" && j["world_size"] == 4; }, 90s);
  ASSERT_TRUE(back.ok()) << back.status() << cluster.Log("coordinator")
                         << cluster.Log("agent-host-2");
  const json& generations = (*back)["train"]["generations"];
  EXPECT_EQ(generations[generations.size() - 2]["ending"], "grow") << back->dump(2);
  nodes.clear();
  for (const auto& actor : (*back)["actors"]) nodes.insert(actor["node_id"].get<std::string>());
  EXPECT_EQ(nodes.size(), 2u);
  EXPECT_EQ(RunShardline(
                {"cancel", *id, "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()})
                .exit_code,
            0);
}

// The address rule (protocol/address_rule.h): each host has a second interface that does not
// route to the coordinator, and no GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME is set; every node
// advertises, and its actors' Gloo pairs use, the address of the interface that does.
TEST(ClusterMultiHostTest, EachHostAdvertisesTheInterfaceThatRoutesToTheCoordinator) {
  absl::StatusOr<NetNamespaces> hosts = NetNamespaces::Create(2);
  if (!hosts.ok()) GTEST_SKIP() << "cannot make network namespaces: " << hosts.status();
  ASSERT_TRUE(hosts->AddDecoyInterface(1).ok());
  ASSERT_TRUE(hosts->AddDecoyInterface(2).ok());
  unsetenv("GLOO_SOCKET_IFNAME");
  unsetenv("NCCL_SOCKET_IFNAME");
  LocalCluster::Options options;
  options.coordinator_host = hosts->address(0);
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgentIn(hosts->netns(1), "host-1", "cpu:1").ok());
  ASSERT_TRUE(cluster.StartAgentIn(hosts->netns(2), "host-2", "cpu:1").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(2, 20s).ok()) << cluster.Log("coordinator");
  auto status = cluster.Status();
  ASSERT_TRUE(status.ok());
  std::map<std::string, std::string> addresses;
  for (const auto& node : (*status)["nodes"]) {
    addresses[node["node_id"].get<std::string>()] = node["address"].get<std::string>();
  }
  EXPECT_EQ(addresses, (std::map<std::string, std::string>{{"host-1", hosts->address(1)},
                                                           {"host-2", hosts->address(2)}}));
  EXPECT_THAT(cluster.Log("agent-host-2"), HasSubstr("node host-2 advertises " + hosts->address(2) +
                                                     " (the interface eth0 routes to"));

  auto id = cluster.Submit(
      "name: routed\nkind: comm-check\nactors: 2\ndevices: cpu\nbackend: gloo\n"
      "bootstrap_timeout_s: 20\ncomm_check: {max_bytes: 64KiB}\n");
  ASSERT_TRUE(id.ok()) << id.status();
  auto done = cluster.WaitForJobEnd(*id, 90s);
  ASSERT_TRUE(done.ok()) << done.status() << cluster.Log("coordinator");
  EXPECT_EQ((*done)["state"], "succeeded") << done->dump(2);
  EXPECT_THAT(cluster.Log("coordinator"),
              ContainsRegex("group world ready in [0-9.]+ s over gloo"));
  // Each actor registered the address its Gloo pairs listen on: its host's routed one.
  std::set<std::string> actor_addresses;
  for (const auto& actor : (*done)["actors"]) {
    actor_addresses.insert(actor["address"].get<std::string>());
  }
  EXPECT_EQ(actor_addresses, (std::set<std::string>{hosts->address(1), hosts->address(2)}));
}

// Advertised addresses the others cannot reach (each host told to advertise its decoy; of a
// pair Gloo dials one side only, so both are wrong here): the job fails within its bootstrap
// deadline, naming each node, its address and how it was chosen.
TEST(ClusterMultiHostTest, AnUnreachableAdvertisedAddressIsNamedWithinTheBootstrapDeadline) {
  absl::StatusOr<NetNamespaces> hosts = NetNamespaces::Create(2);
  if (!hosts.ok()) GTEST_SKIP() << "cannot make network namespaces: " << hosts.status();
  LocalCluster::Options options;
  options.coordinator_host = hosts->address(0);
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  for (int host : {1, 2}) {
    ASSERT_TRUE(hosts->AddDecoyInterface(host).ok());
    ASSERT_TRUE(cluster
                    .StartAgentIn(hosts->netns(host), "host-" + std::to_string(host), "cpu:1",
                                  {"--advertise-address", hosts->decoy_address(host)})
                    .ok());
  }
  ASSERT_TRUE(cluster.WaitForAliveNodes(2, 20s).ok()) << cluster.Log("coordinator");
  const auto started = std::chrono::steady_clock::now();
  auto id = cluster.Submit(
      "name: unreachable\nkind: comm-check\nactors: 2\ndevices: cpu\nbackend: gloo\n"
      "bootstrap_timeout_s: 8\n");
  ASSERT_TRUE(id.ok()) << id.status();
  auto done = cluster.WaitForJobEnd(*id, 60s);
  ASSERT_TRUE(done.ok()) << done.status() << cluster.Log("coordinator");
  EXPECT_EQ((*done)["state"], "failed") << done->dump(2);
  const std::string error = (*done)["error"];
  for (int host : {1, 2}) {
    EXPECT_THAT(error, HasSubstr("host-" + std::to_string(host) + " " + hosts->decoy_address(host) +
                                 " (--advertise-address)"))
        << error;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 40s) << error;
}

}  // namespace
}  // namespace shardline::testing
