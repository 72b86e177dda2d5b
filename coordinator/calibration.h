// What the coordinator knows of its nodes' speed: the actors' start-up measurements (wire
// Calibration) folded per node, and the placement::ClusterSpec the planner plans with, built from
// membership and those measurements. Pure bookkeeping (no I/O, no clock): owned by the
// coordinator's event loop; `shardline plan` builds the same spec from a status reply.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/membership.h"
#include "placement/cluster_spec.h"

namespace shardline::coordinator {

// One kind of link of one node, as the latest job generation that used it measured it.
struct LinkCalibration {
  double bus_bytes_per_second = 0;  // 0: never measured
  // One link step's start-up: a measured all-reduce start-up of n ranks (what it adds between
  // kernels, less its bytes' time) over the placement::CollectiveLatencySteps(n) steps the
  // planner's time model charges a collective.
  double latency_seconds = 0;
  std::string source;  // "JOB/GENERATION" of the measurement
};

// A device's transformer-layer rate (the actor's LayerRate): FLOP/s approached by wide layers and
// the size min(tokens, d_model) at which a layer reaches half of it.
struct ComputeRate {
  double flops = 0;  // 0: never measured
  double half_dim = 0;
  // The optimizer step, in placement::kOptimizerBytesPerParam bytes per parameter per second;
  // 0: never measured.
  double optimizer_bytes_per_second = 0;
};

struct NodeCalibration {
  // fp32 layer rates by device ("cpu:0"), each the latest measurement of that device.
  std::map<std::string, ComputeRate> device_compute;
  LinkCalibration intra;  // groups whose ranks all ran on this node
  LinkCalibration inter;  // groups that spanned this node and others
  std::string job_id;     // the job whose report came last
  int64_t measured_unix_ms = 0;

  // The node's devices as the planner sees them: the slowest measured one (a stage is as fast as
  // its slowest device), and the slowest optimizer step of any; 0 when none was measured.
  ComputeRate Compute() const;
};

class CalibrationBook {
 public:
  // One device's layer-rate measurement (ignored unless flops > 0 and half_dim ≥ 0; an optimizer
  // rate that is not > 0 counts as unmeasured).
  void RecordCompute(const std::string& node_id, const std::string& device, ComputeRate rate,
                     const std::string& job_id, int64_t unix_ms);
  // One group's all-reduce measurement; `rank_nodes` is the node of each of its ranks. A group
  // on one node calibrates that node's intra-node link, a group over several their inter-node
  // links. Within one source (job generation) the most conservative report stands (the lowest
  // bandwidth, the highest latency); a newer source replaces an older one's.
  void RecordGroup(const std::vector<std::string>& rank_nodes, double bus_bytes_per_second,
                   double latency_seconds, const std::string& source, const std::string& job_id,
                   int64_t unix_ms);

  const NodeCalibration* Find(const std::string& node_id) const;
  const std::map<std::string, NodeCalibration>& nodes() const { return nodes_; }

 private:
  std::map<std::string, NodeCalibration> nodes_;  // by node id; survives agent restarts
};

// One node's devices of one kind, as the planner should see them.
struct PlannableNode {
  std::string node_id;
  std::string device_kind;  // "cpu", or the driver's name of a CUDA device
  int devices = 0;
  int64_t memory_bytes = 0;  // per device (the smallest of the node's)
  NodeCalibration calibration;
};

// A validated ClusterSpec named `name` from `nodes` (placement::ClusterSpecFromNodes with the
// measurements; measured latencies replace the device kind's nominal ones). Nodes without devices
// are left out; InvalidArgument when none is left or the planner's builder refuses a node.
absl::StatusOr<placement::ClusterSpec> BuildClusterSpec(const std::string& name,
                                                        const std::vector<PlannableNode>& nodes);

// The planner's view of the devices of `kind` on the alive nodes of `membership`: all of them, or
// with `free_only` those no job holds (and with `skip_avoided` not those a fault pointed at).
// `slots` (optional) gets, per node id, the indices into NodeInfo::devices of the devices
// counted, in order: device d of a planned node is slots[node_id][d].
std::vector<PlannableNode> PlannableNodes(const Membership& membership, const CalibrationBook& book,
                                          DeviceInfo::Kind kind, bool free_only,
                                          std::map<std::string, std::vector<int>>* slots,
                                          bool skip_avoided = false);

}  // namespace shardline::coordinator
