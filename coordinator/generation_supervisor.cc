#include "coordinator/generation_supervisor.h"

#include <algorithm>

#include "coordinator/bootstrap_tracker.h"
#include "coordinator/scheduler.h"

namespace shardline::coordinator {

Duration WatchdogFloor(const Job& job) {
  const Duration floor = job.Elastic() ? Duration(job.spec.elastic.progress_timeout)
                                       : Duration(placement::ElasticSpec().progress_timeout);
  // A DiLoCo step that ends a round moves the whole model (or a fragment) between sites at once,
  // on the slow link DiLoCo is for, while an inner step moves nothing: the watchdog, which scales
  // with the inner steps' report interval, would call that step a hang (100 Mbit carries 1 GB in
  // 80 s). Two minutes at least; elastic.progress_timeout_s raises it further.
  if (job.spec.data_parallel.diloco()) return std::max(floor, Duration(std::chrono::minutes(2)));
  return floor;
}

Fault GenerationSupervisor::MakeFault(const Job& job, FaultKind kind, int rank,
                                      const std::string& node, std::string detail,
                                      TimePoint now) const {
  Fault fault;
  fault.kind = kind;
  fault.at = now;
  fault.unix_ms = UnixMillis();
  fault.rank = rank;
  fault.node = node;
  if (job.spec.kind == placement::JobKind::kTrain) fault.step = job.train.step;
  fault.detail = std::move(detail);
  return fault;
}

std::optional<std::string> GenerationSupervisor::OnFault(Job& job, Fault fault, TimePoint now) {
  const bool aborting = job.state == JobState::kRunning && job.phase == Phase::kAborting;
  if (!job.GenerationLive() && !aborting) return std::nullopt;
  std::string what = DescribeFault(fault);
  job.faults.Add(std::move(fault));
  if (aborting) return std::nullopt;
  // The first fault: abort now, name the cause once every actor is gone (its agent's exit report
  // can arrive after its peers' reports of a broken socket).
  BeginAbort(job, Ending::kFault, now);
  return what;
}

void GenerationSupervisor::BeginAbort(Job& job, Ending ending, TimePoint now) {
  job.phase = Phase::kAborting;
  job.abort_ending = ending;
  job.abort_started = now;
  job.abort_deadline = now + abort_grace_;
  job.watchdog.Disarm();
}

GenerationSupervisor::Due GenerationSupervisor::Check(const Job& job, TimePoint now) const {
  if (job.state != JobState::kRunning) return Due::kNothing;
  switch (job.phase) {
    case Phase::kAborting: {
      const bool all_gone =
          std::all_of(job.actors.begin(), job.actors.end(), [](const ActorRecord& actor) {
            return actor.exited || actor.state == ActorState::kLost;
          });
      return all_gone || now >= job.abort_deadline ? Due::kClose : Due::kNothing;
    }
    case Phase::kRestarting:
      return job.Elastic() && now - job.restart_waiting_since >= job.spec.elastic.wait_timeout
                 ? Due::kWaitTimeout
                 : Due::kNothing;
    case Phase::kNone:
      return Due::kNothing;
    case Phase::kSpawning:
    case Phase::kBootstrapping:
      if (now >= job.bootstrap_deadline) return Due::kBootstrapTimeout;
      break;
    case Phase::kRunning:
      if (job.watchdog.Expired(now)) return Due::kHung;
      break;
  }
  return now >= job.run_deadline ? Due::kRunTimeout : Due::kNothing;
}

Fault GenerationSupervisor::HangFault(const Job& job, const std::vector<int>& stopped,
                                      TimePoint now) const {
  const int rank = stopped.empty() ? -1 : stopped.front();
  const std::string node =
      rank >= 0 ? job.actors.at(static_cast<size_t>(rank)).node_id : std::string();
  const double silent = job.watchdog.SilentSeconds(now);
  std::string detail =
      (rank >= 0 ? "is stopped and" : "(every rank)") + std::string(" made no progress for ") +
      FormatSeconds(silent) + " (the watchdog allows max(" +
      FormatSeconds(Seconds(WatchdogFloor(job))) + ", " +
      std::to_string(static_cast<int>(ProgressWatchdog::kStepsOfSlack)) + " x " +
      FormatSeconds(job.watchdog.report_interval_seconds()) + " between reports))";
  if (stopped.size() > 1) {
    std::string ranks;
    for (int r : stopped) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    detail += "; stopped ranks " + ranks;
  }
  Fault fault = MakeFault(job, FaultKind::kHung, rank, node, detail, now);
  fault.unseen_seconds = silent;
  return fault;
}

Fault GenerationSupervisor::BootstrapFault(const Job& job, TimePoint now) const {
  return MakeFault(job, FaultKind::kBootstrap, -1, "",
                   "bootstrap timed out after " +
                       FormatSeconds(Seconds(job.spec.bootstrap_timeout)) + ": " +
                       DescribeMissingRanks(job),
                   now);
}

GenerationSupervisor::Closure GenerationSupervisor::Close(Job& job, TimePoint now,
                                                          int64_t unix_ms) const {
  GenerationRecord& record = job.generations.back();
  record.ended_unix_ms = unix_ms;
  record.last_step = std::max(record.last_step, job.train.step);
  record.abort_seconds = Seconds(now - job.abort_started);
  for (ActorRecord& actor : job.actors) {
    if (actor.exited || actor.state == ActorState::kLost) continue;
    actor.state = ActorState::kLost;
    actor.detail = "had not exited " + FormatSeconds(record.abort_seconds) + " after the abort";
  }
  Closure closure;
  if (job.abort_ending == Ending::kGrow) {
    record.ending = Ending::kGrow;
  } else {
    record.ending = Ending::kFault;
    const Fault& cause = job.faults.RootCause();
    record.cause = cause;
    record.detection_seconds = cause.unseen_seconds;
    if ((cause.kind == FaultKind::kActorExit || cause.kind == FaultKind::kHung) &&
        cause.rank >= 0 && static_cast<size_t>(cause.rank) < job.actors.size()) {
      closure.blamed_rank = cause.rank;
    }
    for (const Fault& consequence : job.faults.Consequences()) {
      record.consequences.push_back(DescribeFault(consequence));
    }
    closure.error = "generation " + std::to_string(job.generation) + ": " + DescribeFault(cause);
    if (!record.consequences.empty()) {
      closure.error += " (then " + std::to_string(record.consequences.size()) + " consequence" +
                       (record.consequences.size() == 1 ? "" : "s") + ": " +
                       record.consequences.front() +
                       (record.consequences.size() > 1 ? "; ..." : "") + ")";
    }
  }
  job.faults.clear();
  job.phase = Phase::kNone;  // closed: its actors are gone
  if (!job.Elastic()) return closure;
  if (record.ending == Ending::kFault) {
    const RestartVerdict verdict = DecideRestart(job.spec.elastic, job.generations, unix_ms);
    if (!verdict.restart) {
      closure.error = "restarts stopped: " + verdict.reason;
      return closure;
    }
    closure.restart_cause = std::string(FaultKindName(record.cause->kind));
    // Recovery runs from the first fault seen (the abort), which may precede the cause's own
    // report: a killed agent's peers see broken sockets before its node is declared lost.
    job.recovering_since = job.abort_started;
  } else {
    // A grow is a restart too, from the step just committed: its recovery is measured from now.
    job.recovering_since = now;
  }
  // Between generations: decide where to resume (the newest committed step), then wait for
  // devices for a layout within min..max.
  closure.restart = true;
  job.phase = Phase::kRestarting;
  job.error = closure.error;
  job.restart_waiting_since = now;
  job.train.start = TrainRecord::Start::kUndecided;
  if (job.spec.parallel_auto) ForgetAutoPlan(job);  // the planner plans on what is there now
  job.waiting_reason = "restarting after generation " + std::to_string(job.generation);
  return closure;
}

}  // namespace shardline::coordinator
