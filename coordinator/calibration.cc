#include "coordinator/calibration.h"

#include <algorithm>
#include <set>

#include "placement/cost_model.h"

namespace shardline::coordinator {
namespace {

// Folds one measurement into `link`: a newer source replaces, the same source keeps the most
// conservative numbers (every member of a group reports the same agreed numbers, but several
// groups of one generation may cover the same link).
void Fold(LinkCalibration& link, double bandwidth, double latency, const std::string& source) {
  if (link.source != source || link.bus_bytes_per_second <= 0) {
    link.bus_bytes_per_second = bandwidth;
    link.latency_seconds = latency;
    link.source = source;
    return;
  }
  link.bus_bytes_per_second = std::min(link.bus_bytes_per_second, bandwidth);
  link.latency_seconds = std::max(link.latency_seconds, latency);
}

}  // namespace

ComputeRate NodeCalibration::Compute() const {
  ComputeRate slowest;
  double optimizer = 0;
  for (const auto& [device, rate] : device_compute) {
    if (rate.flops > 0 && (slowest.flops == 0 || rate.flops < slowest.flops)) slowest = rate;
    const double o = rate.optimizer_bytes_per_second;
    if (o > 0 && (optimizer == 0 || o < optimizer)) optimizer = o;
  }
  slowest.optimizer_bytes_per_second = optimizer;
  return slowest;
}

void CalibrationBook::RecordCompute(const std::string& node_id, const std::string& device,
                                    ComputeRate rate, const std::string& job_id,
                                    int64_t unix_ms) {
  if (!(rate.flops > 0) || !(rate.half_dim >= 0)) return;  // not measured (a GPU rank), or garbage
  if (!(rate.optimizer_bytes_per_second > 0)) rate.optimizer_bytes_per_second = 0;
  NodeCalibration& node = nodes_[node_id];
  node.device_compute[device] = rate;
  node.job_id = job_id;
  node.measured_unix_ms = unix_ms;
}

void CalibrationBook::RecordGroup(const std::vector<std::string>& rank_nodes,
                                  double bus_bytes_per_second, double latency_seconds,
                                  const std::string& source, const std::string& job_id,
                                  int64_t unix_ms) {
  if (!(bus_bytes_per_second > 0) || !(latency_seconds >= 0)) return;
  const std::set<std::string> nodes(rank_nodes.begin(), rank_nodes.end());
  if (nodes.empty() || rank_nodes.size() < 2) return;
  const bool one_node = nodes.size() == 1;
  // The planner's time model charges a collective CollectiveLatencySteps link latencies: the
  // measured start-up of the whole all-reduce is that many of them.
  const double link_latency =
      latency_seconds / placement::CollectiveLatencySteps(static_cast<int>(rank_nodes.size()));
  for (const std::string& node_id : nodes) {
    NodeCalibration& node = nodes_[node_id];
    Fold(one_node ? node.intra : node.inter, bus_bytes_per_second, link_latency, source);
    node.job_id = job_id;
    node.measured_unix_ms = unix_ms;
  }
}

const NodeCalibration* CalibrationBook::Find(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? nullptr : &it->second;
}

absl::StatusOr<placement::ClusterSpec> BuildClusterSpec(const std::string& name,
                                                        const std::vector<PlannableNode>& nodes) {
  std::vector<placement::NodeReport> reports;
  for (const PlannableNode& node : nodes) {
    if (node.devices < 1) continue;
    placement::NodeReport report;
    report.node_id = node.node_id;
    report.device_kind = node.device_kind;
    report.devices = node.devices;
    report.memory_bytes = node.memory_bytes;
    const ComputeRate compute = node.calibration.Compute();
    report.measured_flops = compute.flops;
    report.measured_half_dim = compute.half_dim;
    report.measured_memory_bandwidth = compute.optimizer_bytes_per_second;
    report.measured_precision = placement::Precision::kFp32;  // what the actors measure
    report.measured_intra_bandwidth = node.calibration.intra.bus_bytes_per_second;
    report.measured_inter_bandwidth = node.calibration.inter.bus_bytes_per_second;
    reports.push_back(std::move(report));
  }
  if (reports.empty()) {
    return absl::InvalidArgumentError("cluster '" + name + "' has no device to plan on");
  }
  auto spec = placement::ClusterSpecFromNodes(name, reports);
  if (!spec.ok()) return spec.status();
  // NodeReport carries no latency: a measured one replaces the kind's nominal latency here.
  for (placement::NodeSpec& node : spec->nodes) {
    auto it = std::find_if(nodes.begin(), nodes.end(),
                           [&](const PlannableNode& n) { return n.node_id == node.id; });
    if (it == nodes.end()) continue;
    if (it->calibration.intra.bus_bytes_per_second > 0) {
      node.intra_node.latency_s = it->calibration.intra.latency_seconds;
    }
    if (it->calibration.inter.bus_bytes_per_second > 0) {
      node.inter_node.latency_s = it->calibration.inter.latency_seconds;
    }
  }
  return spec;
}

std::vector<PlannableNode> PlannableNodes(const Membership& membership, const CalibrationBook& book,
                                          DeviceInfo::Kind kind, bool free_only,
                                          std::map<std::string, std::vector<int>>* slots,
                                          bool skip_avoided) {
  std::vector<PlannableNode> out;
  for (const auto& [node_id, node] : membership.nodes()) {
    if (!node.alive) continue;
    PlannableNode plannable;
    plannable.node_id = node_id;
    std::vector<int> used;
    for (size_t d = 0; d < node.devices.size(); ++d) {
      const DeviceInfo& device = node.devices[d];
      if (device.kind != kind || (free_only && !device.busy_job.empty()) ||
          (skip_avoided && !device.avoided.empty())) {
        continue;
      }
      used.push_back(static_cast<int>(d));
      const auto memory = static_cast<int64_t>(device.memory_bytes);
      if (plannable.memory_bytes == 0 || (memory > 0 && memory < plannable.memory_bytes)) {
        plannable.memory_bytes = memory;
      }
      // The driver's name says which accelerator it is; a CPU device is "cpu" whatever its name.
      if (plannable.device_kind.empty()) {
        plannable.device_kind = kind == DeviceInfo::Kind::kCpu ? "cpu" : device.name;
      }
    }
    if (used.empty()) continue;
    plannable.devices = static_cast<int>(used.size());
    if (const NodeCalibration* calibration = book.Find(node_id)) {
      plannable.calibration = *calibration;
    }
    if (slots != nullptr) (*slots)[node_id] = used;
    out.push_back(std::move(plannable));
  }
  return out;
}

}  // namespace shardline::coordinator
