// Bad input at every door: garbage frames, bad specs, ports in use, a node id taken, an
// unreachable coordinator. Each gets a clear error; no daemon dies.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <regex>
#include <thread>

#include "protocol/channel.h"
#include "protocol/envelope.h"
#include "tests/integration/local_cluster.h"

namespace shardline::testing {
namespace {

using namespace std::chrono_literals;

std::string WriteTemp(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ClusterBadInputTest, TenThousandGarbageFramesDoNotStopTheCoordinator) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("steady", "cpu:2").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());

  // A peer with a client key: authenticated is not trusted (a stranger without a key never gets
  // this far: cluster_security_test).
  auto attacker = protocol::Channel::Connect(cluster.endpoint(), cluster.client_curve());
  ASSERT_TRUE(attacker.ok());
  std::mt19937_64 rng(11);
  // A valid frame to cut and to corrupt.
  protocol::Outgoing valid("shardline", "attacker", 5);
  valid.payload().initSubmitJob().setSpecYaml("name: x\nkind: comm-check\nactors: 2\n");
  auto words = valid.Serialize();
  const auto valid_bytes = words.asBytes();
  const std::string valid_frame(reinterpret_cast<const char*>(valid_bytes.begin()),
                                valid_bytes.size());
  protocol::Outgoing other_version("shardline", "attacker", 6);
  other_version.envelope().setProtocolVersion(99);
  other_version.payload().setAck();
  auto version_words = other_version.Serialize();
  protocol::Outgoing other_cluster("elsewhere", "attacker", 7);
  other_cluster.payload().setAck();
  auto cluster_words = other_cluster.Serialize();

  // Replies come back where a reply is possible: errors, each saying what was wrong. They are
  // read while sending, so that neither side's queue overflows.
  int errors = 0, version_errors = 0;
  auto drain = [&](std::chrono::milliseconds wait) {
    while (true) {
      auto frame = (*attacker)->Receive(wait);
      if (!frame.ok() || !frame->has_value()) return;
      auto reply = protocol::Decode((*frame)->bytes.data(), (*frame)->bytes.size(), "shardline");
      if (!reply.ok() || reply.message->which() != wire::Envelope::Payload::ERROR) continue;
      ++errors;
      const std::string message =
          protocol::Str(reply.message->envelope().getPayload().getError().getMessage());
      if (message.find("protocol version 99") != std::string::npos) ++version_errors;
    }
  };
  constexpr int kFrames = 10000;
  int sent = 0;
  for (int i = 0; i < kFrames; ++i) {
    std::string frame;
    switch (i % 5) {
      case 0: frame = valid_frame.substr(0, rng() % valid_frame.size()); break;  // truncated
      case 1: {                                                                   // garbage
        frame.resize(8 * (1 + rng() % 32));
        for (auto& c : frame) c = static_cast<char>(rng());
        break;
      }
      case 2: {  // a plausible header over garbage
        frame = valid_frame;
        for (size_t k = 8; k < frame.size(); k += 1 + rng() % 7) frame[k] = static_cast<char>(rng());
        break;
      }
      case 3:
        frame.assign(reinterpret_cast<const char*>(version_words.asBytes().begin()),
                     version_words.asBytes().size());
        break;
      case 4:
        frame.assign(reinterpret_cast<const char*>(cluster_words.asBytes().begin()),
                     cluster_words.asBytes().size());
        break;
    }
    // A corrupted-but-valid frame could in principle parse; it is then an ordinary bad request.
    if ((*attacker)->SendRaw(frame.data(), frame.size()).ok()) ++sent;
    if (i % 100 == 99) drain(0ms);
  }
  // Plus oversized frames, refused before decoding.
  std::string oversized(protocol::kMaxFrameBytes + 8, '\0');
  for (int i = 0; i < 2; ++i) {
    if ((*attacker)->SendRaw(oversized.data(), oversized.size()).ok()) ++sent;
  }
  ASSERT_EQ(sent, kFrames + 2);

  drain(1000ms);
  EXPECT_GE(errors, kFrames * 3 / 5) << "most frames deserve an error reply";
  EXPECT_EQ(version_errors, kFrames / 5);

  // The coordinator still serves the real agent: it is alive and runs a job.
  auto status = cluster.Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ((*status)["nodes"][0]["state"], "alive");
  auto job_id = cluster.Submit("name: after\nkind: comm-check\nactors: 2\n"
                               "comm_check:\n  max_bytes: 64KiB\n");
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto job = cluster.WaitForJobEnd(*job_id, 120s);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ((*job)["state"], "succeeded") << job->dump();

