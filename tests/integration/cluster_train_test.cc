// A sharded training job end to end, as a user runs it: a coordinator and two agents of two CPU
// devices each (real processes, real sockets), `kind: train` with tp=2 × pp=2 submitted, four
// actors bootstrapping world/tp/pp/dp groups, training, reporting progress into `shardline
// status`, writing checkpoint shards that the coordinator commits with a manifest — and the
// committed checkpoint, gathered, equals the single-device `shardline train` run of the same spec.
// Also ZeRO 3 over dp = 2 with pp = 2 against the same reference.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"
#include "worker/training/model_checkpoint.h"

namespace shardline::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int kSteps = 6;

// The model, data, optimizer and schedule shared by the cluster job and the single-device run.
std::string TrainSections(const std::string& checkpoint_dir) {
  return "model:\n"
         "  layers: 4\n"
         "  heads: 4\n"
         "  d_model: 32\n"
         "  max_seq_len: 16\n"
         "data:\n"
         "  synthetic: {seed: 2, bytes: 64KiB}\n"
         "optimizer:\n"
         "  lr: 1.0e-3\n"
         "  weight_decay: 0.1\n"
         "steps: " + std::to_string(kSteps) + "\n"
         "batch: 8\n"
         "seq_len: 16\n"
         "seed: 3\n"
         "checkpoint:\n"
         "  dir: " + checkpoint_dir + "\n"
         "  interval: 3\n"
         "log_interval: 2\n";
}

std::string TrainJob(const std::string& name, const std::string& parallel,
                     const std::string& checkpoint_dir) {
  return "name: " + name + "\n"
         "kind: train\n"
         "devices: cpu\n"
         "bootstrap_timeout_s: 30\n"
         "micro_batch: 2\n"
         "parallel: " + parallel + "\n" + TrainSections(checkpoint_dir);
}

// Largest absolute difference between two models' parameters.
double MaxParamDiff(const model::ModelParams& a, const model::ModelParams& b) {
  if (a.values().size() != b.values().size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.values().size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(a.values()[i] - b.values()[i])));
  }
  return worst;
}

class ClusterTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    ASSERT_TRUE(cluster_.StartAgent("node-a", "cpu:2").ok());
    ASSERT_TRUE(cluster_.StartAgent("node-b", "cpu:2").ok());
    ASSERT_TRUE(cluster_.WaitForAliveNodes(2, 15s).ok());
    // The single-device reference: `shardline train` on the same sections.
    const fs::path spec = fs::path(cluster_.dir()) / "single.yaml";
    std::ofstream(spec) << "name: single\n" << TrainSections((fs::path(cluster_.dir()) / "single").string());
    const CommandResult single = RunShardline({"train", spec.string()}, 120s);
    ASSERT_EQ(single.exit_code, 0) << single.output;
    auto reference = training::LoadModel((fs::path(cluster_.dir()) / "single").string());
    ASSERT_TRUE(reference.ok()) << reference.status();
    reference_.emplace(std::move(*reference));
  }

  // Runs a train job to the end and checks what every sharded run must show; returns the
  // checkpoint folder.
  std::string RunJob(const std::string& name, const std::string& parallel) {
    const std::string checkpoint_dir = (fs::path(cluster_.dir()) / name).string();
    auto job_id = cluster_.Submit(TrainJob(name, parallel, checkpoint_dir));
    EXPECT_TRUE(job_id.ok()) << job_id.status();
    if (!job_id.ok()) return "";
    auto job = cluster_.WaitForJobEnd(*job_id, 240s);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    EXPECT_EQ((*job)["state"], "succeeded") << job->dump(2) << cluster_.Log("coordinator");
    const auto& train = (*job)["train"];
    EXPECT_EQ(train["step"], kSteps) << train.dump();
    EXPECT_EQ(train["steps"], kSteps);
    EXPECT_TRUE(train["loss"].is_number()) << train.dump();
    EXPECT_GT(train["tokens_per_second"].get<double>(), 0);
    EXPECT_EQ(train["last_committed_step"], kSteps);
    // The status command shows the same as a person reads it.
    const CommandResult status = RunShardline(
        {"status", "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir(), *job_id});
    EXPECT_EQ(status.exit_code, 0) << status.output;
    EXPECT_THAT(status.output, HasSubstr("step " + std::to_string(kSteps) + "/" +
                                         std::to_string(kSteps)));
    return checkpoint_dir;
  }

  LocalCluster cluster_;
  std::optional<model::ModelParams> reference_;
};

TEST_F(ClusterTrainTest, TensorAndPipelineParallelJobEqualsTheSingleDeviceRun) {
  const std::string dir = RunJob("tp2-pp2", "{tp: 2, pp: 2, dp: 1}");
  ASSERT_FALSE(dir.empty());
  // Both checkpoints (step 3 and the last) were committed, latest names the last.
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step-00000003" / "manifest.json"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step-00000006" / "manifest.json"));
  std::string latest;
  std::ifstream(fs::path(dir) / "latest") >> latest;
  EXPECT_EQ(latest, "step-00000006");
  // Four ranks wrote the shards: rank-00000 .. rank-00003.
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(fs::exists(fs::path(dir) / "step-00000006" /
                           ("rank-0000" + std::to_string(rank) + ".safetensors")))
        << rank;
  }
  // Gathered, the sharded checkpoint is the single-device model (fp32 rounding apart: see
  // tests/unit/model_sharded_test.cc for the tolerance).
  auto gathered = training::LoadModel(dir);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_LE(MaxParamDiff(*gathered, *reference_), 2e-5);

  // `generate` reads the sharded checkpoint as it is.
  const CommandResult text = RunShardline({"generate", "--checkpoint", dir, "--prompt", "the ",
                                           "--max-new-tokens", "8"});
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("the "));
}

TEST_F(ClusterTrainTest, ZeroThreeWithPipelineEqualsTheSingleDeviceRun) {
  const std::string dir = RunJob("zero3-pp2-dp2", "{tp: 1, pp: 2, dp: 2, zero: 3}");
  ASSERT_FALSE(dir.empty());
  auto gathered = training::LoadModel(dir);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_LE(MaxParamDiff(*gathered, *reference_), 2e-5);
}

}  // namespace
}  // namespace shardline::testing
