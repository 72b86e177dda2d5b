// A job's progress as its ranks report it. A train job's: each StepReport folded into the step it
// belongs to (the loss of the last pipeline stage, the split of the slowest rank), the job's
// current and logged step, the watchdog fed, the generation's newest step, and the end of a
// recovery (the restarted job's first new step). A serve job's: its leader's last report of the
// service, and the end of a recovery (its first ready report). No I/O, no clock of its own.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "common/clock.h"
#include "coordinator/job.h"

namespace shardline::coordinator {

// One rank's report of one step (wire StepReport, decoded).
struct StepSample {
  int64_t step = 0;
  double loss = std::numeric_limits<double>::quiet_NaN();  // NaN: not the last stage
  double compute_seconds = 0;
  double comm_seconds = 0;
  double bubble_seconds = 0;
  double tokens_per_second = 0;
  bool logged = false;  // a step of log_interval
  std::optional<GroupBytes> network_bytes_per_step;  // unset: not measured in this report
};

// The restarted job's first new step ended the recovery from the generation before.
struct Recovery {
  uint32_t ended_generation = 0;
  std::string cause;  // FaultKindName of its cause; "other" for a grow
  double seconds = 0;
  int64_t steps_lost = 0;
  // Where the new generation's state came from (monitoring::kResumeSources): "disk", "survivors",
  // "memory_replica", or "fresh" (nothing committed).
  std::string source;
};

// Folds `sample` from `rank` into the job's progress at `now`.
std::optional<Recovery> RecordStep(Job& job, int rank, const StepSample& sample, TimePoint now);

// A serve job's leader reported its service (`report.reported` set): it replaces the last report;
// the first ready report after a restart ends the recovery (steps_lost 0: a service loses the
// requests in flight, which failed with 503, not steps).
std::optional<Recovery> RecordServing(Job& job, const ServingRecord& report, TimePoint now);

// Seconds to the job's last step at this generation's pace so far (data, checkpoints and
// reports included), or from its throughput before a second step is seen; 0 when unknown.
double EtaSeconds(const Job& job);

}  // namespace shardline::coordinator
