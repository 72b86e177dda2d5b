// The authenticated control plane on a real cluster: CURVE by default, refusals with their
// reasons (told to the peer, counted by the coordinator), roles per key, the allowlist reloaded
// on SIGHUP, and a flood of unauthenticated connections while a job trains.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "protocol/channel.h"
#include "protocol/curve.h"
#include "protocol/rpc_client.h"
#include "tests/integration/local_cluster.h"

namespace shardline::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A key dir with the cluster's coordinator.key and a fresh identity `name` of its own, not on
// the cluster's allowlist: a client that knows the server but is not known to it.
std::string StrangerKeys(const LocalCluster& cluster, const std::string& name) {
  const fs::path dir = fs::path(cluster.dir()) / ("stranger-" + name);
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
  fs::copy_file(protocol::KeyDir{cluster.key_dir()}.CoordinatorPublic(),
                protocol::KeyDir{dir}.CoordinatorPublic());
  auto pair = protocol::GenerateCurveKeyPair();
  EXPECT_TRUE(pair.ok());
  EXPECT_TRUE(protocol::WriteCurveKeyPair(dir, "client", *pair).ok());
  return dir.string();
}

std::string PublicKeyOf(const std::string& key_dir) {
  return protocol::ReadCurveKeyPair(
             protocol::KeyDir{key_dir}.IdentitySecret(protocol::PeerRole::kClient))
      ->public_key;
}

double Refusals(LocalCluster& cluster, const std::string& reason) {
  return ScrapeSum(cluster.metrics_address(), "shardline_auth_refusals_total",
                   "reason=\"" + reason + "\"");
}

// Polls until the coordinator has counted `count` refusals for `reasons` together (they are
// counted as the handshakes fail, a moment after the client gave up).
bool WaitForRefusals(LocalCluster& cluster, const std::vector<std::string>& reasons,
                     double count) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    double counted = 0;
    for (const std::string& reason : reasons) counted += Refusals(cluster, reason);
    if (counted >= count) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}
bool WaitForRefusals(LocalCluster& cluster, const std::string& reason, double count) {
  return WaitForRefusals(cluster, std::vector<std::string>{reason}, count);
}

int64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

int CountOf(const std::string& text, const std::string& what) {
  int count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

// SIGHUPs the coordinator and waits for its log to say it reloaded.
void ReloadAllowlist(LocalCluster& cluster) {
  const int before = CountOf(cluster.Log("coordinator"), "SIGHUP: reloaded");
  ASSERT_EQ(::kill(cluster.coordinator_pid(), SIGHUP), 0);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (CountOf(cluster.Log("coordinator"), "SIGHUP: reloaded") <= before) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << cluster.Log("coordinator");
    std::this_thread::sleep_for(20ms);
  }
}

