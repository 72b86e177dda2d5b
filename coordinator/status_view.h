// What `shardline status` and the metrics show of the cluster: the status reply (nodes, their
// calibration, jobs, their actors, a train job's progress and generations, a serve job's service) and the gauges, built
// from the coordinator's bookkeeping. No I/O: the coordinator sends the reply and sets the gauges.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "coordinator/calibration.h"
#include "coordinator/job.h"
#include "coordinator/membership.h"
#include "monitoring/metrics.h"
#include "protocol/envelope.h"

namespace shardline::coordinator {

// A device on the wire (spawn requests, assignments, status) and back.
void FillDevice(wire::Device::Builder out, const DeviceInfo& device);
DeviceInfo ReadDevice(wire::Device::Reader in);

// What the status reply is made of.
struct StatusSource {
  const std::string& cluster_id;
  std::string metrics_address;
  TimePoint started;  // the coordinator's start, for its uptime
  const Membership& membership;
  const CalibrationBook& calibration;
  const std::map<std::string, Job>& jobs;
  const std::vector<std::string>& job_order;  // submission order
};

// The cluster's status at `now`, with every job or only `job_id` (which must exist).
void FillStatus(wire::ClusterStatus::Builder status, const StatusSource& source,
                const std::string& job_id, TimePoint now);
void FillTrainProgress(wire::TrainProgress::Builder out, const Job& job);
// A serve job's service: its leader's last report, its limits and its generations.
void FillServing(wire::ServingStatus::Builder out, const Job& job);

// The coordinator's gauges: nodes, devices, actors and jobs by state, and each running train
// job's progress.
struct ClusterGauges {
  std::map<std::string, int64_t> nodes, actors, jobs;
  std::map<std::pair<std::string, std::string>, int64_t> devices;  // (kind, state)
  std::map<std::string, monitoring::TrainGauges> train;
};
ClusterGauges CountGauges(const Membership& membership, const std::map<std::string, Job>& jobs);

}  // namespace shardline::coordinator