  // And every refused frame was counted.
  const std::string metrics = cluster.metrics_address();
  EXPECT_GE(ScrapeSum(metrics, "shardline_decode_errors_total"), kFrames * 3 / 5 + 2);
  EXPECT_EQ(ScrapeSum(metrics, "shardline_decode_errors_total", "reason=\"oversized\""), 2);
  // Corrupted frames may land on any reason; the well-formed ones of another version or cluster
  // are each counted where they belong.
  EXPECT_GE(ScrapeSum(metrics, "shardline_decode_errors_total", "reason=\"version\""),
            kFrames / 5);
  EXPECT_GE(ScrapeSum(metrics, "shardline_decode_errors_total", "reason=\"cluster\""),
            kFrames / 5);
  EXPECT_GT(ScrapeSum(metrics, "shardline_decode_errors_total", "reason=\"truncated\""), 0);
}

TEST(ClusterBadInputTest, SpecErrorsNameTheKeyAndLine) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  const std::string spec = WriteTemp(cluster.dir(), "bad.yaml",
                                     "name: bad\nkind: comm-check\nactors: 2\nwrld_size: 4\n");
  auto result = RunShardline(
      {"submit", spec, "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir()});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("bad.yaml:4:1"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("wrld_size"), std::string::npos) << result.output;

  // The coordinator validates on its own too: a client that skips the check gets the same.
  auto direct = cluster.Submit("name: bad\nkind: comm-check\nactors: zero\n");
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(direct.status().message()).find("actors"), std::string::npos);
  EXPECT_NE(std::string(direct.status().message()).find(":3:"), std::string::npos);
  EXPECT_TRUE(cluster.Status().ok());

  auto missing = RunShardline({"submit", cluster.dir() + "/nope.yaml", "--coordinator",
                               cluster.endpoint(), "--keys", cluster.key_dir()});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("nope.yaml"), std::string::npos) << missing.output;
}

TEST(ClusterBadInputTest, UnreachableCoordinatorIsAClearErrorAfterTheTimeout) {
  auto probe = protocol::Channel::Bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(probe.ok());
  const std::string endpoint = (*probe)->endpoint();
  probe->reset();  // nobody listens there now
  auto status =
      RunShardline({"status", "--coordinator", endpoint, "--timeout-s", "0.5", "--insecure"}, 20s);
  EXPECT_EQ(status.exit_code, 1);
  EXPECT_NE(status.output.find("no reply"), std::string::npos) << status.output;
  EXPECT_NE(status.output.find(endpoint), std::string::npos) << status.output;

  auto agent = RunShardline({"agent", "--coordinator", endpoint, "--devices", "cpu:1",
                             "--connect-timeout-s", "1", "--insecure"},
                            20s);
  EXPECT_EQ(agent.exit_code, 1);
  EXPECT_NE(agent.output.find("could not register node"), std::string::npos) << agent.output;
}

TEST(ClusterBadInputTest, PortInUseIsAClearError) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  auto second = RunShardline(
      {"coordinator", "--listen", cluster.endpoint(), "--metrics", "", "--keys", cluster.key_dir()},
      20s);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.output.find("cannot listen on " + cluster.endpoint()), std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("in use"), std::string::npos) << second.output;

  const std::string metrics = cluster.metrics_address();
  auto third = RunShardline({"coordinator", "--listen", "tcp://127.0.0.1:0", "--metrics", metrics,
                             "--keys", cluster.key_dir()},
                            20s);
  EXPECT_EQ(third.exit_code, 1);
  EXPECT_NE(third.output.find(metrics), std::string::npos) << third.output;
}

TEST(ClusterBadInputTest, SecondAgentClaimingALiveNodeIdIsRefused) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartAgent("twin", "cpu:1").ok());
  ASSERT_TRUE(cluster.WaitForAliveNodes(1, 20s).ok());
  auto second =
      RunShardline({"agent", "--coordinator", cluster.endpoint(), "--keys", cluster.key_dir(),
                    "--node-id", "twin", "--devices", "cpu:1", "--connect-timeout-s", "1.5"},
                   20s);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.output.find("refused node twin"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("held by a live agent"), std::string::npos) << second.output;
  // The first agent is untouched.
  auto status = cluster.Status();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ((*status)["nodes"][0]["state"], "alive");
}

TEST(ClusterBadInputTest, BadCommandLinesSayWhatIsWrong) {
  auto devices = RunShardline({"agent", "--devices", "gpu:7", "--connect-timeout-s", "1"});
  EXPECT_NE(devices.exit_code, 0);
  EXPECT_NE(devices.output.find("use cpu:N, cuda or auto"), std::string::npos) << devices.output;
  auto level = RunShardline({"status", "--log-level", "loud"});
  EXPECT_EQ(level.exit_code, 2);
  EXPECT_NE(level.output.find("unknown log level 'loud'"), std::string::npos) << level.output;
  auto unknown = RunShardline({"frobnicate"});
  EXPECT_NE(unknown.exit_code, 0);
}

}  // namespace
}  // namespace shardline::testing
