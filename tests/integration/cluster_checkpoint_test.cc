// Checkpoints across `shardline train` and cluster jobs, as a user runs them: real coordinator,
// agents and actors (processes, sockets, files). A run started with `shardline train`, continued
// by a tp2·pp2 cluster job and finished by `shardline train` again ends where one uninterrupted
// run does; a job skips a damaged step, says so in `shardline status`, and refuses a spec its
// checkpoint cannot resume, before spawning anything; and kill -9 of a rank in the middle of
// writing its shard loses nothing committed, the next job resuming from the step before.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/verify.h"
#include "tests/integration/local_cluster.h"
#include "tests/support/checkpoint_state.h"
#include "tests/support/file_damage.h"
#include "worker/training/model_checkpoint.h"

namespace shardline::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using nlohmann::json;

// The model, data, optimizer and schedule every run of a test shares.
std::string Sections(const std::string& model, int steps, const std::string& dir) {
  return "model: " + model + "\n"
         "data: {synthetic: {seed: 2, bytes: 64KiB}}\n"
         "optimizer: {lr: 1.0e-3, weight_decay: 0.1}\n"
         "steps: " + std::to_string(steps) + "\n"
         "batch: 8\n"
         "seq_len: 16\n"
         "seed: 3\n"
         "checkpoint: {dir: " + dir + ", interval: 2}\n"
         "log_interval: 2\n";
}
const char kSmall[] = "{layers: 4, heads: 4, d_model: 32, max_seq_len: 16}";

std::string SingleSpec(const std::string& path, const std::string& sections) {
  std::ofstream(path) << "name: single\n" << sections;
  return path;
}

std::string Job(const std::string& name, const std::string& parallel,
                const std::string& sections) {
  return "name: " + name + "\nkind: train\ndevices: cpu\nbootstrap_timeout_s: 30\n"
         "micro_batch: 2\nparallel: " + parallel + "\n" + sections;
}

class ClusterCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    ASSERT_TRUE(cluster_.StartAgent("node-a", "cpu:2").ok());
    ASSERT_TRUE(cluster_.StartAgent("node-b", "cpu:2").ok());
    ASSERT_TRUE(cluster_.WaitForAliveNodes(2, 15s).ok());
  }

  json RunJob(const std::string& yaml, std::chrono::seconds timeout = 240s) {
    auto job_id = cluster_.Submit(yaml);
    EXPECT_TRUE(job_id.ok()) << job_id.status();
    if (!job_id.ok()) return json();
    auto job = cluster_.WaitForJobEnd(*job_id, timeout);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : json();
  }

  std::string Shown(const std::string& job_id) {
    return RunShardline({"status", "--coordinator", cluster_.endpoint(), "--keys",
                         cluster_.key_dir(), job_id})
        .output;
  }

  std::string Path(const std::string& name) const {
    return (fs::path(cluster_.dir()) / name).string();
  }

  LocalCluster cluster_;
};

TEST_F(ClusterCheckpointTest, TrainThenAClusterJobThenTrainAgainEqualsTheUninterruptedRun) {
  const std::string dir = Path("run");
  const std::string spec = SingleSpec(Path("single.yaml"), Sections(kSmall, 4, dir));
  const CommandResult first = RunShardline({"train", spec}, 120s);
  ASSERT_EQ(first.exit_code, 0) << first.output;

  // The cluster job resumes after step 4 on tp 2 x pp 2 and trains to step 8.
  const json job = RunJob(Job("middle", "{tp: 2, pp: 2, dp: 1}", Sections(kSmall, 8, dir)));
  ASSERT_EQ(job["state"], "succeeded") << job.dump(2) << cluster_.Log("coordinator");
  EXPECT_EQ(job["train"]["resumed_from_step"], 4);
  EXPECT_EQ(job["train"]["step"], 8);
  EXPECT_EQ(job["train"]["last_committed_step"], 8);
  EXPECT_THAT(Shown(job["job_id"]), HasSubstr("resumed after step 4 of " + dir));
  absl::StatusOr<checkpoint::Manifest> manifest =
      checkpoint::ReadManifest(checkpoint::ManifestPath(dir, 8));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->world_size, 4);
  EXPECT_EQ(manifest->plan.tp, 2);
  EXPECT_EQ(manifest->plan.pp, 2);

  // `shardline train` takes it back from the cluster's step 8.
  const CommandResult back = RunShardline({"train", spec, "--steps", "10"}, 120s);
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_THAT(back.output, HasSubstr("Resuming after step 8 from " +
                                     checkpoint::ManifestPath(dir, 8)));
  EXPECT_THAT(*checkpoint::CommittedSteps(dir), ElementsAre(2, 4, 6, 8, 10));

  // One uninterrupted run of the same 10 steps.
  const std::string straight = Path("straight");
  const CommandResult whole = RunShardline(
      {"train", SingleSpec(Path("straight.yaml"), Sections(kSmall, 10, straight))}, 120s);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  ExpectSameState(checkpoint::StepDir(dir, 8), checkpoint::StepDir(straight, 8));
  ExpectSameState(dir, straight);
}

