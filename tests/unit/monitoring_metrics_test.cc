// MetricsServer and the metric structs, seen the way Prometheus sees them: through GET /metrics.
#include <sys/socket.h>

#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "monitoring/metrics.h"
#include "monitoring/metrics_server.h"
#include "monitoring/testing/http_get.h"

namespace shardline::monitoring {
namespace {

using testing::HttpGet;

// One sample of the text exposition format: name{labels} value.
struct Sample {
  std::string name;
  Labels labels;
  double value = 0;
};

// Parses the text exposition format (the subset prometheus-cpp writes: no timestamps needed).
std::vector<Sample> ParseExposition(const std::string& text) {
  std::vector<Sample> samples;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    Sample sample;
    size_t i = line.find_first_of("{ ");
    sample.name = line.substr(0, i);
    if (line[i] == '{') {
      ++i;
      while (line[i] != '}') {
        const size_t eq = line.find('=', i);
        const std::string name = line.substr(i, eq - i);
        std::string value;
        for (i = eq + 2; line[i] != '"'; ++i) {
          if (line[i] == '\\') ++i;
          value += line[i];
        }
        sample.labels[name] = value;
        ++i;                      // closing quote
        if (line[i] == ',') ++i;  // next label
      }
      ++i;  // closing brace
    }
    sample.value = std::stod(line.substr(i + 1));
    samples.push_back(std::move(sample));
  }
  return samples;
}

// The value of the one sample named `name` with exactly `labels`; nullopt when absent.
std::optional<double> Find(const std::vector<Sample>& samples, const std::string& name,
                           const Labels& labels) {
  for (const auto& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

Labels With(Labels base, const Labels& more) {
  for (const auto& [k, v] : more) base[k] = v;
  return base;
}

std::vector<Sample> ScrapeOverHttp(const MetricsServer& server) {
  auto response = HttpGet(server.address(), "/metrics");
  EXPECT_TRUE(response.ok()) << response.status();
  if (!response.ok()) return {};
  EXPECT_EQ(response->status, 200) << response->body;
  return ParseExposition(response->body);
}

TEST(MonitoringServerTest, ServesEveryStructOverHttp) {
  auto server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->serving());
  const std::string address = (*server)->address();
  ASSERT_TRUE(absl::StartsWith(address, "127.0.0.1:")) << address;
  EXPECT_NE(address, "127.0.0.1:0") << "address() must give the bound port";

  const Labels coordinator_labels = {{"component", "coordinator"}, {"node", "head"}};
  const Labels agent_labels = {{"component", "agent"}, {"node", "node-b"}};
  const Labels actor_labels = {
      {"component", "actor"}, {"job", "gpt-small"}, {"node", "node-b"}, {"rank", "3"}};

  WireMetrics wire((*server)->registry(), coordinator_labels);
  for (int i = 0; i < 3; ++i) wire.OnReceived("register");
  wire.OnSent("assignment");
  wire.OnSent("assignment");
  wire.OnDecodeError("truncated");
  wire.OnDecodeError("no-such-reason");  // counted as "unexpected"

  CoordinatorMetrics coordinator((*server)->registry(), coordinator_labels);
  coordinator.SetNodes({{"alive", 3}, {"dead", 1}});
  coordinator.SetNodes({{"alive", 4}});  // the dead node came back: "dead" must read 0
  coordinator.SetDevices({{{"cuda", "assigned"}, 6}, {{"cuda", "free"}, 2}});
  coordinator.SetDevices({{{"cuda", "assigned"}, 8}});
  coordinator.SetActors({{"running", 8}, {"lost", 1}});
  coordinator.SetJobs({{"running", 1}, {"succeeded", 2}});
  coordinator.OnHeartbeatMissed();
  coordinator.OnHeartbeatMissed();
  coordinator.OnKvOperation("set");
  coordinator.OnKvOperation("wait_timeout");
  coordinator.OnGeneration("aborted");
  coordinator.ObserveBootstrap("tp", 0.003);
  coordinator.ObserveBootstrap("tp", 42.0);

  AgentMetrics agent((*server)->registry(), agent_labels);
  agent.SetActorsRunning(2);
  agent.OnActorExit(ExitStatus{.signaled = true, .code = 9});
  agent.OnActorExit(ExitStatus{.signaled = false, .code = 0});
  agent.OnActorExit(ExitStatus{.signaled = false, .code = 3});
  agent.OnActorExit("failure");
  agent.OnHeartbeatSent();
  agent.OnCoordinatorLost();

  ActorMetrics actor((*server)->registry(), actor_labels);
  actor.OnOperation("allreduce", 1 << 20, 0.002, true);
  actor.OnOperation("allreduce", 1 << 20, 0.004, true);
  actor.OnOperation("allreduce", 4096, 60.0, false);
  actor.OnOperation("broadcast", 100, 0.00002, true);
  actor.SetStep(17);
  actor.SetLoss(2.5);
  actor.OnNetworkBytes("dp", 1000, 900);
  actor.OnNetworkBytes("dp", 24, 0);
  actor.OnNetworkBytes("tp", 0, 7);
  actor.OnNetworkBytes("no-such-kind", 5, 5);

  const std::vector<Sample> s = ScrapeOverHttp(**server);
  ASSERT_FALSE(s.empty());
  auto expect = [&](const std::string& name, const Labels& labels, double value) {
    const std::optional<double> got = Find(s, name, labels);
    ASSERT_TRUE(got.has_value()) << "no sample " << name << " with the expected labels";
    EXPECT_DOUBLE_EQ(*got, value) << name;
  };
  const Labels& c = coordinator_labels;

  expect("shardline_messages_received_total", With(c, {{"type", "register"}}), 3);
  expect("shardline_messages_sent_total", With(c, {{"type", "assignment"}}), 2);
  expect("shardline_decode_errors_total", With(c, {{"reason", "truncated"}}), 1);
  expect("shardline_decode_errors_total", With(c, {{"reason", "unexpected"}}), 1);
  expect("shardline_decode_errors_total", With(c, {{"reason", "garbage"}}), 0);  // pre-created
  EXPECT_FALSE(Find(s, "shardline_decode_errors_total", With(c, {{"reason", "no-such-reason"}})));

  expect("shardline_nodes", With(c, {{"state", "alive"}}), 4);
  expect("shardline_nodes", With(c, {{"state", "dead"}}), 0);
  expect("shardline_devices", With(c, {{"kind", "cuda"}, {"state", "assigned"}}), 8);
  expect("shardline_devices", With(c, {{"kind", "cuda"}, {"state", "free"}}), 0);
  expect("shardline_actors", With(c, {{"state", "running"}}), 8);
  expect("shardline_actors", With(c, {{"state", "lost"}}), 1);
  expect("shardline_actors", With(c, {{"state", "bootstrapping"}}), 0);
  expect("shardline_jobs", With(c, {{"state", "succeeded"}}), 2);
  expect("shardline_jobs", With(c, {{"state", "cancelled"}}), 0);
  expect("shardline_heartbeats_missed_total", c, 2);
  expect("shardline_kv_operations_total", With(c, {{"op", "set"}}), 1);
  expect("shardline_kv_operations_total", With(c, {{"op", "wait_timeout"}}), 1);
  expect("shardline_kv_operations_total", With(c, {{"op", "get"}}), 0);
  expect("shardline_generations_total", With(c, {{"outcome", "aborted"}}), 1);
  expect("shardline_bootstrap_seconds_count", With(c, {{"group_kind", "tp"}}), 2);
  expect("shardline_bootstrap_seconds_sum", With(c, {{"group_kind", "tp"}}), 42.003);
  expect("shardline_bootstrap_seconds_count", With(c, {{"group_kind", "dp"}}), 0);
  expect("shardline_bootstrap_seconds_bucket", With(c, {{"group_kind", "tp"}, {"le", "0.0025"}}),
         0);
  expect("shardline_bootstrap_seconds_bucket", With(c, {{"group_kind", "tp"}, {"le", "0.005"}}), 1);
  expect("shardline_bootstrap_seconds_bucket", With(c, {{"group_kind", "tp"}, {"le", "60"}}), 2);
  expect("shardline_bootstrap_seconds_bucket", With(c, {{"group_kind", "tp"}, {"le", "300"}}), 2);
  expect("shardline_bootstrap_seconds_bucket", With(c, {{"group_kind", "tp"}, {"le", "+Inf"}}), 2);

  expect("shardline_agent_actors_running", agent_labels, 2);
  expect("shardline_agent_actor_exits_total", With(agent_labels, {{"outcome", "signal"}}), 1);
  expect("shardline_agent_actor_exits_total", With(agent_labels, {{"outcome", "success"}}), 1);
  expect("shardline_agent_actor_exits_total", With(agent_labels, {{"outcome", "failure"}}), 2);
  expect("shardline_agent_heartbeats_sent_total", agent_labels, 1);
  expect("shardline_agent_coordinator_lost_total", agent_labels, 1);

  const Labels& a = actor_labels;
  expect("shardline_collective_bytes_total", With(a, {{"op", "allreduce"}}), 2 << 20);
  expect("shardline_collective_seconds_count", With(a, {{"op", "allreduce"}}), 2);
  expect("shardline_collective_seconds_sum", With(a, {{"op", "allreduce"}}), 0.006);
  expect("shardline_collective_seconds_bucket", With(a, {{"op", "allreduce"}, {"le", "0.0025"}}),
         1);
  expect("shardline_collective_seconds_bucket", With(a, {{"op", "broadcast"}, {"le", "2.5e-05"}}),
         1);
  expect("shardline_collective_errors_total", With(a, {{"op", "allreduce"}}), 1);
  EXPECT_FALSE(Find(s, "shardline_collective_errors_total", With(a, {{"op", "broadcast"}})))
      << "an op that never failed needs no error series";
  expect("shardline_actor_network_bytes_total",
         With(a, {{"group_kind", "dp"}, {"direction", "sent"}}), 1024);
  expect("shardline_actor_network_bytes_total",
         With(a, {{"group_kind", "dp"}, {"direction", "received"}}), 900);
  expect("shardline_actor_network_bytes_total",
         With(a, {{"group_kind", "tp"}, {"direction", "received"}}), 7);
  expect("shardline_actor_network_bytes_total",
         With(a, {{"group_kind", "pp"}, {"direction", "sent"}}), 0);  // pre-created
  expect("shardline_actor_network_bytes_total",
         With(a, {{"group_kind", "other"}, {"direction", "sent"}}), 5);
  EXPECT_FALSE(Find(s, "shardline_actor_network_bytes_total",
                    With(a, {{"group_kind", "no-such-kind"}, {"direction", "sent"}})))
      << "the group kind is a closed vocabulary";
  expect("shardline_actor_step", a, 17);
  expect("shardline_actor_loss", a, 2.5);
}

TEST(MonitoringServerTest, SecondServerOnTheSamePortIsAClearError) {
  auto first = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsServer::Start((*first)->address());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(),
            "metrics: cannot listen on " + (*first)->address() + ": address already in use");
  // The first server is unharmed.
  auto response = HttpGet((*first)->address(), "/metrics");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
}

TEST(MonitoringServerTest, BadAddressesAreErrorsThatNameTheAddress) {
  for (const std::string bad :
       {"no-port", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:http", "127.0.0.1:-1",
        "300.1.2.3:9100", "::1:9100", "[::zz]:9100", "no-such-host.invalid:9100"}) {
    auto server = MetricsServer::Start(bad);
    ASSERT_FALSE(server.ok()) << bad;
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(server.status().message(), "'" + bad + "'")) << server.status();
  }
  // Well formed, but not an address of this host.
  auto foreign = MetricsServer::Start("192.0.2.1:0");
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().message(),
            "metrics: cannot listen on 192.0.2.1:0: address not available on this host");
}