TEST(ClusterSecurityTest, KeylessWrongAndUnlistedPeersAreRefusedWithTheReasonAndCounted) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  const std::string endpoint = cluster.endpoint();

  // No keys at all.
  auto keyless = RunShardline({"status", "--coordinator", endpoint, "--insecure"}, 20s);
  EXPECT_EQ(keyless.exit_code, 1);
  EXPECT_NE(keyless.output.find("requires CURVE keys and this process has none"), std::string::npos)
      << keyless.output;
  auto keyless_agent = RunShardline({"agent", "--coordinator", endpoint, "--devices", "cpu:1",
                                     "--insecure", "--connect-timeout-s", "1"},
                                    20s);
  EXPECT_EQ(keyless_agent.exit_code, 1);
  EXPECT_NE(keyless_agent.output.find("requires CURVE keys"), std::string::npos)
      << keyless_agent.output;
  // Each is refused and counted: as no_curve when the coordinator read the peer's greeting first,
  // as handshake when the peer had read the coordinator's and hung up before (the coordinator's
  // next write fails with EPIPE: common on a loaded machine). protocol_curve_test checks no_curve.
  EXPECT_TRUE(WaitForRefusals(cluster, std::vector<std::string>{"no_curve", "handshake"}, 2));
  const double handshakes_before = Refusals(cluster, "handshake");

  // Keys of another cluster: the coordinator's key is wrong, so the handshake cannot complete.
  const std::string other = cluster.dir() + "/other-keys";
  ASSERT_EQ(RunShardline({"keygen", "--out", other}).exit_code, 0);
  auto wrong =
      RunShardline({"status", "--coordinator", endpoint, "--keys", other, "--timeout-s", "1"}, 20s);
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_NE(wrong.output.find("CURVE handshake with " + endpoint + " failed"), std::string::npos)
      << wrong.output;
  EXPECT_TRUE(WaitForRefusals(cluster, "handshake", handshakes_before + 1));

  // The right coordinator key, an identity the coordinator does not know.
  const std::string stranger = StrangerKeys(cluster, "one");
  auto unlisted = RunShardline({"status", "--coordinator", endpoint, "--keys", stranger}, 20s);
  EXPECT_EQ(unlisted.exit_code, 1);
  EXPECT_NE(unlisted.output.find("refused this process's CURVE key " + PublicKeyOf(stranger)),
            std::string::npos)
      << unlisted.output;
  EXPECT_NE(unlisted.output.find("not on its allowlist"), std::string::npos) << unlisted.output;
  EXPECT_TRUE(WaitForRefusals(cluster, "unknown_key", 1));
  // Logged once, with the key and where it came from.
  EXPECT_NE(
      cluster.Log("coordinator").find("key " + PublicKeyOf(stranger) + " is not on the allowlist"),
      std::string::npos);

  // A key file open to others is refused before anything is sent.
  const fs::path loose = fs::path(cluster.key_dir()) / "client.key_secret";
  fs::permissions(loose, fs::perms::others_read, fs::perm_options::add);
  auto open = RunShardline({"status", "--coordinator", endpoint, "--keys", cluster.key_dir()});
  EXPECT_EQ(open.exit_code, 1);
  EXPECT_NE(open.output.find("chmod 600"), std::string::npos) << open.output;
  fs::permissions(loose, fs::perms::others_read, fs::perm_options::remove);

  // And the cluster's own client is served all along.
  auto served = RunShardline({"status", "--coordinator", endpoint, "--keys", cluster.key_dir()});
  EXPECT_EQ(served.exit_code, 0) << served.output;
}

TEST(ClusterSecurityTest, EachKeyMayDoOnlyWhatItsRoleAllows) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  const protocol::KeyDir keys{cluster.key_dir()};

  // A client key registering a node.
  auto as_node =
      RunShardline({"agent", "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir(),
                    "--key", keys.IdentitySecret(protocol::PeerRole::kClient).string(), "--devices",
                    "cpu:1", "--connect-timeout-s", "5"},
                   20s);
  EXPECT_EQ(as_node.exit_code, 1);
  EXPECT_NE(as_node.output.find("has role client, which may not send register_node"),
            std::string::npos)
      << as_node.output;

  // A node key submitting a job.
  const std::string spec = cluster.dir() + "/check.yaml";
  std::ofstream(spec) << "name: check\nkind: comm-check\nactors: 2\n";
  auto as_client = RunShardline({"submit", spec, "--coordinator", cluster.endpoint(), "--keys",
                                 cluster.key_dir(), "--key",
                                 keys.IdentitySecret(protocol::PeerRole::kNode).string()});
  EXPECT_EQ(as_client.exit_code, 1);
  EXPECT_NE(as_client.output.find("has role node, which may not send submit_job"),
            std::string::npos)
      << as_client.output;
  EXPECT_EQ(Refusals(cluster, "role"), 2);

  auto status = cluster.Status();
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE((*status)["nodes"].empty()) << status->dump();
  EXPECT_TRUE((*status)["jobs"].empty()) << status->dump();
}

