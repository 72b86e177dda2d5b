// `shardline plan`: the placement planner's choice for a model on a cluster, without running
// anything. The pieces the command is made of, so that tests run them without a process.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "cli/commands.h"
#include "placement/cluster_spec.h"
#include "protocol/shardline.capnp.h"

namespace shardline::cli {

// Where the cluster comes from: the --cluster file, or else the live coordinator (only when one
// was named with --coordinator or $SHARDLINE_COORDINATOR). InvalidArgument for a missing
// --model, for neither or both sources, and for a bad --devices.
absl::Status CheckPlanOptions(const PlanOptions& options);

// The planner's view of a live cluster from a coordinator's status reply: the alive nodes'
// devices of `device_kind` ("cpu", "cuda", or "auto": cuda when any alive node has one, else cpu)
// with what calibration measured on them, busy devices included (a plan is for the cluster, not
// for what is free now). InvalidArgument when no alive node has such a device.
absl::StatusOr<placement::ClusterSpec> ClusterSpecFromStatus(wire::ClusterStatus::Reader status,
                                                             const std::string& device_kind);

// The command's whole output (FormatPlan, or PlanToJson with --json): loads the model, the
// cluster (from options.cluster_path, or from `live_cluster` when it is empty) and the train
// set-up, and plans. Errors name the file, line and column of bad input; the planner's own
// verdicts (nothing fits, and by how much) come back as its Status.
absl::StatusOr<std::string> PlanOutput(
    const PlanOptions& options,
    const std::function<absl::StatusOr<placement::ClusterSpec>()>& live_cluster);

}  // namespace shardline::cli