TEST(MonitoringServerTest, HostNamesAreResolved) {
  auto server = MetricsServer::Start("localhost:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(absl::StartsWith((*server)->address(), "127.0.0.1:")) << (*server)->address();
  auto response = HttpGet((*server)->address(), "/metrics");
  ASSERT_TRUE(response.ok()) << response.status();
}

TEST(MonitoringServerTest, Ipv6EitherServesOrSaysWhy) {
  auto server = MetricsServer::Start("[::1]:0");
  if (server.ok()) {
    EXPECT_TRUE(absl::StartsWith((*server)->address(), "[::1]:")) << (*server)->address();
    auto response = HttpGet((*server)->address(), "/metrics");
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->status, 200);
  } else {
    EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(absl::StartsWith(server.status().message(), "metrics: cannot listen on [::1]:0: "))
        << server.status();
    EXPECT_FALSE(absl::StrContains(server.status().message(), "CivetServer"))
        << "civetweb's own message says nothing a user can act on: " << server.status();
  }
}

TEST(MonitoringServerTest, EmptyAddressKeepsARegistryWithoutServing) {
  auto server = MetricsServer::Start("");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE((*server)->serving());
  EXPECT_EQ((*server)->address(), "");
  AgentMetrics agent((*server)->registry(), {{"component", "agent"}});
  agent.SetActorsRunning(5);
  const std::vector<Sample> s = ParseExposition((*server)->Scrape());
  EXPECT_EQ(Find(s, "shardline_agent_actors_running", {{"component", "agent"}}), 5);
}

