// Which nodes are in the cluster, their devices, and whether they are alive. Pure bookkeeping:
// the clock is passed in and nothing here does I/O, so timeouts are tested without sleeping.
// Not thread-safe: owned by the coordinator's event loop.
#pragma once

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"

namespace shardline::coordinator {

struct DeviceInfo {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;
  uint64_t memory_bytes = 0;
  std::string name;
  std::string busy_job;  // the job whose actor holds this device; empty when free
  // Why placements leave this device out while others are free: a generation's root cause was
  // the death or hang of the actor on it (the fault, described). Gone when its node registers
  // again (a new entry).
  std::string avoided;
};

std::string DeviceLabel(const DeviceInfo& device);  // "cpu:0", "cuda:3"

struct NodeInfo {
  std::string node_id;
  std::string instance_id;  // distinguishes a restarted agent from a second agent
  std::string hostname;
  std::string address;
  std::string address_chosen_by;  // why that address, as the agent chose it
  std::string metrics_address;
  std::string peer;  // ROUTER routing id of the agent's connection
  uint32_t pid = 0;
  std::vector<DeviceInfo> devices;
  bool alive = true;
  TimePoint last_heartbeat;
  // The actors its agent's last heartbeat saw stopped (SIGSTOP): "JOB/GENERATION/RANK".
  std::set<std::string> stopped_actors;
};

// The key of NodeInfo::stopped_actors.
inline std::string ActorKey(const std::string& job_id, uint32_t generation, uint32_t rank) {
  return job_id + "/" + std::to_string(generation) + "/" + std::to_string(rank);
}

class Membership {
 public:
  explicit Membership(std::chrono::milliseconds heartbeat_timeout)
      : heartbeat_timeout_(heartbeat_timeout) {}

  // What a registration of a node that was known before means for the jobs placed on it.
  enum class Rejoin {
    kNew,             // first seen, or back after it was dead: new capacity
    kAgentRestarted,  // a live node's agent came back as a new instance: its actors are gone
    kDevicesChanged,  // the same agent with another device set, while jobs hold its devices:
                      // new capacity, never merged into the generations placed on the old set
    kSameAgent,       // the same agent again (a lost reply): its devices stay held
  };
  // Adds or replaces a node. A second agent claiming the id of a node that is alive (another
  // instance, heartbeat within the timeout) is refused with AlreadyExists; a node that comes back
  // (dead, or the same instance re-registering) replaces its old entry.
  absl::StatusOr<Rejoin> Register(NodeInfo node, TimePoint now);

  // NotFound when the node is unknown, dead or another instance: the agent must register again.
  absl::Status Heartbeat(const std::string& node_id, const std::string& instance_id,
                         TimePoint now);

  // Marks nodes silent past the timeout dead and returns their ids (each once).
  std::vector<std::string> ExpireSilentNodes(TimePoint now);

  NodeInfo* Find(const std::string& node_id);
  const std::map<std::string, NodeInfo>& nodes() const { return nodes_; }
  std::map<std::string, NodeInfo>& mutable_nodes() { return nodes_; }
  std::chrono::milliseconds heartbeat_timeout() const { return heartbeat_timeout_; }

 private:
  std::chrono::milliseconds heartbeat_timeout_;
  std::map<std::string, NodeInfo> nodes_;  // ordered: placement and status list nodes stably
};

}  // namespace shardline::coordinator
