// A seeded chaos driver for one elastic train job on a LocalCluster: it injects faults at random
// moments (kill -9 of an actor, SIGSTOP of an actor, kill -9 of an agent and its restart, kill -9
// and restart of the coordinator, and with agents in network namespaces a cut of a host's link
// and its restore), waits for the supervisor to bring the job back each time, and
// records per fault what the job's generation records say: detection, abort, fault → first new
// step, steps lost. Used by tests/integration/cluster_chaos_test.cc (about 10 faults) and
// bench/chaos_bench.cc (100).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/integration/local_cluster.h"

namespace shardline::testing {

enum class ChaosFault { kKillActor, kStopActor, kKillAgent, kRestartCoordinator, kCutLink };
std::string ChaosFaultName(ChaosFault fault);
// The cause kind the supervisor must name for the fault ("actor_exit", "hung", ...).
std::string ExpectedCause(ChaosFault fault);

struct ChaosOptions {
  uint64_t seed = 1;
  int faults = 10;
  std::vector<ChaosFault> kinds = {ChaosFault::kKillActor, ChaosFault::kStopActor,
                                   ChaosFault::kKillAgent, ChaosFault::kRestartCoordinator};
  // The moment of each fault: this much training after the job is back, at random within.
  std::chrono::milliseconds min_gap{100};
  std::chrono::milliseconds max_gap{800};
  std::chrono::seconds recovery_timeout{60};
  // Agents the driver may kill and restart, or cut off: node id → devices ("cpu:2").
  std::map<std::string, std::string> agents;
  // The network namespace each of those agents runs in (absent: the root namespace's).
  std::map<std::string, std::string> agent_netns;
  // kCutLink: takes a node's link down (up = false) or up again. The driver cuts one of
  // `agents`, waits until the supervisor has lost it, and restores it (the node registers again).
  std::function<absl::Status(const std::string& node, bool up)> set_link;
};

struct ChaosRecord {
  ChaosFault fault = ChaosFault::kKillActor;
  std::string cause_kind;      // what the supervisor named
  std::string cause;
  double detection_seconds = -1;   // injection → the abort
  double abort_seconds = -1;       // abort → every actor gone
  double first_step_seconds = -1;  // injection → the next generation's first step
  int64_t steps_lost = 0;
  // Where the next generation resumed from ("disk", "memory", "memory replica"; "" when it had
  // not said so when the record was taken).
  std::string resumed_from;
  std::string resume_note;  // why not from a memory step, when it said
  int64_t resumed_step = 0;
};

// Drives job `job_id`, which must be running on `cluster` with checkpoints on; returns a record
// per fault, or the first way the job failed to come back.
absl::StatusOr<std::vector<ChaosRecord>> RunChaos(LocalCluster& cluster, const std::string& job_id,
                                                  const ChaosOptions& options);

// p50 and p99 of `values` (nearest rank); {-1, -1} when empty.
std::pair<double, double> Percentiles(std::vector<double> values);

// A process's open file descriptors and resident set (bytes), from /proc; -1 when unreadable.
int OpenFds(pid_t pid);
int64_t ResidentBytes(pid_t pid);

}  // namespace shardline::testing
