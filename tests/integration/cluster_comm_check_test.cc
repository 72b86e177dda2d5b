// comm-check across real processes: a coordinator, two agents with two CPU devices each, four
// actors running every collective over every size, each verified against a local reference.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "placement/job_spec.h"
#include "protocol/rpc_client.h"
#include "tests/integration/local_cluster.h"
#include "worker/actor/actor.h"
#include "worker/actor/coordinator_store.h"
#include "worker/comm/communicator.h"

namespace shardline::testing {
namespace {

using namespace std::chrono_literals;

TEST(ClusterCommCheckTest, TwoAgentsTwoDevicesEachRunEveryCollective) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("node-a", "cpu:2").ok());
  ASSERT_TRUE(cluster.StartAgent("node-b", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(2, 20s).ok());

  auto job_id = cluster.Submit(
      "name: check\nkind: comm-check\nactors: 4\ndevices: cpu\n"
      "comm_check:\n  min_bytes: 4\n  max_bytes: 1MiB\n  iterations: 2\n  uneven_sizes: true\n");
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto job = cluster.WaitForJobEnd(*job_id, 180s);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ((*job)["state"], "succeeded") << job->dump(2) << cluster.Log("coordinator");

  // Ranks fill node-a first: ranks 0,1 there, 2,3 on node-b.
  std::set<std::string> nodes;
  for (const auto& actor : (*job)["actors"]) {
    EXPECT_EQ(actor["state"], "succeeded");
    nodes.insert(actor["node_id"].get<std::string>());
  }
  EXPECT_EQ(nodes, (std::set<std::string>{"node-a", "node-b"}));
  EXPECT_EQ((*job)["actors"][0]["node_id"], "node-a");
  EXPECT_EQ((*job)["actors"][3]["node_id"], "node-b");

  // Every op at every size, every one verified.
  placement::CommCheckSpec spec;
  spec.min_bytes = 4;
  spec.max_bytes = 1 << 20;
  const auto sizes = placement::CommCheckSizesBytes(spec);
  std::map<std::string, int> per_op;
  std::set<uint64_t> all_reduce_sizes;
  for (const auto& result : (*job)["results"]) {
    EXPECT_TRUE(result["ok"].get<bool>()) << result.dump();
    EXPECT_EQ(result["ranks"], 4);
    per_op[result["op"].get<std::string>()]++;
    if (result["op"] == "all_reduce_sum") all_reduce_sizes.insert(result["bytes"].get<uint64_t>());
    if (result["bytes"].get<uint64_t>() >= (1u << 20)) {
      EXPECT_GT(result["bus_gbps"].get<double>(), 0);
    }
  }
  for (auto op : placement::kCommCheckOps) {
    EXPECT_EQ(per_op[std::string(op)], op == "barrier" ? 1 : static_cast<int>(sizes.size())) << op;
  }
  // Uneven element counts were exercised (3 and 1000 and 65537 elements).
  EXPECT_TRUE(all_reduce_sizes.count(12));
  EXPECT_TRUE(all_reduce_sizes.count(4000));
  EXPECT_TRUE(all_reduce_sizes.count(262148));
}

TEST(ClusterCommCheckTest, TheStoreTakesActorKeysOnlyFromARunningGenerationInsideItsPrefix) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("node-k", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  // A job that runs for a while: generation 1 of it is live.
  auto job_id = cluster.Submit(
      "name: fenced\nkind: comm-check\nactors: 2\ncomm_check:\n  min_bytes: 4MiB\n"
      "  max_bytes: 4MiB\n  iterations: 1000\n  uneven_sizes: false\n");
  ASSERT_TRUE(job_id.ok());
  ASSERT_TRUE(cluster
                  .WaitForJob(*job_id, [](const auto& j) { return j["phase"] == "running"; }, 60s)
                  .ok());
  // Rank 0's token, as its agent gave it (its environment; the test runs as root): what a
  // process holding the node's key but not the token cannot present.
  auto job = cluster.Job(*job_id);
  ASSERT_TRUE(job.ok());
  std::string token;
  for (const auto& a : (*job)["actors"]) {
    if (a["rank"] != 0) continue;
    std::ifstream environ("/proc/" + std::to_string(a["pid"].get<pid_t>()) + "/environ");
    std::string entry;
    while (std::getline(environ, entry, '\0')) {
      if (entry.rfind(std::string(actor::kActorTokenEnv) + "=", 0) == 0) {
        token = absl::HexStringToBytes(entry.substr(entry.find('=') + 1));
      }
    }
  }
  // (unsetenv in the actor leaves /proc's copy of its initial environment as it was.)
  const auto store_as = [&](const std::string& sender, const std::string& key,
                            const std::string& with_token) {
    auto client =
        protocol::RpcClient::Connect(cluster.endpoint(), "shardline", sender, cluster.node_curve());
    if (!client.ok()) return client.status();
    (*client)->set_actor_token(with_token);
    actor::CoordinatorStore store(**client);
    return store.Set(key, "x");
  };
  const std::string prefix = "job/" + *job_id + "/gen/1/";
  const std::string rank0 = "actor/" + *job_id + "/1/0";
  ASSERT_EQ(token.size(), 16u) << "rank 0's environment holds no token";
  EXPECT_TRUE(store_as(rank0, prefix + "probe", token).ok());
  // The node's key without the token, another rank's name, another generation's: refused.
  for (const auto& [sender, with_token] : std::vector<std::pair<std::string, std::string>>{
           {rank0, ""},
           {rank0, std::string(16, 'x')},
           {"actor/" + *job_id + "/1/1", token},
           {"actor/" + *job_id + "/0/0", token}}) {
    absl::Status refused = store_as(sender, prefix + "probe", with_token);
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << sender << ": " << refused;
  }
  // Not an actor at all: the job namespaces are closed to it.
  absl::Status stranger = store_as("agent/node-k", prefix + "probe", "");
  EXPECT_EQ(stranger.code(), absl::StatusCode::kPermissionDenied) << stranger;
  // A live actor with its token, writing into another job's namespace: refused.
  absl::Status outside = store_as(rank0, "job/other/gen/1/probe", token);
  EXPECT_EQ(outside.code(), absl::StatusCode::kPermissionDenied) << outside;
  EXPECT_GE(ScrapeSum(cluster.metrics_address(), "shardline_auth_refusals_total",
                      "reason=\"token\""),
            5);
  ASSERT_EQ(RunShardline({"cancel", *job_id, "--coordinator", cluster.endpoint(), "--keys",
                          cluster.key_dir()})
                .exit_code,
            0);
}

TEST(ClusterCommCheckTest, NcclUniqueIdIsFannedOutThroughTheCoordinator) {
  if (!comm::NcclBuilt()) GTEST_SKIP() << "this build has no NCCL (configured without CUDA)";
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  // Three ranks, each with its own connection, exchange the id through the coordinator's store
  // the way actors do; ncclGetUniqueId needs no GPU. Outside job/: those keys are only for the
  // job's actors, with their tokens, and there is no job here.
  constexpr int kRanks = 3;
  std::vector<std::string> ids(kRanks);
  std::vector<absl::Status> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      auto client =
          protocol::RpcClient::Connect(cluster.endpoint(), "shardline",
                                       "nccl-test/" + std::to_string(rank), cluster.node_curve());
      if (!client.ok()) {
        errors[rank] = client.status();
        return;
      }
      actor::CoordinatorStore store(**client);
      comm::PrefixStore group(std::string("nccl-test/world"), store);
      auto id = comm::ExchangeNcclUniqueId(group, rank, 20s);
      if (id.ok())
        ids[rank] = *id;
      else
        errors[rank] = id.status();
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < kRanks; ++rank) ASSERT_TRUE(errors[rank].ok()) << errors[rank];
  ASSERT_EQ(ids[0].size(), 128u);
  EXPECT_NE(ids[0], std::string(128, '\0'));
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);
}

