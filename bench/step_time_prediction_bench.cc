// The planner's predicted step time against the step time real local CPU train jobs measure
// (issue 5: within 25% after calibration), and the share of the step spent in communication
// (issue 13: at most 25% for the default job). Not part of ctest: a ratio of times on a shared
// machine is a measurement, and tests/integration/cluster_step_time_test.cc checks everything
// about these jobs that is not timed.
//
//   build/bench/step_time_prediction_bench [--runs N] [--layouts dp2,dp2-zero3,pp2,tp2,up,up4]
//
// Per layout, a real coordinator and one agent of CPU devices (the LocalCluster fixture of
// tests/integration, processes of the built `shardline` binary) and N train jobs (default 2), each
// with its own start-up calibration (the CPU kernels' layer rate, the loaded all-reduce latency
// and bandwidth of the links it trains over, with the backend it trains with) with which the
// coordinator prices the layout. dp2 .. tp2: a GPT of 4 layers, d_model 256, on 2 devices; the
// job's slowest rank reports its mean step over the last progress window (steps 5-8: the first
// steps warm caches and allocators). up: the default job of `shardline up` on the devices it
// offers here; up4: that job on 4 devices (tp 2 x pp 2; on a 2-core machine, time-shared), over
// its last window (steps 181-200). Printed per job: predicted and measured s/step, their ratio
// and the communication share; per layout: the geometric means (a shared machine's noise, ±15%
// between two runs of the same job on the 2-core development machine, shrinks in them, a model's
// error does not), whether the mean ratio is within 25%, and the mean communication share. Exits
// 0 whatever the ratios, 1 when a job failed to run or was not priced with its own calibration,
// 2 on a bad flag.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/process.h"
#include "tests/integration/local_cluster.h"
#include "tests/support/step_time_job.h"

namespace shardline {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using shardline::testing::LocalCluster;
using shardline::testing::StepTimeJob;

constexpr double kTarget = 0.25;  // issue 5: |measured / predicted - 1| <= 25%

struct Layout {
  const char* name;
  const char* parallel;  // the job spec's `parallel:` value; null: `shardline up`'s default job
  int devices = 2;       // 0: as many as `shardline up` offers here (DefaultUpDevices)
};

// Every kind of parallelism two devices allow (the layouts the test runs), then the default job
// of `shardline up` as it runs here and on 4 devices (tp 2 x pp 2, time-sharing 2 cores).
constexpr Layout kLayouts[] = {{"dp2", "{dp: 2}"},
                               {"dp2-zero3", "{dp: 2, zero: 3}"},
                               {"pp2", "{pp: 2}"},
                               {"tp2", "{tp: 2}"},
                               {"up", nullptr, 0},
                               {"up4", nullptr, 4}};

int DevicesOf(const Layout& layout) {
  return layout.devices > 0 ? layout.devices : cli::DefaultUpDevices(UsableCpus());
}

// The job of `layout`; the default job's checkpoints go to `checkpoints` (fresh per job: a job
// resumed from a finished one would train no step).
std::string JobYaml(const Layout& layout, const std::string& checkpoints) {
  if (layout.parallel != nullptr) return StepTimeJob(layout.name, layout.parallel);
  const absl::StatusOr<std::string> text = cli::DefaultTrainingTextPath();
  std::string yaml =
      cli::DefaultJobYaml(DevicesOf(layout), text.ok() ? *text : cli::kDefaultTrainingText);
  const std::string dir = "dir: checkpoints/shardline-up";
  const size_t at = yaml.find(dir);
  if (at != std::string::npos) yaml.replace(at, dir.size(), "dir: " + checkpoints);
  return yaml;
}


struct Run {
  double predicted = 0;   // s/step
  double measured = 0;    // s/step
  double comm_share = 0;  // of the measured step
};

// One job of the layout on `cluster`; false (with why on stderr) when it did not run to a
// calibrated prediction and a measurement.
bool RunJob(LocalCluster& cluster, const Layout& layout, int run, Run& out) {
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "%s job %d: %s\n%s\n", layout.name, run, why.c_str(),
                 cluster.Log("coordinator").c_str());
    return false;
  };
  const std::string checkpoints = cluster.dir() + "/checkpoints-" + std::to_string(run);
  auto job_id = cluster.Submit(JobYaml(layout, checkpoints));
  if (!job_id.ok()) return fail("submit: " + job_id.status().ToString());
  auto job = cluster.WaitForJobEnd(*job_id, 300s);
  if (!job.ok()) return fail("waiting for the job: " + job.status().ToString());
  if ((*job)["state"] != "succeeded") return fail("the job did not succeed: " + job->dump(2));
  const json& train = (*job)["train"];
  const json& plan = train["plan"];
  // A prediction priced with defaults or an earlier job's numbers is not what the target is on.
  if (!plan["prediction_calibrated"].get<bool>()) {
    return fail("not priced with its own calibration: " + plan.dump(2));
  }
  out.predicted = plan["predicted_step_seconds"].get<double>();
  out.measured = train["step_seconds"].get<double>();
  if (!(out.predicted > 0) || !(out.measured > 0)) {
    return fail("no prediction or no measurement: " + train.dump(2));
  }
  const double compute = train["compute_seconds"].get<double>();
  const double comm = train["comm_seconds"].get<double>();
  const double bubble = train["bubble_seconds"].get<double>();
  out.comm_share = comm / std::max(compute + comm + bubble, 1e-12);
  std::printf(
      "%s job %d: predicted %.3f s/step, measured %.3f s/step (compute %.4f, comm %.4f = %.0f%%, "
      "bubble %.4f): measured/predicted %.2f\n",
      layout.name, run, out.predicted, out.measured, compute, comm, 100 * out.comm_share, bubble,
      out.measured / out.predicted);
  // What the prediction was made of, from the coordinator's last pricing of a job.
  const std::string log = cluster.Log("coordinator");
  const size_t priced = log.rfind("predicted at ");
  if (priced != std::string::npos) {
    const size_t end = log.find('\n', priced);
    std::printf("  %s\n",
                log.substr(priced, end == std::string::npos ? end : end - priced).c_str());
  }
  std::fflush(stdout);
  return true;
}

