// The generation supervisor with real processes, signals and sockets: a killed actor, a stopped
// one, a lost node that comes back, a crash loop, a coordinator killed mid-job. Each fault is named
// by its root cause, the generation is aborted, and an elastic job resumes from its last committed
// step on the devices that remain, ending where a fault-free run of the same plan ends.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include "checkpoint/layout.h"
#include "checkpoint/verify.h"
#include "tests/integration/local_cluster.h"
#include "tests/support/checkpoint_state.h"

namespace shardline::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
using nlohmann::json;

// A small GPT on `parallel`; `elastic` is the section's body (empty: not elastic).
std::string TrainJob(const std::string& name, const std::string& dir, const std::string& parallel,
                     const std::string& elastic, int steps = 16) {
  std::string yaml = "name: " + name +
                     "\nkind: train\ndevices: cpu\nbootstrap_timeout_s: 30\n"
                     "model: {layers: 2, heads: 4, d_model: 32, max_seq_len: 16}\n"
                     "data: {synthetic: {seed: 2, bytes: 64KiB}}\n"
                     "optimizer: {lr: 1.0e-3, weight_decay: 0.1}\n"
                     "steps: " + std::to_string(steps) + "\nbatch: 8\nseq_len: 16\nseed: 3\n"
                     "checkpoint: {dir: " + dir + ", interval: 2}\n"
                     "log_interval: 2\nparallel: " + parallel + "\n";
  if (!elastic.empty()) yaml += "elastic: " + elastic + "\n";
  return yaml;
}

bool Training(const json& job, int64_t past_committed) {
  return job["state"] == "running" && job["phase"] == "running" &&
         job["train"]["last_committed_step"].get<int64_t>() >= past_committed &&
         job["train"]["step"].get<int64_t>() > job["train"]["last_committed_step"].get<int64_t>();
}

pid_t PidOfRank(const json& job, int rank) {
  for (const auto& actor : job["actors"]) {
    if (actor["rank"] == rank) return actor["pid"].get<pid_t>();
  }
  return 0;
}

class ClusterElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    ASSERT_TRUE(cluster_.StartAgent("node-a", "cpu:2").ok());
    auto b = cluster_.StartAgent("node-b", "cpu:2");
    ASSERT_TRUE(b.ok());
    node_b_ = *b;
    ASSERT_TRUE(cluster_.WaitForAliveNodes(2, 15s).ok());
  }

  // Submits, waits until it trains past `past_committed`, and returns the job's id and state.
  std::pair<std::string, json> StartAndWait(const std::string& yaml, int64_t past_committed) {
    auto id = cluster_.Submit(yaml);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return {};
    auto job = cluster_.WaitForJob(
        *id, [&](const json& j) { return Training(j, past_committed) || j["state"] != "running" &&
                                                                            j["state"] != "pending"; },
        120s);
    EXPECT_TRUE(job.ok()) << job.status() << cluster_.Log("coordinator");
    return {*id, job.ok() ? *job : json()};
  }

  json End(const std::string& id, std::chrono::seconds timeout = 240s) {
    auto job = cluster_.WaitForJobEnd(id, timeout);
    EXPECT_TRUE(job.ok()) << job.status() << cluster_.Log("coordinator");
    return job.ok() ? *job : json();
  }

  std::string Dir(const std::string& name) { return (fs::path(cluster_.dir()) / name).string(); }

  LocalCluster cluster_;
  pid_t node_b_ = 0;
};

