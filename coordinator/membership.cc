#include "coordinator/membership.h"

#include <map>
#include <set>

namespace shardline::coordinator {

std::string DeviceLabel(const DeviceInfo& device) {
  return std::string(device.kind == DeviceInfo::Kind::kCuda ? "cuda:" : "cpu:") +
         std::to_string(device.index);
}

absl::StatusOr<Membership::Rejoin> Membership::Register(NodeInfo node, TimePoint now) {
  if (node.node_id.empty()) return absl::InvalidArgumentError("register: empty node id");
  if (node.devices.empty()) {
    return absl::InvalidArgumentError("register: node '" + node.node_id + "' has no devices");
  }
  Rejoin rejoin = Rejoin::kNew;
  auto it = nodes_.find(node.node_id);
  if (it != nodes_.end()) {
    NodeInfo& old = it->second;
    const bool live = old.alive && now - old.last_heartbeat < heartbeat_timeout_;
    if (live && old.instance_id != node.instance_id) {
      return absl::AlreadyExistsError(
          "node id '" + node.node_id + "' is held by a live agent (pid " + std::to_string(old.pid) +
          " at " + old.address + ", last heartbeat " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                             now - old.last_heartbeat)
                             .count()) +
          " ms ago); pick another --node-id or stop that agent");
    }
    if (old.alive) {
      // Devices a live generation holds, by label, on the entry this one replaces.
      std::map<std::string, std::string> busy;
      std::set<std::string> old_labels, labels;
      for (const DeviceInfo& device : old.devices) {
        old_labels.insert(DeviceLabel(device));
        if (!device.busy_job.empty()) busy[DeviceLabel(device)] = device.busy_job;
      }
      for (const DeviceInfo& device : node.devices) labels.insert(DeviceLabel(device));
      if (old.instance_id != node.instance_id) {
        rejoin = Rejoin::kAgentRestarted;
      } else if (!busy.empty() && labels != old_labels) {
        rejoin = Rejoin::kDevicesChanged;
      } else if (!busy.empty()) {
        rejoin = Rejoin::kSameAgent;
        for (DeviceInfo& device : node.devices) {
          auto held = busy.find(DeviceLabel(device));
          if (held != busy.end()) device.busy_job = held->second;
        }
      }
    }
  }
  node.alive = true;
  node.last_heartbeat = now;
  nodes_[node.node_id] = std::move(node);
  return rejoin;
}

absl::Status Membership::Heartbeat(const std::string& node_id, const std::string& instance_id,
                                   TimePoint now) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || !it->second.alive || it->second.instance_id != instance_id) {
    return absl::NotFoundError("node '" + node_id + "' is not registered here; register again");
  }
  it->second.last_heartbeat = now;
  return absl::OkStatus();
}

std::vector<std::string> Membership::ExpireSilentNodes(TimePoint now) {
  std::vector<std::string> dead;
  for (auto& [id, node] : nodes_) {
    if (node.alive && now - node.last_heartbeat >= heartbeat_timeout_) {
      node.alive = false;
      for (auto& device : node.devices) device.busy_job.clear();
      dead.push_back(id);
    }
  }
  return dead;
}

NodeInfo* Membership::Find(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? nullptr : &it->second;
}

}  // namespace shardline::coordinator