TEST(ClusterSecurityTest, AllowlistReloadAddsAndRemovesAKeyLive) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  const std::string alice = StrangerKeys(cluster, "alice");
  const std::string alice_key = PublicKeyOf(alice);
  const fs::path allowlist = protocol::KeyDir{cluster.key_dir()}.Allowlist();
  const std::string original = [&] {
    std::ifstream in(allowlist);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }();
  auto status_as_alice = [&] {
    return RunShardline({"status", "--coordinator", cluster.endpoint(), "--keys", alice}, 20s);
  };

  EXPECT_EQ(status_as_alice().exit_code, 1);

  std::ofstream(allowlist, std::ios::app) << "client " << alice_key << " alice\n";
  ReloadAllowlist(cluster);
  auto added = status_as_alice();
  EXPECT_EQ(added.exit_code, 0) << added.output;
  EXPECT_NE(cluster.Log("coordinator").find("1 added, 0 removed"), std::string::npos);

  // A connection made while she was listed...
  auto curve = protocol::LoadClientCurve(protocol::KeyDir{alice}, protocol::PeerRole::kClient);
  ASSERT_TRUE(curve.ok()) << curve.status();
  auto connected = protocol::RpcClient::Connect(cluster.endpoint(), "shardline", "alice", &*curve);
  ASSERT_TRUE(connected.ok());
  auto request = (*connected)->NewMessage();
  request->payload().initStatusRequest();
  ASSERT_TRUE((*connected)->Call(*request, 10s).ok());

  // ... loses its rights with the key, not only at its next connection.
  std::ofstream(allowlist, std::ios::trunc) << original;
  ReloadAllowlist(cluster);
  EXPECT_EQ(status_as_alice().exit_code, 1);
  auto again = (*connected)->NewMessage();
  again->payload().initStatusRequest();
  auto refused = (*connected)->Call(*again, 10s);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
  EXPECT_NE(refused.status().message().find("no longer on the coordinator's allowlist"),
            std::string::npos);
  EXPECT_GE(Refusals(cluster, "removed_key"), 1);

  // A broken allowlist keeps the old one, and says why.
  std::ofstream(allowlist, std::ios::app) << "root " << alice_key << "\n";
  ASSERT_EQ(::kill(cluster.coordinator_pid(), SIGHUP), 0);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (cluster.Log("coordinator").find("kept the old allowlist") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << cluster.Log("coordinator");
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_NE(cluster.Log("coordinator").find("unknown role 'root'"), std::string::npos);
  auto served =
      RunShardline({"status", "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()});
  EXPECT_EQ(served.exit_code, 0) << served.output;
}

TEST(ClusterSecurityTest, ANodeIdBelongsToTheNodeKeyThatRegisteredIt) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("host-a", "cpu:1").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok()) << cluster.Log("agent-host-a");
  auto added = RunShardline(
      {"keygen", "--out", cluster.key_dir(), "--name", "host-b", "--role", "node"});
  ASSERT_EQ(added.exit_code, 0) << added.output;
  ReloadAllowlist(cluster);
  const std::string host_b_key = cluster.key_dir() + "/host-b.key_secret";
  auto agent_as = [&](const std::string& node_id) {
    return RunShardline({"agent", "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir(),
                         "--key", host_b_key, "--devices", "cpu:1", "--node-id", node_id,
                         "--connect-timeout-s", "5"},
                        20s);
  };

  // Another listed node key taking host-a's id is refused, and says how to hand it over.
  auto taken = agent_as("host-a");
  EXPECT_EQ(taken.exit_code, 1);
  EXPECT_NE(taken.output.find("node host-a belongs to key 'node', which registered it; key "
                              "'host-b' may not register it"),
            std::string::npos)
      << taken.output;
  EXPECT_EQ(Refusals(cluster, "node_key"), 1);

  // Nor may it heartbeat for host-a (which would keep a dead node alive in its place).
  auto curve = protocol::LoadClientCurve(protocol::KeyDir{cluster.key_dir()},
                                         protocol::PeerRole::kNode, host_b_key);
  ASSERT_TRUE(curve.ok()) << curve.status();
  auto connected =
      protocol::RpcClient::Connect(cluster.endpoint(), "shardline", "host-b", &*curve);
  ASSERT_TRUE(connected.ok()) << connected.status();
  auto heartbeat = (*connected)->NewMessage();
  heartbeat->payload().initHeartbeat().setNodeId("host-a");
  auto refused = (*connected)->Call(*heartbeat, 10s);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_EQ(Refusals(cluster, "node_key"), 2);

  // host-a is still the first agent's, and alive.
  auto status = cluster.Status();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ((*status)["nodes"].size(), 1u) << status->dump();
  EXPECT_EQ((*status)["nodes"][0]["state"], "alive") << status->dump();

  // With the first key off the allowlist, the id is free for another key.
  const fs::path allowlist = protocol::KeyDir{cluster.key_dir()}.Allowlist();
  std::stringstream kept;
  {
    std::ifstream in(allowlist);
    for (std::string line; std::getline(in, line);) {
      if (line.size() < 5 || line.substr(line.size() - 5) != " node") kept << line << "\n";
    }
  }
  std::ofstream(allowlist, std::ios::trunc) << kept.str();
  ReloadAllowlist(cluster);
  EXPECT_NE(cluster.Log("coordinator").find("0 added, 1 removed"), std::string::npos)
      << kept.str();
  // (Registered once the old agent, refused since its key left, is declared dead.)
  auto handed_over = cluster.StartAgent("host-a", "cpu:1", {}, {"--key", host_b_key});
  ASSERT_TRUE(handed_over.ok());
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (CountOf(cluster.Log("coordinator"), "node host-a registered from") < 2) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << cluster.Log("coordinator");
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(Refusals(cluster, "node_key"), 2);
}