TEST_F(ClusterCheckpointTest, AJobSkipsADamagedStepSaysWhyAndRefusesASpecItCannotResume) {
  const std::string dir = Path("run");
  const std::string spec = SingleSpec(Path("single.yaml"), Sections(kSmall, 4, dir));
  ASSERT_EQ(RunShardline({"train", spec}, 120s).exit_code, 0);
  // One changed byte halfway through step 4's only file.
  const std::string file = checkpoint::StepDir(dir, 4) + "/rank-00000.safetensors";
  FlipBits(file, static_cast<int64_t>(fs::file_size(file) / 2), 0x40);

  // A spec the checkpoint cannot be resumed into fails before anything is spawned.
  const json refused = RunJob(Job("other-model", "{tp: 1, pp: 1, dp: 2}",
                                  Sections("{layers: 3, heads: 4, d_model: 32, max_seq_len: 16}",
                                           6, dir)));
  EXPECT_EQ(refused["state"], "failed");
  EXPECT_THAT(refused["error"].get<std::string>(),
              HasSubstr("model.layers is 4 in the checkpoint but 3 in the spec"));
  EXPECT_EQ(refused["generation"], 0) << "nothing may be spawned";
  EXPECT_TRUE(fs::exists(file)) << "a refused job sets nothing aside";

  const json job = RunJob(Job("fallback", "{tp: 1, pp: 1, dp: 2, zero: 1}", Sections(kSmall, 6, dir)));
  ASSERT_EQ(job["state"], "succeeded") << job.dump(2) << cluster_.Log("coordinator");
  EXPECT_EQ(job["train"]["resumed_from_step"], 2);
  ASSERT_EQ(job["train"]["skipped_checkpoints"].size(), 1u) << job.dump(2);
  EXPECT_EQ(job["train"]["skipped_checkpoints"][0]["step"], 4);
  const std::string reason = job["train"]["skipped_checkpoints"][0]["reason"];
  EXPECT_THAT(reason, HasSubstr(file));
  EXPECT_THAT(reason, HasSubstr("fails its checksum"));
  const std::string shown = Shown(job["job_id"]);
  EXPECT_THAT(shown, HasSubstr("skipped checkpoint step 4: checkpoint step 4: rank 0's file " + file));
  EXPECT_THAT(shown, HasSubstr("resumed after step 2 of " + dir));
  EXPECT_THAT(cluster_.Log("coordinator"), HasSubstr("skipped checkpoint step 4"));
  // The damaged step was set aside; the job wrote steps 4 and 6 afresh.
  EXPECT_TRUE(fs::exists(checkpoint::StepDir(dir, 4) + ".corrupt"));
  EXPECT_THAT(*checkpoint::CommittedSteps(dir), ElementsAre(2, 4, 6));
  for (const int64_t step : {4, 6}) {
    EXPECT_TRUE(checkpoint::VerifyStep(checkpoint::ManifestPath(dir, step)).ok()) << step;
  }
}

TEST_F(ClusterCheckpointTest, KillingARankWhileItWritesItsShardLosesNothingCommitted) {
  // Wide enough (d_model 512) that a rank's file of a save takes a while to write.
  const std::string model = "{layers: 4, heads: 8, d_model: 512, max_seq_len: 16}";
  const std::string dir = Path("run");
  const std::string yaml = Job("killed", "{tp: 2, pp: 2, dp: 1}", Sections(model, 4, dir));
  auto job_id = cluster_.Submit(yaml);
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  // Step 2 is committed; then the first rank file of step 4 seen being written (a temporary,
  // "rank-0000R.safetensors.tmp.PID", PID its actor's) is killed with its writer.
  const std::string step4 = checkpoint::StepDir(dir, 4);
  pid_t killed = 0;
  const auto until = std::chrono::steady_clock::now() + 240s;
  while (killed == 0 && std::chrono::steady_clock::now() < until) {
    // Saves are asynchronous: step 4's files can be in the writing before step 2 is committed
    // (with MKL and shm a step of this model is fast). A kill then would leave no commit at all.
    if (!fs::exists(checkpoint::ManifestPath(dir, 2))) {
      std::this_thread::sleep_for(1ms);
      continue;
    }
    std::error_code ec;
    for (fs::directory_iterator it(step4, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const auto tmp = name.find(".tmp.");
      if (tmp == std::string::npos || !name.starts_with("rank-")) continue;
      killed = std::stoi(name.substr(tmp + 5));
      ::kill(killed, SIGKILL);
      break;
    }
    if (killed == 0) std::this_thread::sleep_for(1ms);
  }
  ASSERT_NE(killed, 0) << "no rank file of step 4 was seen in the writing";
  auto job = cluster_.WaitForJobEnd(*job_id, 60s);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ((*job)["state"], "failed") << job->dump(2);
  // A rank that died before its file was whole never reported it: step 4 is not committed, and
  // step 2 is what a reader finds, whole.
  EXPECT_FALSE(fs::exists(checkpoint::ManifestPath(dir, 4)));
  EXPECT_EQ(*checkpoint::ReadLatest(dir), 2);
  EXPECT_TRUE(checkpoint::VerifyStep(checkpoint::ManifestPath(dir, 2)).ok());
  EXPECT_TRUE(training::LoadModel(dir).ok());

  // The same job again resumes after step 2, clears the interrupted save and finishes.
  const json again = RunJob(yaml);
  ASSERT_EQ(again["state"], "succeeded") << again.dump(2) << cluster_.Log("coordinator");
  EXPECT_EQ(again["train"]["resumed_from_step"], 2);
  EXPECT_THAT(*checkpoint::CommittedSteps(dir), ElementsAre(2, 4));
  EXPECT_TRUE(checkpoint::VerifyStep(checkpoint::ManifestPath(dir, 4)).ok());
  EXPECT_THAT(cluster_.Log("coordinator"), HasSubstr("an interrupted save (no manifest)"));
}

}  // namespace
}  // namespace shardline::testing