TEST_F(ClusterElasticTest, AKilledActorRestartsFromTheLastCommitAndEndsLikeAFaultFreeRun) {
  const std::string parallel = "{tp: 2, dp: 2}";
  // The fault-free run of the same plan first.
  const std::string reference_dir = Dir("reference");
  // Steps enough that the fault lands mid-run however fast the machine is: 80 steps of ~0.016 s
  // (a 2-core Zen 4, 2026-12-06) once ended before the poll saw the job past its first commit.
  constexpr int kSteps = 400;
  auto reference = cluster_.Submit(TrainJob("reference", reference_dir, parallel, "", kSteps));
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(End(*reference)["state"], "succeeded");

  // Spare devices: once the killed rank's device is left out, the job keeps its plan. Two, so
  // that each of its actors gets the same share of threads as the others' (the same sums).
  ASSERT_TRUE(cluster_.StartAgent("node-c", "cpu:2").ok());
  ASSERT_TRUE(cluster_.WaitForAliveNodes(3, 15s).ok());
  const std::string dir = Dir("elastic");
  auto [id, running] =
      StartAndWait(TrainJob("elastic", dir, parallel, "{min_actors: 2, max_actors: 4}", kSteps), 2);
  ASSERT_EQ(running["state"], "running") << running.dump(2);
  const pid_t victim = PidOfRank(running, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  const json job = End(id);
  ASSERT_EQ(job["state"], "succeeded") << job.dump(2) << cluster_.Log("coordinator");
  const json& generations = job["train"]["generations"];
  ASSERT_EQ(generations.size(), 2u) << job.dump(2);
  const json& first = generations[0];
  EXPECT_EQ(first["ending"], "fault");
  EXPECT_EQ(first["cause_kind"], "actor_exit");
  // The killed rank is the cause, named first in time; its peers' broken sockets are not.
  EXPECT_THAT(first["cause"].get<std::string>(),
              HasSubstr("rank 1 on node-a killed by SIGKILL (signal 9) at step"));
  // The abort is bounded: the agents kill what is left at once (a generous bound for a loaded
  // machine; it takes milliseconds).
  EXPECT_GE(first["abort_seconds"].get<double>(), 0);
  EXPECT_LT(first["abort_seconds"].get<double>(), 5.0);
  const json& second = generations[1];
  EXPECT_EQ(second["ending"], "succeeded");
  EXPECT_GE(second["resumed_step"].get<int64_t>(), 2);
  // The same plan, without the killed rank's device (the spare one instead).
  EXPECT_EQ(second["plan"], "tp 2 x pp 1 x dp 2, zero 0 on 4 actors");
  for (const json& actor : job["actors"]) {
    EXPECT_FALSE(actor["node_id"] == "node-a" && actor["device"] == "cpu:1") << actor.dump();
  }
  // Lost: what ran past the last commit, at most an interval and the save in flight.
  EXPECT_LE(first["steps_lost"].get<int64_t>(), 4);
  EXPECT_GT(first["recovery_seconds"].get<double>(), 0);
  // The figures, for the log (bench/recovery_compare.py measures them against torchrun).
  std::cout << "recovery: " << first["cause"].get<std::string>() << "; abort "
            << first["abort_seconds"] << " s, next step " << first["recovery_seconds"]
            << " s after the fault, " << first["steps_lost"] << " steps lost" << std::endl;

  // Nothing committed was lost and every committed step verifies; the final state is the
  // fault-free run's.
  const absl::StatusOr<std::vector<int64_t>> committed = checkpoint::CommittedSteps(dir);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_FALSE(committed->empty());
  for (int64_t step : *committed) {
    EXPECT_TRUE(checkpoint::VerifyStep(checkpoint::ManifestPath(dir, step)).ok()) << step;
  }
  ExpectSameState(checkpoint::ManifestPath(dir, kSteps),
                  checkpoint::ManifestPath(reference_dir, kSteps));

  // `shardline status JOB` has a line per generation; metrics count the restart by its cause.
  CommandResult status = RunShardline(
      {"status", id, "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir()});
  EXPECT_THAT(status.output, HasSubstr("generation 1 "));
  EXPECT_THAT(status.output, HasSubstr("ended by rank 1 on node-a killed by SIGKILL"));
  EXPECT_THAT(status.output, HasSubstr("generation 2 "));
  CommandResult cluster =
      RunShardline({"status", "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir()});
  EXPECT_THAT(cluster.output, HasSubstr("cpu:1 of node-a is avoided until the node registers "
                                        "again: rank 1 on node-a killed by SIGKILL"));
  const std::string metrics = cluster_.metrics_address();
  EXPECT_EQ(ScrapeSum(metrics, "shardline_restarts_total", "cause=\"actor_exit\""), 1);
  EXPECT_EQ(ScrapeSum(metrics, "shardline_recovery_seconds_count", "cause=\"actor_exit\""), 1);
}

// DiLoCo: a site (dp rank) killed between syncs is an elastic fault like any other. The job
// resumes from the last committed step, which may lie inside an outer round (every 4, checkpoints
// every 2): each site's parameters and moments, the anchor and the outer momentum come back, so
// the job ends exactly where the fault-free run does; what it lost is the steps since that commit.
TEST_F(ClusterElasticTest, ADilocoSiteKilledBetweenSyncsResumesTheRoundAndEndsLikeAFaultFreeRun) {
  constexpr int kSteps = 400;
  const std::string parallel = "{dp: 2}\ndata_parallel: {sync: diloco, every: 4}";
  const std::string reference_dir = Dir("diloco-reference");
  auto reference =
      cluster_.Submit(TrainJob("diloco-reference", reference_dir, parallel, "", kSteps));
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(End(*reference)["state"], "succeeded");

  const std::string dir = Dir("diloco");
  auto [id, running] =
      StartAndWait(TrainJob("diloco", dir, parallel, "{min_actors: 2, max_actors: 2}", kSteps), 2);
  ASSERT_EQ(running["state"], "running") << running.dump(2);
  const pid_t victim = PidOfRank(running, 1);  // site 1
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  const json job = End(id);
  ASSERT_EQ(job["state"], "succeeded") << job.dump(2) << cluster_.Log("coordinator");
  const json& generations = job["train"]["generations"];
  ASSERT_EQ(generations.size(), 2u) << job.dump(2);
  EXPECT_EQ(generations[0]["cause_kind"], "actor_exit");
  EXPECT_LE(generations[0]["steps_lost"].get<int64_t>(), 4);
  EXPECT_EQ(generations[1]["plan"], "tp 1 x pp 1 x dp 2, zero 0, diloco every 4 on 2 actors");
  ExpectSameState(checkpoint::ManifestPath(dir, kSteps),
                  checkpoint::ManifestPath(reference_dir, kSteps));
}

TEST_F(ClusterElasticTest, WithoutElasticTheJobFailsNamingTheKilledRankNotItsPeers) {
  auto [id, running] = StartAndWait(TrainJob("fixed", Dir("fixed"), "{tp: 2, dp: 2}", "", 400), 2);
  ASSERT_EQ(running["state"], "running") << running.dump(2);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 4; ++rank) pids.push_back(PidOfRank(running, rank));
  ASSERT_EQ(::kill(pids[2], SIGKILL), 0);
  const json job = End(id, 60s);
  EXPECT_EQ(job["state"], "failed");
  const std::string error = job["error"];
  EXPECT_THAT(error, HasSubstr("generation 1: rank 2 on node-b killed by SIGKILL (signal 9) at step"));
  EXPECT_THAT(error, Not(HasSubstr("generation 1: rank 0")));
  for (pid_t pid : pids) EXPECT_FALSE(ProcessAlive(pid)) << pid;
}

TEST_F(ClusterElasticTest, AStoppedActorIsCaughtByTheWatchdogAndNamed) {
  auto [id, running] = StartAndWait(
      TrainJob("stopped", Dir("stopped"), "{tp: 2, dp: 2}",
               "{min_actors: 2, max_actors: 4, progress_timeout_s: 1.5}", 120),
      2);
  ASSERT_EQ(running["state"], "running") << running.dump(2);
  const pid_t victim = PidOfRank(running, 3);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  const json job = End(id);
  ::kill(victim, SIGCONT);  // in case it outlived the test's expectations
  ASSERT_EQ(job["state"], "succeeded") << job.dump(2) << cluster_.Log("coordinator");
  const json& first = job["train"]["generations"][0];
  EXPECT_EQ(first["cause_kind"], "hung") << job.dump(2);
  EXPECT_THAT(first["cause"].get<std::string>(),
              HasSubstr("rank 3 on node-b is stopped and made no progress for"))
      << cluster_.Log("coordinator");
  EXPECT_FALSE(ProcessAlive(victim));
}

TEST_F(ClusterElasticTest, ALostNodeScalesTheJobInAndItGrowsBackWhenTheNodeReturns) {
  auto [id, running] = StartAndWait(
      TrainJob("grow", Dir("grow"), "{tp: 1, dp: 4}", "{min_actors: 1, max_actors: 4}", 400), 2);
  ASSERT_EQ(running["state"], "running") << running.dump(2);
  ASSERT_EQ(::kill(node_b_, SIGKILL), 0);  // the agent and, with it, its actors
  // Scaled in: dp 2 on node-a.
  auto smaller = cluster_.WaitForJob(
      id,
      [](const json& j) {
        return j["generation"] == 2 && j["phase"] == "running" && j["world_size"] == 2;
      },
      60s);
  ASSERT_TRUE(smaller.ok()) << smaller.status() << cluster_.Log("coordinator");
  const json& lost = (*smaller)["train"]["generations"][0];
  EXPECT_EQ(lost["cause_kind"], "node_lost");
  EXPECT_THAT(lost["cause"].get<std::string>(), HasSubstr("node node-b lost rank 2, rank 3"));
  // The node returns: at the next commit the job grows back to dp 4.
  ASSERT_TRUE(cluster_.StartAgent("node-b", "cpu:2").ok());
  auto larger = cluster_.WaitForJob(
      id, [](const json& j) { return j["generation"] == 3 && j["world_size"] == 4; }, 60s);
  ASSERT_TRUE(larger.ok()) << larger.status() << cluster_.Log("coordinator");
  EXPECT_EQ((*larger)["train"]["generations"][1]["ending"], "grow");
  // A grow is decided at a commit, and the steps the ranks trained past it before the abort
  // landed are lost: at most a checkpoint interval (2) here. Over Gloo no step fit in that window;
  // over shm two can (CI saw 2). Losing none needs the ranks to stop at the commit's step, which
  // the coordinator cannot yet ask of them.
  EXPECT_LE((*larger)["train"]["generations"][1]["steps_lost"].get<int64_t>(), 2);
  ASSERT_TRUE(RunShardline({"cancel", id, "--coordinator", cluster_.endpoint(), "--keys",
                            cluster_.key_dir()})
                  .exit_code == 0);
}

TEST_F(ClusterElasticTest, BelowMinActorsTheJobWaitsSayingForWhatAndGoesOnWhenDevicesReturn) {
  auto [id, running] = StartAndWait(
      TrainJob("waits", Dir("waits"), "{tp: 2, dp: 2}", "{min_actors: 4, max_actors: 4}", 400), 2);
  ASSERT_EQ(running["state"], "running") << running.dump(2);
  ASSERT_EQ(::kill(node_b_, SIGKILL), 0);
  auto waiting = cluster_.WaitForJob(
      id, [](const json& j) { return j["phase"] == "restarting" && j["error"] != ""; }, 30s);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  auto said = cluster_.WaitForJob(
      id,
      [](const json& j) {
        return j["error"].get<std::string>().find("waiting for 2 more cpu devices: 2 free of 2 "
                                                  "alive, min 4") != std::string::npos;
      },
      30s);
  ASSERT_TRUE(said.ok()) << said.status();
  EXPECT_EQ((*said)["state"], "running");  // still the job's: it waits, it has not failed
  ASSERT_TRUE(cluster_.StartAgent("node-b", "cpu:2").ok());
  auto back = cluster_.WaitForJob(
      id,
      [](const json& j) {
        return j["generation"] == 2 && j["phase"] == "running" && j["world_size"] == 4;
      },
      60s);
  ASSERT_TRUE(back.ok()) << back.status() << cluster_.Log("coordinator");
  ASSERT_EQ(RunShardline(
                {"cancel", id, "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir()})
                .exit_code,
            0);
}

TEST_F(ClusterElasticTest, TheCrashLoopBreakerFailsTheJobWithItsCauses) {
  const std::string yaml = TrainJob("loop", Dir("loop"), "{tp: 2, dp: 1}",
                                    "{min_actors: 2, max_actors: 2, max_restarts: 1}", 400);
  auto [id, running] = StartAndWait(yaml, 2);
  ASSERT_EQ(running["state"], "running") << running.dump(2);
  ASSERT_EQ(::kill(PidOfRank(running, 0), SIGKILL), 0);
  auto again = cluster_.WaitForJob(
      id, [](const json& j) { return j["generation"] == 2 && Training(j, 2); }, 60s);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(::kill(PidOfRank(*again, 1), SIGKILL), 0);
  const json job = End(id, 60s);
  EXPECT_EQ(job["state"], "failed");
  const std::string error = job["error"];
  EXPECT_THAT(error, HasSubstr("restarts stopped: 2 faults within"));
  EXPECT_THAT(error, HasSubstr("(max_restarts 1)"));
  EXPECT_THAT(error, HasSubstr("generation 1: rank 0 on node-a killed by SIGKILL"));
  // Generation 2 left out the device of generation 1's killed rank 0 (node-a's cpu:0).
  EXPECT_THAT(error, HasSubstr("generation 2: rank 1 on node-b killed by SIGKILL"));
}

TEST_F(ClusterElasticTest, ABadElasticSpecIsRefusedAtSubmit) {
  auto id = cluster_.Submit(TrainJob("bad", Dir("bad"), "{tp: 2, dp: 1}",
                                     "{min_actors: 4, max_actors: 2}"));
  ASSERT_FALSE(id.ok());
  EXPECT_THAT(std::string(id.status().message()),
              HasSubstr("elastic.max_actors: min_actors 4 is more than max_actors 2"));
}

TEST_F(ClusterElasticTest, AKilledCoordinatorResumesSupervisionFromTheStateDir) {
  const std::string dir = Dir("survivor");
  auto [id, running] = StartAndWait(
      TrainJob("survivor", dir, "{tp: 2, dp: 2}", "{min_actors: 2, max_actors: 4}", 120), 2);
  ASSERT_EQ(running["state"], "running") << running.dump(2);
  std::vector<pid_t> old_actors;
  for (int rank = 0; rank < 4; ++rank) old_actors.push_back(PidOfRank(running, rank));
  ASSERT_TRUE(cluster_.RestartCoordinator().ok());
  const json job = End(id);
  ASSERT_EQ(job["state"], "succeeded") << job.dump(2) << cluster_.Log("coordinator");
  const json& generations = job["train"]["generations"];
  ASSERT_GE(generations.size(), 2u);
  EXPECT_EQ(generations[0]["cause_kind"], "coordinator_restart");
  // The old generation's actors were fenced: killed by their agents.
  for (pid_t pid : old_actors) EXPECT_FALSE(ProcessAlive(pid)) << pid;
  EXPECT_GE(generations.back()["resumed_step"].get<int64_t>(), 2);
  EXPECT_TRUE(checkpoint::VerifyStep(checkpoint::ManifestPath(dir, 120)).ok());

  // A second coordinator on the same state dir is refused.
  CommandResult second =
      RunShardline({"coordinator", "--listen", "tcp://127.0.0.1:0", "--state-dir",
                    (fs::path(cluster_.dir()) / "state").string(), "--keys", cluster_.key_dir()},
                   20s);
  EXPECT_NE(second.exit_code, 0);
  EXPECT_THAT(second.output, HasSubstr("is in use by another coordinator"));
}

}  // namespace
}  // namespace shardline::testing
