// A job's state as the coordinator tracks it: its spec, its current generation, every actor of
// that generation and every communicator group. Pure data; the Coordinator drives the transitions.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "coordinator/membership.h"
#include "placement/job_spec.h"

namespace shardline::coordinator {

enum class JobState { kPending, kRunning, kSucceeded, kFailed, kCancelled };
// Where a running job's current generation is.
enum class Phase { kNone, kSpawning, kBootstrapping, kRunning };
enum class ActorState { kSpawning, kRegistered, kBootstrapping, kReady, kRunning, kSucceeded,
                        kFailed, kLost };

std::string_view JobStateName(JobState state);
std::string_view PhaseName(Phase phase);
std::string_view ActorStateName(ActorState state);
bool IsFinal(JobState state);

struct ActorRecord {
  int rank = 0;
  std::string node_id;
  DeviceInfo device;
  ActorState state = ActorState::kSpawning;
  std::string detail;  // why it failed, how it exited
  std::string peer;    // ROUTER routing id once registered
  uint32_t pid = 0;
  std::string address;
  std::string metrics_address;
  bool exited = false;
};

struct GroupRecord {
  std::string kind;  // world | tp | pp | dp
  std::string id;
  std::vector<int> ranks;
  std::set<int> joined;  // ranks that started joining (CommJoin)
  std::set<int> ready;   // ranks that reported CommReady
  double bootstrap_seconds = 0;
};

struct CollectiveResultRecord {
  std::string op;
  uint64_t bytes = 0;
  uint32_t ranks = 0;
  double seconds = 0;
  double algorithm_gbps = 0;
  double bus_gbps = 0;
  bool ok = false;
  std::string detail;
};

struct Job {
  std::string id;
  placement::JobSpec spec;
  std::string spec_yaml;
  std::string backend;  // resolved: gloo | nccl
  JobState state = JobState::kPending;
  Phase phase = Phase::kNone;
  std::string error;
  std::string waiting_reason;  // why a pending job has not started
  uint32_t generation = 0;
  int64_t submitted_unix_ms = 0;
  int64_t finished_unix_ms = 0;
  TimePoint generation_started;
  TimePoint bootstrap_deadline;
  TimePoint run_deadline;
  std::vector<ActorRecord> actors;  // index = rank
  std::vector<GroupRecord> groups;
  std::vector<CollectiveResultRecord> results;

  // The key prefix of this generation in the coordinator's store.
  std::string StorePrefix() const {
    return "job/" + id + "/gen/" + std::to_string(generation);
  }
};

}  // namespace shardline::coordinator
