// Planning on a real local cluster (a coordinator and two agents of two CPU devices each, real
// processes and sockets): a train job's actors calibrate at start-up and `shardline status
// --json` shows what they measured per node; a `parallel: auto` job is planned on the free
// devices and runs to the end with its plan in `shardline status`; one that no plan fits fails
// with the planner's verdict; and `shardline plan` plans for a cluster file and for the live
// cluster.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/integration/local_cluster.h"

namespace shardline::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using nlohmann::json;

// A tiny GPT and few steps: the test is about planning, not training.
std::string TrainJob(const std::string& name, const std::string& parallel,
                     const std::string& model =
                         "  layers: 4\n  heads: 4\n  d_model: 32\n"
                         "  max_seq_len: 16\n") {
  return "name: " + name +
         "\n"
         "kind: train\n"
         "devices: cpu\n"
         "bootstrap_timeout_s: 30\n"
         "model:\n" +
         model +
         "data:\n"
         "  synthetic: {seed: 2, bytes: 64KiB}\n"
         "steps: 4\n"
         "batch: 8\n"
         "seq_len: 16\n"
         "log_interval: 2\n"
         "parallel: " +
         parallel + "\n";
}

class ClusterPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    ASSERT_TRUE(cluster_.StartAgent("node-a", "cpu:2").ok());
    ASSERT_TRUE(cluster_.StartAgent("node-b", "cpu:2").ok());
    ASSERT_TRUE(cluster_.WaitForAliveNodes(2, 15s).ok());
  }

  json RunToEnd(const std::string& yaml) {
    auto job_id = cluster_.Submit(yaml);
    EXPECT_TRUE(job_id.ok()) << job_id.status();
    if (!job_id.ok()) return json();
    auto job = cluster_.WaitForJobEnd(*job_id, 120s);
    EXPECT_TRUE(job.ok()) << job.status() << cluster_.Log("coordinator");
    return job.ok() ? *job : json();
  }

  // `shardline status --json` as a script reads it.
  json StatusJson() {
    const CommandResult status = RunShardline(
        {"status", "--json", "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir()});
    EXPECT_EQ(status.exit_code, 0) << status.output;
    json parsed = json::parse(status.output, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << status.output;
    return parsed;
  }

  LocalCluster cluster_;
};

TEST_F(ClusterPlanTest, CalibrationThenAnAutoJobPlannedWithIt) {
  // Before any job, nothing is measured.
  // Named: in a range-for over StatusJson()["nodes"] the returned json dies before the first
  // iteration (only the reference operator[] returns is kept), and the loop reads freed memory.
  const json before = StatusJson();
  for (const auto& node : before["nodes"]) EXPECT_TRUE(node["calibration"].is_null());

  // A fixed layout whose tp groups stay in a node and whose pp groups span both: every kind of
  // link gets measured.
  const json fixed = RunToEnd(TrainJob("fixed", "{tp: 2, pp: 2}"));
  ASSERT_EQ(fixed["state"], "succeeded") << fixed.dump(2) << cluster_.Log("coordinator");
  EXPECT_FALSE(fixed["train"]["plan"]["auto"].get<bool>());

  json status = StatusJson();
  ASSERT_EQ(status["nodes"].size(), 2u);
  for (const auto& node : status["nodes"]) {
    SCOPED_TRACE(node["node_id"].get<std::string>());
    const json& calibration = node["calibration"];
    ASSERT_TRUE(calibration.is_object()) << node.dump(2);
    EXPECT_GT(calibration["compute_flops"].get<double>(), 0);
    EXPECT_GE(calibration["compute_half_dim"].get<double>(), 0);
    EXPECT_GT(calibration["intra_bus_bytes_per_second"].get<double>(), 0);
    EXPECT_GT(calibration["intra_latency_seconds"].get<double>(), 0);
    EXPECT_GT(calibration["inter_bus_bytes_per_second"].get<double>(), 0);
    EXPECT_GT(calibration["inter_latency_seconds"].get<double>(), 0);
    EXPECT_EQ(calibration["devices"].size(), 2u);
    EXPECT_EQ(calibration["job_id"], fixed["job_id"]);
  }
  // The table shows them too.
  const CommandResult table =
      RunShardline({"status", "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir()});
  EXPECT_THAT(table.output, HasSubstr("GFLOP/s"));

  // Now the planner chooses, on the 4 free devices, with those measurements.
  const json job = RunToEnd(TrainJob("auto", "auto"));
  ASSERT_EQ(job["state"], "succeeded") << job.dump(2) << cluster_.Log("coordinator");
  const json& plan = job["train"]["plan"];
  EXPECT_TRUE(plan["auto"].get<bool>()) << plan.dump(2);
  const int world = plan["tp"].get<int>() * plan["pp"].get<int>() * plan["dp"].get<int>();
  EXPECT_GE(world, 1);
  EXPECT_LE(world, 4);
  EXPECT_EQ(job["world_size"], world);
  EXPECT_EQ(job["actors"].size(), static_cast<size_t>(world));
  EXPECT_GT(plan["micro_batch"].get<int>(), 0);
  EXPECT_GT(plan["predicted_step_seconds"].get<double>(), 0);
  EXPECT_GT(plan["predicted_memory_bytes"].get<double>(), 0);
  EXPECT_FALSE(plan["summary"].get<std::string>().empty());
  EXPECT_EQ(job["train"]["step"], 4);

  const CommandResult shown =
      RunShardline({"status", "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir(),
                    job["job_id"].get<std::string>()});
  EXPECT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_THAT(shown.output, HasSubstr("auto: predicted"));
  EXPECT_THAT(shown.output, HasSubstr("planned (parallel: auto)"));
  EXPECT_THAT(shown.output, HasSubstr("tp " + std::to_string(plan["tp"].get<int>()) + " x pp "));

  // The same cluster, planned from the command line with the live coordinator's view.
  const CommandResult live =
      RunShardline({"plan", "--model", SourceDir() + "/examples/model-gpt-tiny.yaml",
                    "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir(), "--json"});
  ASSERT_EQ(live.exit_code, 0) << live.output;
  EXPECT_THAT(live.output, HasSubstr("\"best\""));
  EXPECT_THAT(live.output, HasSubstr("node-a"));
}

TEST_F(ClusterPlanTest, AutoJobThatNothingFitsFailsSayingByHowMuch) {
  // ~50B parameters: no cut of them fits four CPU devices' share of this machine's memory.
  const json job = RunToEnd(TrainJob("huge", "auto",
                                     "  layers: 64\n  heads: 64\n  d_model: 8192\n"
                                     "  max_seq_len: 16\n"));
  EXPECT_EQ(job["state"], "failed") << job.dump(2);
  const std::string error = job["error"].get<std::string>();
  EXPECT_THAT(error, HasSubstr("no plan fits the 4 free cpu devices of 2 nodes"));
  EXPECT_THAT(error, HasSubstr("short"));
  EXPECT_TRUE(job["actors"].empty());  // nothing was spawned
}

TEST_F(ClusterPlanTest, AutoJobThatDoesNotFitWaitsWhileDevicesAreBusy) {
  // A long job holds two of the four devices.
  std::string long_job = TrainJob("busy", "{tp: 2}");
  long_job.replace(long_job.find("steps: 4"), 8, "steps: 100000");
  auto busy = cluster_.Submit(long_job);
  ASSERT_TRUE(busy.ok()) << busy.status();
  ASSERT_TRUE(cluster_
                  .WaitForJob(
                      *busy, [](const json& j) { return j["state"] == "running"; }, 30s)
                  .ok());
  // Nothing fits the two free devices, but a plan over all four might: the job waits.
  auto huge = cluster_.Submit(TrainJob("huge", "auto",
                                       "  layers: 64\n  heads: 64\n  d_model: 8192\n"
                                       "  max_seq_len: 16\n"));
  ASSERT_TRUE(huge.ok()) << huge.status();
  auto waiting = cluster_.WaitForJob(
      *huge,
      [](const json& j) {
        return j["error"].get<std::string>().find("waiting for busy devices") != std::string::npos;
      },
      30s);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ((*waiting)["state"], "pending");
  EXPECT_THAT((*waiting)["error"].get<std::string>(),
              HasSubstr("no plan fits the 2 free cpu devices of 1 node"));
  const CommandResult shown = RunShardline(
      {"status", "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir(), *huge});
  EXPECT_THAT(shown.output, HasSubstr("auto (not planned yet)"));

  // Once every device is free and still nothing fits, it fails.
  const CommandResult cancel = RunShardline(
      {"cancel", "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir(), *busy});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  auto failed = cluster_.WaitForJobEnd(*huge, 30s);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ((*failed)["state"], "failed");
  EXPECT_THAT((*failed)["error"].get<std::string>(),
              HasSubstr("no plan fits the 4 free cpu devices of 2 nodes"));
}

TEST_F(ClusterPlanTest, AutoJobCappedByItsActors) {
  const json job = RunToEnd("actors: 2\n" + TrainJob("capped", "auto"));
  ASSERT_EQ(job["state"], "succeeded") << job.dump(2) << cluster_.Log("coordinator");
  EXPECT_LE(job["world_size"].get<int>(), 2);
}

TEST(PlanCommandTest, PlansForTheExampleFiles) {
  const CommandResult plan =
      RunShardline({"plan", "--model", SourceDir() + "/examples/model-gpt-tiny.yaml", "--cluster",
                    SourceDir() + "/examples/cluster-local-cpu.yaml"});
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_THAT(plan.output, HasSubstr("plan: tp="));
  // Bad input names the file, line and column, and exits 2.
  const std::string dir = fs::temp_directory_path() / "shardline-plan-cli-test";
  fs::create_directories(dir);
  const std::string train = dir + "/train.yaml";
  std::ofstream(train) << "global_batch: 8\nzero: [0, 4]\n";
  const CommandResult bad =
      RunShardline({"plan", "--model", SourceDir() + "/examples/model-gpt-tiny.yaml", "--cluster",
                    SourceDir() + "/examples/cluster-local-cpu.yaml", "--train", train});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr(train + ":2:11: zero[1]: expected a ZeRO stage"));
  // No cluster named at all (an empty $SHARDLINE_COORDINATOR names none).
  const CommandResult none =
      RunShardline({"plan", "--model", SourceDir() + "/examples/model-gpt-tiny.yaml"}, 60s,
                   {{"SHARDLINE_COORDINATOR", ""}});
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_THAT(none.output, HasSubstr("--cluster FILE"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardline::testing
