// The planner's step-time prediction on live local CPU jobs: a real coordinator and one agent of
// two CPU devices; each layout one real train job whose two actors calibrate at start-up (the
// layer rate of the CPU kernels, the loaded all-reduce latency and bandwidth of their Gloo links),
// after which the coordinator prices the job's layout with those numbers. The job's slowest rank
// then reports its mean step over the last progress window, and status shows both.
//
// Nothing here is timed: how close the prediction comes to the measurement (issue 5: within 25%)
// is measured by bench/step_time_prediction_bench.cc, since a ratio of times asserted on a shared
// machine fails on its noise. What is checked is everything that has no timing in it: the job
// succeeds with the layout asked for, the prediction exists and was priced with the job's own
// calibration, and both `status` and `status --json` carry the prediction and the measurement.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "tests/integration/local_cluster.h"
#include "tests/support/step_time_job.h"

namespace shardline::testing {
namespace {

using ::testing::ContainsRegex;
using namespace std::chrono_literals;
using nlohmann::json;

struct Layout {
  std::string name;
  std::string parallel;  // the job spec's `parallel:` value
  int tp = 1, pp = 1, dp = 1, zero = 0;
};

// gtest prints a parameter into each ctest name; without this it dumps the struct's bytes, and
// those hold pointers that change from one build to the next.
void PrintTo(const Layout& layout, std::ostream* out) { *out << layout.parallel; }


class ClusterStepTimeTest : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    ASSERT_TRUE(cluster_.StartAgent("node-a", "cpu:2").ok());
    ASSERT_TRUE(cluster_.WaitForAliveNodes(1, 15s).ok());
  }

  LocalCluster cluster_;
};

TEST_P(ClusterStepTimeTest, CalibratedPredictionAndMeasurementShown) {
  const Layout& layout = GetParam();
  auto job_id = cluster_.Submit(StepTimeJob(layout.name, layout.parallel));
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  auto job = cluster_.WaitForJobEnd(*job_id, 300s);
  ASSERT_TRUE(job.ok()) << job.status() << cluster_.Log("coordinator");
  ASSERT_EQ((*job)["state"], "succeeded") << job->dump(2) << cluster_.Log("coordinator");

  // `status --json` as a script reads it: the layout asked for, priced with this job's own
  // calibration (not the defaults or an earlier job's numbers), and a measured step.
  const CommandResult status_json =
      RunShardline({"status", "--json", "--coordinator", cluster_.endpoint(), "--keys",
                    cluster_.key_dir(), *job_id});
  ASSERT_EQ(status_json.exit_code, 0) << status_json.output;
  const json parsed = json::parse(status_json.output, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << status_json.output;
  ASSERT_EQ(parsed["jobs"].size(), 1u) << parsed.dump(2);
  const json& train = parsed["jobs"][0]["train"];
  const json& plan = train["plan"];
  EXPECT_EQ(train["step"], 8) << train.dump(2);
  EXPECT_EQ(plan["tp"], layout.tp) << plan.dump(2);
  EXPECT_EQ(plan["pp"], layout.pp) << plan.dump(2);
  EXPECT_EQ(plan["dp"], layout.dp) << plan.dump(2);
  EXPECT_EQ(plan["zero"], layout.zero) << plan.dump(2);
  EXPECT_TRUE(plan["prediction_calibrated"].get<bool>())
      << plan.dump(2) << cluster_.Log("coordinator");
  EXPECT_GT(plan["predicted_step_seconds"].get<double>(), 0) << plan.dump(2);
  EXPECT_GT(train["step_seconds"].get<double>(), 0) << train.dump(2);
  EXPECT_GT(train["compute_seconds"].get<double>(), 0) << train.dump(2);
  // The coordinator says what the prediction was made of.
  EXPECT_THAT(cluster_.Log("coordinator"),
              ContainsRegex("predicted at [0-9.]+ s per step .*with its ranks' own calibration"));

  // What a person sees: both numbers and the difference. The format, not the figures: how far
  // apart they are is the benchmark's business.
  const CommandResult shown = RunShardline(
      {"status", "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir(), *job_id});
  EXPECT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_THAT(shown.output, ContainsRegex("predicted [0-9]+\\.[0-9]{3} s/step calibrated "
                                          "\\(measured [0-9]+\\.[0-9]{3} s, [+-][0-9]+%\\)"));
}

// Every kind of parallelism two devices allow.
INSTANTIATE_TEST_SUITE_P(Layouts, ClusterStepTimeTest,
                         ::testing::Values(Layout{"dp2", "{dp: 2}", 1, 1, 2, 0},
                                           Layout{"dp2-zero3", "{dp: 2, zero: 3}", 1, 1, 2, 3},
                                           Layout{"pp2", "{pp: 2}", 1, 2, 1, 0},
                                           Layout{"tp2", "{tp: 2}", 2, 1, 1, 0}),
                         [](const auto& info) {
                           std::string name = info.param.name;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace shardline::testing