// One unauthenticated attempt over raw TCP: a ZMTP 3.0 greeting of the NULL mechanism (a ZeroMQ
// peer without keys), or bytes that are not ZMTP at all. Reads the server's greeting (so the
// server has the connection) and hangs up.
void KnockWithoutKeys(uint16_t port, bool zmtp) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  timeval timeout{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    char greeting[64] = {};
    if (zmtp) {
      greeting[0] = static_cast<char>(0xff);
      greeting[9] = 0x7f;
      greeting[10] = 3;  // version 3.0
      memcpy(greeting + 12, "NULL", 4);
    } else {
      snprintf(greeting, sizeof(greeting), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    (void)!::write(fd, greeting, sizeof(greeting));
    char reply[64];
    (void)!::read(fd, reply, sizeof(reply));
  }
  ::close(fd);
}

TEST(ClusterSecurityTest, TenThousandUnauthenticatedConnectionsLeaveTheJobAndMemoryAlone) {
  LocalCluster::Options options;
  options.measures_memory = true;  // the coordinator's RSS, below (asserted outside ASan only)
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("steady", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  auto job_id = cluster.Submit(
      "name: flood\nkind: train\ndevices: cpu\nactors: 2\n"
      "model:\n  layers: 2\n  heads: 4\n  d_model: 32\n  max_seq_len: 32\n"
      "data:\n  synthetic:\n    seed: 7\n    bytes: 256KiB\n"
      // Far more steps than the flood lasts on any machine: the job is cancelled once the
      // flood has been shown not to stop it (a fixed count raced the flood, and lost on a
      // faster CI machine).
      "steps: 10000000\nbatch: 4\nseq_len: 32\nlog_interval: 10\n"
      "parallel:\n  tp: 1\n  pp: 1\n  dp: 2\n");
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  ASSERT_TRUE(cluster
                  .WaitForJob(
                      *job_id,
                      [](const nlohmann::json& job) {
                        return job["phase"] == "running" || job["state"] != "running";
                      },
                      120s)
                  .ok());
  const uint16_t port = static_cast<uint16_t>(
      std::stoi(cluster.endpoint().substr(cluster.endpoint().rfind(':') + 1)));

  // Strangers with real CURVE keys of their own: each handshake costs the coordinator its crypto
  // and a ZAP decision.
  auto knock_with_a_random_key = [&] {
    protocol::ClientCurve stranger;
    stranger.server_public_key = cluster.client_curve()->server_public_key;
    stranger.keys = *protocol::GenerateCurveKeyPair();
    auto dealer = protocol::Channel::Connect(cluster.endpoint(), &stranger);
    ASSERT_TRUE(dealer.ok());
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while ((*dealer)->handshake_failure().empty() && std::chrono::steady_clock::now() < deadline) {
      (void)(*dealer)->Receive(10ms);
    }
  };
  constexpr int kAttempts = 10000, kWarmUp = 1000, kWithKeys = 500;
  int made = 0;
  auto knock = [&](int count) {
    for (int i = 0; i < count; ++i, ++made) {
      if (made % 20 == 0) {
        knock_with_a_random_key();
      } else {
        KnockWithoutKeys(port, made % 20 != 1);
      }
    }
  };
  const auto step_before = cluster.Job(*job_id);
  ASSERT_TRUE(step_before.ok());
  knock(kWarmUp);
  const int64_t rss_warm = ResidentBytes(cluster.coordinator_pid());
  const auto flood_started = std::chrono::steady_clock::now();
  knock(kAttempts - kWarmUp);
  const double flood_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - flood_started).count();
  const int64_t rss_after = ResidentBytes(cluster.coordinator_pid());
  printf(
      "flood: %d attempts (%d with random CURVE keys) in %.1f s; coordinator RSS %.1f MiB "
      "after %d, %.1f MiB after all\n",
      kAttempts, kWithKeys, flood_seconds, rss_warm / 1048576.0, kWarmUp, rss_after / 1048576.0);
  ASSERT_GT(rss_warm, 0);
  // Flat: 9,000 more refused connections leave at most a few MiB of allocator slack. Not under
  // AddressSanitizer: there the coordinator's RSS grows by about 21 KiB per refused connection
  // (71 -> 265 MiB over this flood, keyless connections alone too) with its quarantine off, no
  // malloc stacks kept and release to the OS on, where the normal build's RSS and virtual size
  // stay flat (20.3 -> 20.3 MiB). Not explained yet; printed above for the sanitizer run's log.
  if (!kAddressSanitizer) {
    EXPECT_LT(rss_after - rss_warm, 8 << 20) << rss_warm << " -> " << rss_after;
  }

  // Every kind of stranger was turned away and counted.
  EXPECT_TRUE(WaitForRefusals(cluster, "unknown_key", kWithKeys * 0.9));
  EXPECT_TRUE(WaitForRefusals(cluster, "no_curve", (kAttempts - 2 * kWithKeys) * 0.9));
  // (Bytes that are not ZMTP never reach a handshake: libzmq drops them uncounted.)
  printf("refusals: no_curve %.0f, unknown_key %.0f, handshake %.0f\n",
         Refusals(cluster, "no_curve"), Refusals(cluster, "unknown_key"),
         Refusals(cluster, "handshake"));
  // Unknown keys are logged once each, at most 256 of them.
  EXPECT_LE(CountOf(cluster.Log("coordinator"), "is not on the allowlist"), 256);

  // The job trained through it, in its first generation (the flood caused no restart), and
  // still stops cleanly when asked.
  auto during = cluster.Job(*job_id);
  ASSERT_TRUE(during.ok());
  EXPECT_EQ((*during)["state"], "running") << during->dump();
  EXPECT_EQ((*during)["generation"], 1) << during->dump();
  EXPECT_GT((*during)["train"]["step"].get<int64_t>(),
            (*step_before)["train"]["step"].get<int64_t>())
      << "no step during the flood: " << during->dump();
  const CommandResult cancel = RunShardline(
      {"cancel", "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir(), *job_id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
  auto done = cluster.WaitForJobEnd(*job_id, 60s);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ((*done)["state"], "cancelled") << done->dump();
}

}  // namespace
}  // namespace shardline::testing
