// Where jobs run: which free devices a job that wants them gets (a fixed layout's world, an
// elastic job's dp within min..max, a `parallel: auto` job's plan), whether an elastic job can
// grow, and the planner's price of the layout a job runs. No I/O: it reads membership and the
// calibration book and writes the chosen layout into the job; the coordinator spawns what it
// returns.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/calibration.h"
#include "coordinator/job.h"
#include "coordinator/membership.h"

namespace shardline::coordinator {

// Rank → (node id, index into that node's NodeInfo::devices).
using Placement = std::vector<std::pair<std::string, int>>;

DeviceInfo::Kind DeviceKindOf(const placement::JobSpec& spec);

// Devices of `kind` on the alive nodes: all of them, those no job holds, and of those the ones no
// fault pointed at.
struct DeviceCount {
  int alive = 0;
  int free = 0;
  int trusted = 0;
};
DeviceCount CountDevices(const Membership& membership, DeviceInfo::Kind kind);

// A train job's layout for logs and errors: "tp 2 x pp 2 x dp 2, zero 1".
std::string PlanSummary(const placement::JobSpec& spec);

// The most devices a `parallel: auto` job may plan on (0: any).
int AutoMaxActors(const placement::JobSpec& spec);
// A `parallel: auto` job plans afresh at its next start: back to the spec's own (unplanned) form.
void ForgetAutoPlan(Job& job);

// What a job that wants devices (pending, or elastic between generations) does now.
struct StartChoice {
  enum class Verdict {
    kStart,  // spawn its next generation on `placement`
    kWait,   // not yet: `reason` says for what (status shows it); later jobs wait too
    kFail,   // never: `reason` is the job's error
  };
  Verdict verdict = Verdict::kWait;
  Placement placement;
  std::string reason;
};

class Scheduler {
 public:
  Scheduler(const Membership& membership, const CalibrationBook& calibration,
            std::string cluster_id)
      : membership_(membership), calibration_(calibration), cluster_id_(std::move(cluster_id)) {}

  // For a job whose start (where it resumes from) is decided. On kStart the job's spec holds the
  // layout its generation runs (an elastic dp, a planned layout) and, for `parallel: auto`, its
  // plan record says what the planner chose. Ranks fill one node's devices before the next, so
  // neighbouring ranks (a later TP group) share a node. Devices a fault pointed at
  // (DeviceInfo::avoided) are left out while the others let the job start, even on a smaller
  // layout; a job that cannot start without them takes as few of them as it can rather than
  // wait.
  StartChoice Choose(Job& job) const;

  // After a commit: the larger world an elastic job could run on the free devices no fault
  // pointed at, when there is one (the job then ends its generation to restart on it): the
  // largest dp a fixed layout allows, or the plan the planner would choose for `parallel: auto`
  // on those devices and the job's own.
  std::optional<int> GrowTarget(const Job& job) const;

  // At submit, a serve job whose model is known: InvalidArgument when its layout cannot cut the
  // model or its cache holds no whole context, FailedPrecondition when every registered device
  // of its kind is too small for its fullest rank (saying by how much); OK when none is
  // registered yet (the start checks again).
  absl::Status CheckServeFits(const Job& job) const;

  // The planner's price of the layout the job runs on the devices its actors hold — step time
  // and memory — with what calibration has measured so far, into job.plan (0 when the planner
  // cannot price it: the layout is the user's and the trainer is the judge of whether it runs).
  void PredictLayout(Job& job) const;

 private:
  // Devices with less memory than `min_memory` (0: any) are not placed on.
  StartChoice ChooseFixed(Job& job, int64_t min_memory = 0) const;
  // A serve job: for `parallel: auto` the layout first (PlanServeLayout), then the devices that
  // hold its fullest rank.
  StartChoice ChooseServe(Job& job) const;
  // `announce`: log the plan (not when only pricing a grow).
  StartChoice ChooseAuto(Job& job, bool avoid, bool announce) const;

  const Membership& membership_;
  const CalibrationBook& calibration_;
  std::string cluster_id_;
};

// Leaves the device `actor` ran on out of placements while others are free (`why`: the fault),
// until its node registers again.
void AvoidDevice(Membership& membership, const ActorRecord& actor, const std::string& why);

// Marks the placed devices as held by `job_id`, and frees every device it holds.
void HoldDevices(Membership& membership, const std::string& job_id, const Placement& placement);
void FreeDevices(Membership& membership, const std::string& job_id);

}  // namespace shardline::coordinator