TEST(ClusterCommCheckTest, CudaJobWaitsForCudaDevicesAndSaysSo) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("cpu-only", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  auto job_id = cluster.Submit("name: gpu\nkind: comm-check\nactors: 2\ndevices: cuda\n");
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  std::this_thread::sleep_for(300ms);
  auto job = cluster.Job(*job_id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ((*job)["state"], "pending");
  EXPECT_EQ((*job)["backend"], "nccl");
  EXPECT_NE((*job)["error"].get<std::string>().find("2 free cuda devices (0 free of 0 alive)"),
            std::string::npos)
      << job->dump();
}

TEST(ClusterCommCheckTest, EveryProcessServesItsMetricsAndCancelStopsTheJob) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("metered", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  auto job_id = cluster.Submit(
      "name: metered\nkind: comm-check\nactors: 2\n"
      "comm_check:\n  min_bytes: 4MiB\n  max_bytes: 4MiB\n  iterations: 1000\n"
      "  uneven_sizes: false\n  ops: [all_reduce_sum]\n");
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto job = cluster.WaitForJob(
      *job_id, [](const nlohmann::json& j) { return j["phase"] == "running"; }, 60s);
  ASSERT_TRUE(job.ok()) << job.status();

  // Polls a metric until `ok` holds (up to 5 s); returns the last value. Counters and the
  // coordinator's gauges (refreshed every 250 ms) get there on their own schedule.
  auto eventually = [](const std::string& address, const std::string& metric,
                       const std::string& labels, const std::function<bool(double)>& ok) {
    double value = -1;
    for (int i = 0; i < 100; ++i) {
      value = ScrapeSum(address, metric, labels);
      if (ok(value)) break;
      std::this_thread::sleep_for(50ms);
    }
    return value;
  };
  auto positive = [](double v) { return v > 0; };
  auto equals = [](double want) { return [want](double v) { return v == want; }; };

  // An actor: bytes moved by its all-reduces, labelled with its job and rank.
  const std::string actor = (*job)["actors"][0]["metrics_address"];
  // Loopback unless the agent is told otherwise (--actor-metrics-host).
  EXPECT_EQ(actor.rfind("127.0.0.1:", 0), 0u) << actor;
  EXPECT_GT(eventually(actor, "shardline_collective_bytes_total", "op=\"all_reduce\"", positive), 0);
  EXPECT_GE(eventually(actor, "shardline_collective_seconds_count", "rank=\"0\"", positive), 1);
  // The agent: heartbeats sent, actors running.
  auto status = cluster.Status();
  ASSERT_TRUE(status.ok());
  const std::string agent = (*status)["nodes"][0]["metrics_address"];
  EXPECT_EQ(agent.rfind("127.0.0.1:", 0), 0u) << agent;
  EXPECT_GT(eventually(agent, "shardline_agent_heartbeats_sent_total", "node=\"metered\"", positive), 0);
  EXPECT_EQ(eventually(agent, "shardline_agent_actors_running", "node=\"metered\"", equals(2)), 2);
  // The coordinator: cluster gauges, the bootstrap histogram, the store, the wire.
  const std::string coordinator = cluster.metrics_address();
  EXPECT_EQ(eventually(coordinator, "shardline_nodes", "state=\"alive\"", equals(1)), 1);
  EXPECT_EQ(eventually(coordinator, "shardline_actors", "state=\"running\"", equals(2)), 2);
  EXPECT_EQ(eventually(coordinator, "shardline_bootstrap_seconds_count", "group_kind=\"world\"",
                       equals(1)), 1);
  EXPECT_GT(eventually(coordinator, "shardline_kv_operations_total", "op=\"set\"", positive), 0);
  EXPECT_GT(eventually(coordinator, "shardline_messages_received_total", "type=\"heartbeat\"",
                       positive), 0);

  auto cancel = RunShardline(
      {"cancel", *job_id, "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
  auto ended = cluster.WaitForJobEnd(*job_id, 10s);
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ((*ended)["state"], "cancelled");
  for (const auto& a : (*ended)["actors"]) {
    const pid_t pid = a["pid"].get<pid_t>();
    for (int i = 0; i < 200 && ProcessAlive(pid); ++i) std::this_thread::sleep_for(25ms);
    EXPECT_FALSE(ProcessAlive(pid)) << "actor " << pid << " outlived its cancelled job";
  }
}

TEST(ClusterCommCheckTest, RestartedCoordinatorKeepsItsHistoryAndAgentsRejoin) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("steadfast", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  auto first = cluster.Submit("name: before\nkind: comm-check\nactors: 2\n"
                              "comm_check:\n  max_bytes: 4KiB\n");
  ASSERT_TRUE(first.ok());
  auto done = cluster.WaitForJobEnd(*first, 60s);
  ASSERT_TRUE(done.ok());
  ASSERT_EQ((*done)["state"], "succeeded");

  ASSERT_TRUE(cluster.RestartCoordinator().ok());
  // The agent's heartbeats are refused by the new coordinator; it registers again.
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok()) << cluster.Log("agent-steadfast");
  auto history = cluster.Job(*first);
  ASSERT_TRUE(history.ok()) << history.status();
  EXPECT_EQ((*history)["state"], "succeeded");
  EXPECT_EQ((*history)["results"].size(), (*done)["results"].size());
  auto second = cluster.Submit("name: after\nkind: comm-check\nactors: 2\n"
                               "comm_check:\n  max_bytes: 4KiB\n");
  ASSERT_TRUE(second.ok());
  EXPECT_NE(*second, *first);
  auto again = cluster.WaitForJobEnd(*second, 60s);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)["state"], "succeeded");
}

}  // namespace
}  // namespace shardline::testing
