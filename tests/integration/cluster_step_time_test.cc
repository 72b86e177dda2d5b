// The planner's step-time prediction against what local CPU jobs measure (issue 5: within 25%
// after calibration). A real coordinator and one agent of two CPU devices; each layout two real
// train jobs whose two actors calibrate at start-up (the layer rate of the CPU kernels, the
// loaded all-reduce latency and bandwidth of their Gloo links), after which the coordinator
// prices the job's layout with those numbers. The job's slowest rank then reports its mean step
// over the last progress window (steps 5-8: the first steps warm caches and allocators), and
// status shows both.
//
// The model is wide enough (d_model 256) that compute, which calibration measures at this width,
// dominates the step; the layouts are every kind of parallelism two devices allow. Timing on a
// shared machine is noisy, so ctest runs this test alone (RUN_SERIAL in integration.cmake), the
// verdict is on the geometric mean of two jobs' ratios, and the bound is the 25%, not
// tighter: on the 2-core development machine single jobs' ratios ranged 0.84-1.26 over 32 runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tests/integration/local_cluster.h"

namespace shardline::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using namespace std::chrono_literals;
using nlohmann::json;

constexpr double kTolerance = 0.25;

std::string TrainJob(const std::string& name, const std::string& parallel) {
  return "name: " + name +
         "\n"
         "kind: train\n"
         "devices: cpu\n"
         "model:\n"
         "  layers: 4\n"
         "  heads: 8\n"
         "  d_model: 256\n"
         "  max_seq_len: 128\n"
         "data:\n"
         "  synthetic: {seed: 3, bytes: 256KiB}\n"
         "optimizer:\n"
         "  lr: 1.0e-3\n"
         "steps: 8\n"
         "batch: 8\n"
         "micro_batch: 2\n"
         "seq_len: 128\n"
         "log_interval: 4\n"
         "parallel: " +
         parallel + "\n";
}

class ClusterStepTimeTest : public ::testing::TestWithParam<std::pair<std::string, std::string>> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    ASSERT_TRUE(cluster_.StartAgent("node-a", "cpu:2").ok());
    ASSERT_TRUE(cluster_.WaitForAliveNodes(1, 15s).ok());
  }

  LocalCluster cluster_;
};

// One run of the layout: its measured/predicted ratio (0 after a failed assertion).
double RunOnce(LocalCluster& cluster, const std::string& name, const std::string& parallel,
               int run) {
  auto job_id = cluster.Submit(TrainJob(name, parallel));
  EXPECT_TRUE(job_id.ok()) << job_id.status();
  if (!job_id.ok()) return 0;
  auto job = cluster.WaitForJobEnd(*job_id, 300s);
  EXPECT_TRUE(job.ok()) << job.status() << cluster.Log("coordinator");
  if (!job.ok()) return 0;
  EXPECT_EQ((*job)["state"], "succeeded") << job->dump(2) << cluster.Log("coordinator");
  const json& train = (*job)["train"];
  const json& plan = train["plan"];
  EXPECT_EQ(train["step"], 8);
  // Priced with this job's own calibration, not the defaults or an earlier job's numbers.
  EXPECT_TRUE(plan["prediction_calibrated"].get<bool>())
      << plan.dump(2) << cluster.Log("coordinator");
  const double predicted = plan["predicted_step_seconds"].get<double>();
  const double measured = train["step_seconds"].get<double>();
  EXPECT_GT(predicted, 0) << plan.dump(2);
  EXPECT_GT(measured, 0) << train.dump(2);
  if (!(predicted > 0) || !(measured > 0)) return 0;
  const double ratio = measured / predicted;
  std::printf("%s run %d: predicted %.3f s/step, measured %.3f s/step (compute %.3f, comm %.3f, "
              "bubble %.3f): measured/predicted %.2f\n",
              name.c_str(), run, predicted, measured, train["compute_seconds"].get<double>(),
              train["comm_seconds"].get<double>(), train["bubble_seconds"].get<double>(), ratio);
  // What the prediction was made of, for whoever reads a failure.
  const std::string log = cluster.Log("coordinator");
  const size_t priced = log.rfind("own calibration");
  if (priced != std::string::npos) {
    const size_t line = log.rfind('\n', priced);
    std::printf("  %s\n", log.substr(line + 1, priced - line - 1).c_str());
  }
  // What a person sees: both numbers and the difference.
  const CommandResult shown =
      RunShardline({"status", "--coordinator", cluster.endpoint(), job_id->c_str()});
  EXPECT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_THAT(shown.output, HasSubstr("s/step calibrated (measured "));
  return ratio;
}

TEST_P(ClusterStepTimeTest, PredictedWithinAQuarterOfMeasured) {
  const auto& [name, parallel] = GetParam();
  // Two jobs, each with its own calibration and its own measurement: a shared machine's noise
  // (±15% between two runs of the same job here) is halved in their geometric mean, a model's
  // error is not.
  const double first = RunOnce(cluster_, name, parallel, 1);
  const double second = RunOnce(cluster_, name, parallel, 2);
  ASSERT_GT(first, 0);
  ASSERT_GT(second, 0);
  const double ratio = std::sqrt(first * second);
  RecordProperty("measured_over_predicted", std::to_string(ratio));
  std::printf("%s: measured/predicted %.2f and %.2f, geometric mean %.2f\n", name.c_str(), first,
              second, ratio);
  EXPECT_LE(std::abs(ratio - 1), kTolerance) << name << ": measured/predicted " << first
                                             << " and " << second << "\n"
                                             << cluster_.Log("coordinator");
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ClusterStepTimeTest,
    ::testing::Values(std::make_pair(std::string("dp2"), std::string("{dp: 2}")),
                      std::make_pair(std::string("dp2-zero3"), std::string("{dp: 2, zero: 3}")),
                      std::make_pair(std::string("pp2"), std::string("{pp: 2}")),
                      std::make_pair(std::string("tp2"), std::string("{tp: 2}"))),
    [](const auto& info) {
      std::string name = info.param.first;
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

}  // namespace
}  // namespace shardline::testing
