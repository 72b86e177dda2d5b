// The actor: one process per assigned device. It registers with the coordinator, receives its
// assignment, joins its communicator groups through the coordinator's store, runs its part of
// the job and reports. Errors are reported to the coordinator, never hidden in a crash.
#pragma once

#include <string>

namespace shardline::actor {

struct ActorOptions {
  std::string coordinator;
  std::string cluster_id = "shardline";
  std::string job_id;
  uint32_t generation = 0;
  uint32_t rank = 0;
  std::string node_id;
  std::string device = "cpu:0";  // cpu:N | cuda:N
  std::string metrics_address;   // empty: this node's address, any port
};

// Runs the actor to the end and returns the process exit code: 0 when its part succeeded,
// 1 when it failed and said so to the coordinator, 2 when it could not reach the coordinator.
int RunActor(const ActorOptions& options);

}  // namespace shardline::actor
