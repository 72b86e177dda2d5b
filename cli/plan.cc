// `shardline plan --model M.yaml (--cluster C.yaml | --coordinator ADDR) [--train T.yaml]`.
#include "cli/plan.h"

#include <iostream>
#include <map>

#include "cli/coordinator_client.h"
#include "common/status_macros.h"
#include "coordinator/calibration.h"
#include "model/tensor_table.h"
#include "nlohmann/json.hpp"
#include "placement/byte_size.h"
#include "placement/checkpoint_state.h"
#include "placement/plan_request.h"
#include "placement/planner.h"
#include "placement/train_spec.h"
#include "protocol/envelope.h"
#include "protocol/rpc_client.h"

namespace shardline::cli {
namespace {

using protocol::Str;

coordinator::NodeCalibration CalibrationOf(wire::NodeStatus::Reader node) {
  coordinator::NodeCalibration out;
  if (!node.hasCalibration()) return out;
  const auto in = node.getCalibration();
  for (auto device : in.getDevices()) {
    const std::string label =
        std::string(device.getDevice().getKind() == wire::DeviceKind::CUDA ? "cuda:" : "cpu:") +
        std::to_string(device.getDevice().getIndex());
    out.device_compute[label] = {device.getComputeFlops(), device.getComputeHalfDim(),
                                 device.getOptimizerBytesPerSecond()};
  }
  // A reply without the per-device list still says what the node's devices achieve.
  if (out.device_compute.empty() && in.getComputeFlops() > 0) {
    out.device_compute["node"] = {in.getComputeFlops(), in.getComputeHalfDim(),
                                  in.getOptimizerBytesPerSecond()};
  }
  out.intra.bus_bytes_per_second = in.getIntraBusBytesPerSecond();
  out.intra.latency_seconds = in.getIntraLatencySeconds();
  out.inter.bus_bytes_per_second = in.getInterBusBytesPerSecond();
  out.inter.latency_seconds = in.getInterLatencySeconds();
  out.job_id = Str(in.getJobId());
  out.measured_unix_ms = in.getMeasuredUnixMs();
  return out;
}

// InvalidArgument and NotFound are the user's input; anything else (the planner finding nothing
// that fits, an unreachable coordinator) is a result, not a usage error.
int ExitCodeOf(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ||
                 status.code() == absl::StatusCode::kNotFound
             ? 2
             : 1;
}

}  // namespace

absl::Status CheckPlanOptions(const PlanOptions& options) {
  if (options.model_path.empty()) {
    return absl::InvalidArgumentError(
        "plan: --model FILE is required (a model spec: layers, "
        "heads, d_model, max_seq_len, ...)");
  }
  if (options.devices != "auto" && options.devices != "cpu" && options.devices != "cuda") {
    return absl::InvalidArgumentError("plan: --devices must be cpu, cuda or auto, got '" +
                                      options.devices + "'");
  }
  if (options.cluster_path.empty() && !options.coordinator_given) {
    return absl::InvalidArgumentError(
        "plan: say which cluster to plan for: --cluster FILE (a cluster spec), or --coordinator "
        "ADDR (or $SHARDLINE_COORDINATOR) for the live cluster");
  }
  return absl::OkStatus();
}

absl::StatusOr<placement::ClusterSpec> ClusterSpecFromStatus(wire::ClusterStatus::Reader status,
                                                             const std::string& device_kind) {
  using Kind = coordinator::DeviceInfo::Kind;
  bool any_cuda = false;
  for (auto node : status.getNodes()) {
    if (Str(node.getState()) != "alive") continue;
    for (auto device : node.getDevices()) any_cuda |= device.getKind() == wire::DeviceKind::CUDA;
  }
  const Kind kind =
      device_kind == "cuda" || (device_kind == "auto" && any_cuda) ? Kind::kCuda : Kind::kCpu;
  const wire::DeviceKind wire_kind =
      kind == Kind::kCuda ? wire::DeviceKind::CUDA : wire::DeviceKind::CPU;
  std::vector<coordinator::PlannableNode> nodes;
  for (auto node : status.getNodes()) {
    if (Str(node.getState()) != "alive") continue;
    coordinator::PlannableNode plannable;
    plannable.node_id = Str(node.getNodeId());
    for (auto device : node.getDevices()) {
      if (device.getKind() != wire_kind) continue;
      ++plannable.devices;
      const auto memory = static_cast<int64_t>(device.getMemoryBytes());
      if (plannable.memory_bytes == 0 || (memory > 0 && memory < plannable.memory_bytes)) {
        plannable.memory_bytes = memory;
      }
      // As the coordinator names them (coordinator/calibration.cc, PlannableNodes).
      if (plannable.device_kind.empty()) {
        plannable.device_kind = kind == Kind::kCpu ? "cpu" : Str(device.getName());
      }
    }
    if (plannable.devices == 0) continue;
    plannable.calibration = CalibrationOf(node);
    nodes.push_back(std::move(plannable));
  }
  const std::string kind_name = kind == Kind::kCuda ? "cuda" : "cpu";
  if (nodes.empty()) {
    return absl::InvalidArgumentError("cluster '" + Str(status.getClusterId()) +
                                      "' has no alive node with " + kind_name + " devices");
  }
  return coordinator::BuildClusterSpec(Str(status.getClusterId()), nodes);
}

absl::StatusOr<std::string> PlanOutput(
    const PlanOptions& options,
    const std::function<absl::StatusOr<placement::ClusterSpec>()>& live_cluster) {
  RETURN_IF_ERROR(CheckPlanOptions(options));
  ASSIGN_OR_RETURN(const model::ModelConfig model,
                   placement::LoadModelConfigFile(options.model_path));
  placement::PlanTrainSpec train = placement::DefaultPlanTrainSpec();
  if (!options.train_path.empty()) {
    ASSIGN_OR_RETURN(train, placement::LoadPlanTrainSpecFile(options.train_path));
  }
  placement::ClusterSpec cluster;
  if (!options.cluster_path.empty()) {
    ASSIGN_OR_RETURN(cluster, placement::LoadClusterSpecFile(options.cluster_path));
  } else {
    ASSIGN_OR_RETURN(cluster, live_cluster());
  }
  auto request = placement::PlanRequestFor(model, cluster, train);
  if (!request.ok()) {
    const std::string where =
        options.train_path.empty() ? "the default set-up" : options.train_path;
    return Annotate(request.status(), where + " with model " + options.model_path);
  }
  ASSIGN_OR_RETURN(const placement::PlanReport report, placement::Plan(*request));
  // Memory steps, when the set-up keeps them: the host memory they take per rank of the plan.
  int64_t memory_step_bytes = 0;
  if (train.memory_interval > 0) {
    int64_t params = 0;
    for (const model::TensorRow& row : model::ModelRows(model)) params += row.numel();
    memory_step_bytes = placement::MemoryStepBytesPerRank(params, report.best.parallel,
                                                          /*diloco=*/false, train.memory_replicas);
  }
  if (options.json) {
    nlohmann::json json = placement::PlanToJson(report);
    if (train.memory_interval > 0) json["memory_step_bytes_per_rank"] = memory_step_bytes;
    return json.dump(2) + "\n";
  }
  std::string text = placement::FormatPlan(report, options.explain);
  if (train.memory_interval > 0) {
    if (!text.empty() && text.back() != '\n') text += "\n";
    text += "memory steps every " + std::to_string(train.memory_interval) +
            (train.memory_interval == 1 ? " step" : " steps") + ": " +
            placement::FormatApproxByteSize(static_cast<double>(memory_step_bytes)) +
            " of host memory per rank (" + std::to_string(placement::kMemoryStepsKept) +
            " steps of what it holds" +
            (train.memory_replicas > 0 ? ", and as much for its buddy's copy" : "") + ")\n";
  }
  return text;
}

int Plan(const ClientOptions& client_options, const PlanOptions& options) {
  auto live_cluster = [&]() -> absl::StatusOr<placement::ClusterSpec> {
    auto client = ConnectToCoordinator(client_options);
    if (!client.ok()) return client.status();
    auto reply = FetchStatus(**client, "", client_options.timeout);
    if (!reply.ok()) {
      return Annotate(reply.status(), "asking the coordinator at " + client_options.coordinator +
                                          " for its cluster");
    }
    return ClusterSpecFromStatus((*reply)->envelope().getPayload().getClusterStatus(),
                                 options.devices);
  };
  auto output = PlanOutput(options, live_cluster);
  if (!output.ok()) {
    std::cerr << "error: " << output.status().message() << "\n";
    return ExitCodeOf(output.status());
  }
  std::cout << *output;
  if (!output->empty() && output->back() != '\n') std::cout << "\n";
  return 0;
}

}  // namespace shardline::cli
