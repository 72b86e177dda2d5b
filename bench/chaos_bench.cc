// 100 seeded faults into one elastic train job on a local cluster (2 agents of 3 CPU devices,
// tp 2 × dp 1..2): kill -9 and SIGSTOP of actors, kill -9 of an agent (restarted), kill -9 and
// restart of the coordinator (tests/support/chaos.h); with --namespaces each agent runs in a
// network namespace of its own (root) and cuts of host 2's link, then restored, join them.
// Prints, per fault class, p50/p99 of the detection latency (fault → abort), the abort (→ every
// actor gone), fault → first new step, and the steps lost, and where the next generations resumed
// from; then a `result` line. The short version with the end-state checks is ctest's
// ClusterChaosTest. --memory-interval K (and --memory-replicas 1) give the job memory steps
// (checkpoint.memory_interval): run it with and without to see the steps lost each way.
//
//   build-dev/bench/chaos_bench [--faults N] [--seed S] [--namespaces] [--memory-interval K]
//       [--memory-replicas R]
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/integration/local_cluster.h"
#include "tests/support/chaos.h"
#include "tests/support/net_namespaces.h"

using namespace shardline::testing;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  ChaosOptions options;
  options.faults = 100;
  options.seed = 1;
  bool namespaces = false;
  int memory_interval = 0, memory_replicas = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--faults" && i + 1 < argc) options.faults = std::atoi(argv[++i]);
    else if (flag == "--seed" && i + 1 < argc) options.seed = std::strtoull(argv[++i], nullptr, 10);
    else if (flag == "--namespaces") namespaces = true;
    else if (flag == "--memory-interval" && i + 1 < argc)
      memory_interval = std::atoi(argv[++i]);
    else if (flag == "--memory-replicas" && i + 1 < argc)
      memory_replicas = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: chaos_bench [--faults N] [--seed S] [--namespaces] "
                   "[--memory-interval K] [--memory-replicas R]\n");
      return 2;
    }
  }
  const std::string memory = memory_interval > 0
                                 ? ", memory_interval: " + std::to_string(memory_interval) +
                                       ", memory_replicas: " + std::to_string(memory_replicas)
                                 : "";
  options.agents = {{"node-b", "cpu:3"}};
  std::optional<NetNamespaces> hosts;
  LocalCluster::Options cluster_options;
  if (namespaces) {
    auto made = NetNamespaces::Create(2);
    if (!made.ok()) {
      std::fprintf(stderr, "cannot make network namespaces: %s\n",
                   std::string(made.status().message()).c_str());
      return 1;
    }
    hosts.emplace(std::move(*made));
    cluster_options.coordinator_host = hosts->address(0);
    options.kinds.push_back(ChaosFault::kCutLink);
    options.agent_netns = {{"node-b", hosts->netns(2)}};
    options.set_link = [&](const std::string& node, bool up) {
      return node == "node-b" ? hosts->SetLink(2, up)
                              : absl::InvalidArgumentError("no link of node " + node);
    };
  }
  LocalCluster cluster(cluster_options);
  const auto start_agent = [&](const std::string& node, int host) {
    return hosts ? cluster.StartAgentIn(hosts->netns(host), node, "cpu:3").status()
                 : cluster.StartAgent(node, "cpu:3").status();
  };
  if (!cluster.StartCoordinator().ok() || !start_agent("node-a", 1).ok() ||
      !start_agent("node-b", 2).ok() || !cluster.WaitForAliveNodes(2, 20s).ok()) {
    std::fprintf(stderr, "could not start the cluster\n");
    return 1;
  }
  auto id = cluster.Submit(
      "name: chaos\nkind: train\ndevices: cpu\n"
      "model: {layers: 2, heads: 4, d_model: 32, max_seq_len: 16}\n"
      "data: {synthetic: {seed: 2, bytes: 64KiB}}\n"
      "steps: 1000000\nbatch: 8\nseq_len: 16\nlog_interval: 2\n"
      "checkpoint: {dir: " +
      cluster.dir() + "/chaos, interval: 10, keep: 2" + memory +
      "}\n"
      "parallel: {tp: 2, dp: 2}\n"
      "elastic: {min_actors: 2, max_actors: 4, max_restarts: 100000, progress_timeout_s: 1.5}\n");
  if (!id.ok()) {
    std::fprintf(stderr, "submit: %s\n", std::string(id.status().message()).c_str());
    return 1;
  }
  auto records = RunChaos(cluster, *id, options);
  RunShardline({"cancel", *id, "--coordinator", cluster.endpoint()});
  if (!records.ok()) {
    std::fprintf(stderr, "%s\n", std::string(records.status().message()).c_str());
    return 1;
  }
  std::map<std::string, std::vector<ChaosRecord>> by_class;
  int misnamed = 0;
  for (const ChaosRecord& record : *records) {
    by_class[ChaosFaultName(record.fault)].push_back(record);
    const std::string expected = ExpectedCause(record.fault);
    if (record.cause_kind != expected) {
      ++misnamed;
      std::printf("misnamed: %s named %s: %s\n", ChaosFaultName(record.fault).c_str(),
                  record.cause_kind.c_str(), record.cause.c_str());
    }
  }
  std::printf("%-22s %5s  %-17s %-17s %-17s %-13s %s\n", "fault", "n", "detect p50/p99 s",
              "abort p50/p99 s", "first step p50/p99", "lost p50/p99", "resumed from");
  std::vector<double> all_first_step;
  for (const auto& [name, list] : by_class) {
    std::vector<double> detect, abort, first, lost;
    std::map<std::string, int> sources;
    for (const ChaosRecord& r : list) {
      ++sources[r.resumed_from.empty() ? "?" : r.resumed_from];
      detect.push_back(r.detection_seconds);
      if (r.abort_seconds >= 0) abort.push_back(r.abort_seconds);
      first.push_back(r.first_step_seconds);
      all_first_step.push_back(r.first_step_seconds);
      lost.push_back(static_cast<double>(r.steps_lost));
    }
    const auto [d50, d99] = Percentiles(detect);
    const auto [a50, a99] = Percentiles(abort);
    const auto [f50, f99] = Percentiles(first);
    const auto [l50, l99] = Percentiles(lost);
    std::string from;
    for (const auto& [source, n] : sources) {
      from += (from.empty() ? "" : ", ") + source + " " + std::to_string(n);
    }
    std::printf("%-22s %5zu  %6.3f / %-8.3f %6.3f / %-8.3f %6.3f / %-8.3f %4.0f / %-4.0f  %s\n",
                name.c_str(), list.size(), d50, d99, a50, a99, f50, f99, l50, l99, from.c_str());
  }
  // The faults that lost more than a step with memory steps on, and why.
  for (const ChaosRecord& r : *records) {
    if (memory_interval > 0 && r.steps_lost > memory_interval) {
      std::printf("lost %lld: %s resumed from %s step %lld%s%s\n",
                  static_cast<long long>(r.steps_lost), ChaosFaultName(r.fault).c_str(),
                  r.resumed_from.c_str(), static_cast<long long>(r.resumed_step),
                  r.resume_note.empty() ? "" : ": ", r.resume_note.c_str());
    }
  }
  const auto [f50, f99] = Percentiles(all_first_step);
  std::vector<double> all_lost;
  for (const ChaosRecord& r : *records) all_lost.push_back(static_cast<double>(r.steps_lost));
  const auto [l50, l99] = Percentiles(all_lost);
  std::printf(
      "result chaos faults=%zu misnamed=%d first_step_p50_s=%.3f first_step_p99_s=%.3f "
      "steps_lost_p50=%.0f steps_lost_p99=%.0f memory_interval=%d memory_replicas=%d\n",
      records->size(), misnamed, f50, f99, l50, l99, memory_interval, memory_replicas);
  return misnamed == 0 ? 0 : 1;
}