TEST(MonitoringMetricsTest, StructsOutliveTheServer) {
  std::unique_ptr<WireMetrics> wire;
  {
    auto server = MetricsServer::Start("127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    wire = std::make_unique<WireMetrics>((*server)->registry(), Labels{});
  }
  wire->OnReceived("heartbeat");  // must not touch freed memory (checked under ASan)
}

TEST(MonitoringMetricsTest, ComponentsWithOtherConstantLabelsShareOneRegistry) {
  auto server = MetricsServer::Start("");
  ASSERT_TRUE(server.ok());
  // As in `shardline up` or an in-process test: coordinator and agent in one process.
  WireMetrics coordinator_wire((*server)->registry(), {{"component", "coordinator"}});
  WireMetrics agent_wire((*server)->registry(), {{"component", "agent"}});
  WireMetrics agent_wire_again((*server)->registry(), {{"component", "agent"}});
  coordinator_wire.OnSent("spawn_actors");
  agent_wire.OnReceived("spawn_actors");
  agent_wire_again.OnReceived("spawn_actors");  // same labels: the same series
  const std::vector<Sample> s = ParseExposition((*server)->Scrape());
  EXPECT_EQ(Find(s, "shardline_messages_sent_total",
                 {{"component", "coordinator"}, {"type", "spawn_actors"}}),
            1);
  EXPECT_EQ(Find(s, "shardline_messages_received_total",
                 {{"component", "agent"}, {"type", "spawn_actors"}}),
            2);
}

TEST(MonitoringMetricsTest, ConstantLabelThatClashesWithAMetricLabelIsRejected) {
  auto server = MetricsServer::Start("");
  ASSERT_TRUE(server.ok());
  EXPECT_THROW(WireMetrics((*server)->registry(), {{"type", "x"}}), std::invalid_argument);
  EXPECT_THROW(AgentMetrics((*server)->registry(), {{"__reserved", "x"}}), std::invalid_argument);
}

TEST(MonitoringMetricsTest, OpenLabelsAreCappedAndFoldIntoOther) {
  auto server = MetricsServer::Start("");
  ASSERT_TRUE(server.ok());
  WireMetrics wire((*server)->registry(), {});
  for (size_t i = 0; i < kMaxLabelValues + 10; ++i) wire.OnReceived("type" + std::to_string(i));
  const std::vector<Sample> s = ParseExposition((*server)->Scrape());
  size_t series = 0;
  for (const auto& sample : s) series += sample.name == "shardline_messages_received_total";
  EXPECT_EQ(series, kMaxLabelValues + 1);  // the first kMaxLabelValues, then "other"
  EXPECT_EQ(Find(s, "shardline_messages_received_total", {{"type", "other"}}), 10);
}

TEST(MonitoringMetricsTest, ConcurrentCallersLoseNoCounts) {
  auto server = MetricsServer::Start("");
  ASSERT_TRUE(server.ok());
  WireMetrics wire((*server)->registry(), {});
  ActorMetrics actor((*server)->registry(), {});
  constexpr int kThreads = 4;
  constexpr int kCalls = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        wire.OnReceived(i % 2 == 0 ? "heartbeat" : "step_report");
        actor.OnOperation(t % 2 == 0 ? "allreduce" : "allgather", 8, 1e-4, true);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const std::vector<Sample> s = ParseExposition((*server)->Scrape());
  EXPECT_EQ(Find(s, "shardline_messages_received_total", {{"type", "heartbeat"}}),
            kThreads * kCalls / 2);
  EXPECT_EQ(Find(s, "shardline_collective_seconds_count", {{"op", "allreduce"}}),
            kThreads / 2 * kCalls);
  EXPECT_EQ(Find(s, "shardline_collective_bytes_total", {{"op", "allgather"}}),
            8.0 * kThreads / 2 * kCalls);
}

}  // namespace
}  // namespace shardline::monitoring
