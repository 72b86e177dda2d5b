// The generation supervisor's rules, apart from the coordinator's wire: what a fault is, which of a
// generation's faults is its cause (the first cause in time; the cascade it sets off — peers'
// broken sockets, ranks killed by the abort — are consequences), when a job restarts and when the
// crash-loop breaker fails it, and the progress watchdog that calls a silent generation hung.
// No I/O and no clock of its own: callers pass the time, so tests drive it with a manual clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "placement/job_spec.h"

namespace shardline::coordinator {

enum class FaultKind {
  kActorExit,   // an actor exited (a signal, an exit code) without being told to
  kActorError,  // an actor reported a failure of its own (a bad step, a bad checkpoint)
  kCommError,   // a communicator error or timeout an actor reported (often a peer's fault)
  kNodeLost,    // a node's heartbeats stopped, or its agent restarted
  kHung,        // no progress within the watchdog's deadline
  kBootstrap,   // actors that could not start, register or form their communicators in time
  kAborted,     // an actor the abort killed, or that failed after it: always a consequence
  kCoordinatorRestart,  // the coordinator restarted while the generation ran
};
std::string_view FaultKindName(FaultKind kind);  // "actor_exit", "comm_error", ...
std::optional<FaultKind> ParseFaultKind(std::string_view name);

struct Fault {
  FaultKind kind = FaultKind::kActorExit;
  TimePoint at;             // when the supervisor learnt of it
  int64_t unix_ms = 0;
  int rank = -1;            // -1: not one rank's (a node, the whole generation)
  std::string node;         // empty: not one node's
  int64_t step = -1;        // the job's step when it happened; -1: before the first
  std::string detail;       // "killed by SIGKILL (signal 9)", "no heartbeat for 1.6 s", ...
  // How long it went unseen, where that is known (a lost node's silence, a hung generation's);
  // -1: an exit or a report, which is its own detection.
  double unseen_seconds = -1;
};

// Seconds for people: "1.5 s".
std::string FormatSeconds(double seconds);

// One line naming the fault: "rank 1 on node-b killed by signal 9 (Killed) at step 140".
std::string DescribeFault(const Fault& fault);

// The faults of one generation in the order they arrived.
class FaultLog {
 public:
  void Add(Fault fault) { faults_.push_back(std::move(fault)); }
  bool empty() const { return faults_.empty(); }
  void clear() { faults_.clear(); }
  const std::vector<Fault>& faults() const { return faults_; }
  // The cause: the first fault of the likeliest kind — an exit, a lost node, a stopped rank's
  // hang or a bootstrap timeout, then a hang of the whole generation or an actor's own error,
  // then a communicator error, then what the abort did (a killed rank's peers see its broken
  // socket before its agent reports the exit, a cut link stalls every rank before its node is
  // declared lost at the heartbeat timeout: arrival order alone blames the wrong one). Expects a
  // non-empty log.
  const Fault& RootCause() const;
  // Every fault but the cause, in arrival order.
  std::vector<Fault> Consequences() const;

 private:
  std::vector<Fault> faults_;
};

// How a generation ended.
enum class Ending { kRunning, kFault, kGrow, kSucceeded, kFailed, kCancelled };
std::string_view EndingName(Ending ending);
std::optional<Ending> ParseEnding(std::string_view name);

struct GenerationRecord {
  uint32_t generation = 0;
  int64_t started_unix_ms = 0;
  int64_t ended_unix_ms = 0;
  std::string plan;           // "tp=2 pp=2 dp=1 zero=0 on 4 actors"
  int world = 0;
  int64_t resumed_step = 0;   // the committed step it loaded; 0: fresh
  // Where that step came from: "disk", "survivors" (the nodes' own memory copies), "memory
  // replica"; empty when fresh. And why a newer memory step was not used, when there was one.
  std::string resumed_from;
  std::string resume_note;
  int64_t last_step = 0;      // the newest step a rank reported
  Ending ending = Ending::kRunning;
  std::optional<Fault> cause;
  std::vector<std::string> consequences;  // DescribeFault of each
  int64_t steps_lost = 0;       // last_step − the next generation's resumed step
  double recovery_seconds = -1;  // the abort (the first fault seen) → the next generation's first step
  double detection_seconds = -1;  // the cause's unseen_seconds
  double abort_seconds = -1;     // abort → every actor exited or lost
};

// Whether an elastic job restarts after generation `ended.back()` ended with a fault, and why not.
struct RestartVerdict {
  bool restart = false;
  std::string reason;  // when not: the breaker's verdict with the list of causes
};
// The crash-loop breaker: more than `max_restarts` fault endings within `restart_window` of
// `now_unix_ms`, or the same cause kind at the same step for the third time, fails the job.
RestartVerdict DecideRestart(const placement::ElasticSpec& elastic,
                             const std::vector<GenerationRecord>& generations, int64_t now_unix_ms);

// The hang watchdog of one generation. Armed when its communicators are ready; every report of a
// new step moves the deadline to max(floor, kStepsOfSlack × the measured time between reports).
// Before the first report the generation gets kFirstStepFloors × floor (loading the checkpoint,
// calibration and the first step).
class ProgressWatchdog {
 public:
  static constexpr double kStepsOfSlack = 5;
  static constexpr double kFirstStepFloors = 3;

  explicit ProgressWatchdog(Duration floor = std::chrono::seconds(10)) : floor_(floor) {}
  // From `now`, the first step is due within kFirstStepFloors floors, and not before
  // `not_before` (a generation that calibrates first: its bootstrap deadline).
  void Arm(TimePoint now, TimePoint not_before = {});
  void Disarm() { armed_ = false; }
  // A rank reported `step`; only a step past the newest one moves the deadline.
  void OnStep(int64_t step, TimePoint now);
  bool armed() const { return armed_; }
  TimePoint deadline() const { return deadline_; }
  bool Expired(TimePoint now) const { return armed_ && now >= deadline_; }
  // The measured seconds between reports of new steps; 0 before the first report.
  double report_interval_seconds() const { return interval_seconds_; }
  // How long the generation has been silent, at `now`.
  double SilentSeconds(TimePoint now) const { return Seconds(now - last_progress_); }
  int64_t newest_step() const { return newest_step_; }

 private:
  Duration floor_;
  bool armed_ = false;
  TimePoint deadline_;
  TimePoint last_progress_;
  int64_t newest_step_ = -1;
  double interval_seconds_ = 0;
};

}  // namespace shardline::coordinator