[[noreturn]] void Usage(const char* program, const std::string& why) {
  std::fprintf(stderr, "%s: %s\nusage: %s [--runs N] [--layouts NAME,NAME...]\nlayouts:", program,
               why.c_str(), program);
  for (const Layout& layout : kLayouts) std::fprintf(stderr, " %s", layout.name);
  std::fprintf(stderr, "\n");
  std::exit(2);
}

}  // namespace
}  // namespace shardline

int main(int argc, char** argv) {
  using namespace shardline;
  int runs = 2;
  std::vector<Layout> layouts;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") Usage(argv[0], "help");
    if (flag != "--runs" && flag != "--layouts") Usage(argv[0], "unknown argument " + flag);
    if (i + 1 >= argc) Usage(argv[0], flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--runs") {
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 1 || n > 100) {
        Usage(argv[0], "--runs: not an integer in 1..100: " + value);
      }
      runs = static_cast<int>(n);
      continue;
    }
    for (size_t start = 0; start <= value.size();) {
      const size_t comma = std::min(value.find(',', start), value.size());
      const std::string name = value.substr(start, comma - start);
      const Layout* found = nullptr;
      for (const Layout& layout : kLayouts) {
        if (name == layout.name) found = &layout;
      }
      if (found == nullptr) Usage(argv[0], "--layouts: unknown layout '" + name + "'");
      layouts.push_back(*found);
      start = comma + 1;
    }
  }
  if (layouts.empty()) layouts.assign(std::begin(kLayouts), std::end(kLayouts));

  std::printf(
      "step time prediction: %zu layouts x %d jobs; dp2..tp2: GPT of 4 layers, d_model 256, "
      "batch 8 (micro-batch 2) x 128 tokens, 8 steps, on 2 CPU devices of one agent; up: the "
      "default job on %d devices; up4: on 4\n",
      layouts.size(), runs, DevicesOf(kLayouts[4]));
  struct Summary {
    std::string name;
    int jobs = 0;                                                      // that ran
    double predicted = 0, measured = 0, ratio = 0, low = 0, high = 0;  // geometric means, range
    double comm_share = 0;                                             // mean
  };
  std::vector<Summary> summaries;
  bool all_ran = true;
  for (const Layout& layout : layouts) {
    Summary summary{.name = layout.name};
    // A fresh cluster per layout, as the test has.
    LocalCluster cluster;
    absl::Status started = cluster.StartCoordinator();
    if (started.ok()) started = cluster.StartAgent("node-a", "cpu:" + std::to_string(DevicesOf(layout))).status();
    if (started.ok()) started = cluster.WaitForAliveNodes(1, 15s);
    if (!started.ok()) {
      std::fprintf(stderr, "%s: starting the cluster: %s\n%s\n", layout.name,
                   started.ToString().c_str(), cluster.Log("coordinator").c_str());
    }
    std::vector<Run> done;
    for (int run = 1; started.ok() && run <= runs; ++run) {
      Run one;
      if (RunJob(cluster, layout, run, one)) done.push_back(one);
    }
    summary.jobs = static_cast<int>(done.size());
    all_ran = all_ran && summary.jobs == runs;
    if (!done.empty()) {
      double log_predicted = 0, log_measured = 0;
      summary.low = summary.high = done[0].measured / done[0].predicted;
      for (const Run& r : done) {
        log_predicted += std::log(r.predicted);
        log_measured += std::log(r.measured);
        summary.low = std::min(summary.low, r.measured / r.predicted);
        summary.high = std::max(summary.high, r.measured / r.predicted);
      }
      summary.predicted = std::exp(log_predicted / done.size());
      summary.measured = std::exp(log_measured / done.size());
      // The geometric mean of the ratios is the ratio of the geometric means.
      summary.ratio = summary.measured / summary.predicted;
      for (const Run& r : done) summary.comm_share += r.comm_share / done.size();
    }
    summaries.push_back(summary);
  }

  std::printf("\n%-10s %5s %17s %16s %19s %10s %11s %6s\n", "LAYOUT", "JOBS", "PREDICTED s/step",
              "MEASURED s/step", "MEASURED/PREDICTED", "RANGE", "WITHIN 25%", "COMM");
  int within = 0, measured_layouts = 0;
  for (const Summary& s : summaries) {
    if (s.jobs == 0) {
      std::printf("%-10s %5d %17s %16s %19s %10s %11s\n", s.name.c_str(), 0, "-", "-", "-", "-",
                  "-");
      continue;
    }
    const bool ok = std::abs(s.ratio - 1) <= kTarget;
    ++measured_layouts;
    within += ok ? 1 : 0;
    char range[32];
    std::snprintf(range, sizeof(range), "%.2f-%.2f", s.low, s.high);
    std::printf("%-10s %5d %17.3f %16.3f %19.2f %10s %11s %5.0f%%\n", s.name.c_str(), s.jobs,
                s.predicted, s.measured, s.ratio, range, ok ? "yes" : "no", 100 * s.comm_share);
  }
  std::printf("%d of %d layouts within %.0f%% (geometric means over the jobs of each)%s\n", within,
              measured_layouts, kTarget * 100, all_ran ? "" : "; some jobs failed to run (above)");
  return all_ran ? 0 : 1;
}
