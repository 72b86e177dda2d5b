#include "coordinator/supervisor.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace shardline::coordinator {
namespace {

// How likely a fault is the cause rather than an echo of another: a process or node that died or
// stopped, or a bootstrap that timed out (0), before a generation silent as a whole with no rank
// stopped (1: a cut link stalls every rank, and its node is declared lost a moment later), and an
// actor's own error (1), which a dying peer can also provoke (an error Gloo raises outside its
// I/O path), before a communicator error (2), before what the abort itself did (3).
int Tier(const Fault& fault) {
  switch (fault.kind) {
    case FaultKind::kHung: return fault.rank < 0 ? 1 : 0;
    case FaultKind::kActorError: return 1;
    case FaultKind::kCommError: return 2;
    case FaultKind::kAborted: return 3;
    default: return 0;
  }
}

}  // namespace

std::string FormatSeconds(double seconds) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.1f s", seconds);
  return buf;
}

std::string_view FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kActorExit: return "actor_exit";
    case FaultKind::kActorError: return "actor_error";
    case FaultKind::kCommError: return "comm_error";
    case FaultKind::kNodeLost: return "node_lost";
    case FaultKind::kHung: return "hung";
    case FaultKind::kBootstrap: return "bootstrap";
    case FaultKind::kAborted: return "aborted";
    case FaultKind::kCoordinatorRestart: return "coordinator_restart";
  }
  return "unknown";
}

std::optional<FaultKind> ParseFaultKind(std::string_view name) {
  for (FaultKind kind : {FaultKind::kActorExit, FaultKind::kActorError, FaultKind::kCommError,
                         FaultKind::kNodeLost, FaultKind::kHung, FaultKind::kBootstrap,
                         FaultKind::kAborted, FaultKind::kCoordinatorRestart}) {
    if (FaultKindName(kind) == name) return kind;
  }
  return std::nullopt;
}

std::optional<Ending> ParseEnding(std::string_view name) {
  for (Ending ending : {Ending::kRunning, Ending::kFault, Ending::kGrow, Ending::kSucceeded,
                        Ending::kFailed, Ending::kCancelled}) {
    if (EndingName(ending) == name) return ending;
  }
  return std::nullopt;
}

std::string_view EndingName(Ending ending) {
  switch (ending) {
    case Ending::kRunning: return "running";
    case Ending::kFault: return "fault";
    case Ending::kGrow: return "grow";
    case Ending::kSucceeded: return "succeeded";
    case Ending::kFailed: return "failed";
    case Ending::kCancelled: return "cancelled";
  }
  return "unknown";
}

std::string DescribeFault(const Fault& fault) {
  std::string who;
  if (fault.rank >= 0) {
    who = "rank " + std::to_string(fault.rank) + (fault.node.empty() ? "" : " on " + fault.node);
  } else if (!fault.node.empty()) {
    who = "node " + fault.node;
  }
  // A fault of the whole generation (a bootstrap that timed out) is its detail alone.
  std::string text = who.empty() ? fault.detail : who + " " + fault.detail;
  if (fault.step > 0) {
    text += " at step " + std::to_string(fault.step);
  } else if (fault.step == 0) {
    text += " before its first step";
  }
  return text;
}

const Fault& FaultLog::RootCause() const {
  const Fault* cause = &faults_.front();
  for (const Fault& fault : faults_) {
    if (Tier(fault) < Tier(*cause)) cause = &fault;  // the earliest of the best tier
  }
  return *cause;
}

std::vector<Fault> FaultLog::Consequences() const {
  std::vector<Fault> rest;
  if (faults_.empty()) return rest;
  const Fault* cause = &RootCause();
  for (const Fault& fault : faults_) {
    if (&fault != cause) rest.push_back(fault);
  }
  return rest;
}

RestartVerdict DecideRestart(const placement::ElasticSpec& elastic,
                             const std::vector<GenerationRecord>& generations,
                             int64_t now_unix_ms) {
  RestartVerdict verdict;
  if (!elastic.enabled) {
    verdict.reason = "the job is not elastic";
    return verdict;
  }
  const int64_t window_start = now_unix_ms - elastic.restart_window.count();
  int in_window = 0;
  std::map<std::pair<FaultKind, int64_t>, int> same_cause;
  std::string causes;
  const GenerationRecord* repeated = nullptr;
  for (const GenerationRecord& record : generations) {
    if (record.ending != Ending::kFault || !record.cause) continue;
    causes += (causes.empty() ? "" : "; ") + std::string("generation ") +
              std::to_string(record.generation) + ": " + DescribeFault(*record.cause);
    if (record.ended_unix_ms >= window_start) ++in_window;
    if (++same_cause[{record.cause->kind, record.cause->step}] >= 3) repeated = &record;
  }
  if (repeated != nullptr) {
    verdict.reason = "the same cause (" + std::string(FaultKindName(repeated->cause->kind)) +
                     (repeated->cause->step >= 0
                          ? " at step " + std::to_string(repeated->cause->step)
                          : std::string()) +
                     ") ended 3 generations; causes: " + causes;
    return verdict;
  }
  if (in_window > elastic.max_restarts) {
    verdict.reason = std::to_string(in_window) + " faults within " +
                     FormatSeconds(std::chrono::duration<double>(elastic.restart_window).count()) +
                     " (max_restarts " + std::to_string(elastic.max_restarts) + "); causes: " +
                     causes;
    return verdict;
  }
  verdict.restart = true;
  return verdict;
}

void ProgressWatchdog::Arm(TimePoint now, TimePoint not_before) {
  armed_ = true;
  last_progress_ = now;
  newest_step_ = -1;
  interval_seconds_ = 0;
  deadline_ = std::max(now + std::chrono::duration_cast<Duration>(floor_ * kFirstStepFloors),
                       not_before);
}

void ProgressWatchdog::OnStep(int64_t step, TimePoint now) {
  if (!armed_ || step <= newest_step_) return;
  // The first interval runs from the arming (it holds the load and the first step: an
  // overestimate, so a slow first step never makes a short deadline); then a running mean that
  // follows the pace down.
  const double interval = Seconds(now - last_progress_);
  interval_seconds_ = newest_step_ < 0 ? interval : 0.7 * interval_seconds_ + 0.3 * interval;
  newest_step_ = step;
  last_progress_ = now;
  const double slack = std::max(Seconds(floor_), kStepsOfSlack * interval_seconds_);
  deadline_ = now + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(slack));
}

}  // namespace shardline::coordinator
