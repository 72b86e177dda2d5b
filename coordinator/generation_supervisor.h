// The supervision of a job's generations, on the rules of supervisor.h: a fault aborts the
// generation (its faults are gathered while its actors go), the generation closes once they are
// gone or past the abort grace, its cause is named, and the job restarts (elastic, the breaker
// allows) or fails; the hang watchdog, the bootstrap and run deadlines and an elastic job's wait
// for devices are checked here too. No I/O and no clock of its own: the coordinator passes the
// time, sends the aborts these return and frees what a closed generation held.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "coordinator/job.h"
#include "coordinator/supervisor.h"

namespace shardline::coordinator {

// The hang watchdog's floor of a job's generations.
Duration WatchdogFloor(const Job& job);

class GenerationSupervisor {
 public:
  explicit GenerationSupervisor(Duration abort_grace) : abort_grace_(abort_grace) {}

  // A fault of `kind` by `rank` (-1: none) on `node` with the job's current step, at `now`.
  Fault MakeFault(const Job& job, FaultKind kind, int rank, const std::string& node,
                  std::string detail, TimePoint now) const;

  // A fault of the job's current generation. The first one aborts it (kAborting from `now`) and
  // returns the reason the agents are told; later ones are kept for naming the cause. A fault of
  // a job whose generation is not live or aborting is dropped.
  std::optional<std::string> OnFault(Job& job, Fault fault, TimePoint now);
  // Aborting from `now`: after a fault, or to grow to a larger layout.
  void BeginAbort(Job& job, Ending ending, TimePoint now);

  // What a running job needs at `now`.
  enum class Due {
    kNothing,
    kClose,             // aborting, and every actor is gone or the grace is over: Close it
    kHung,              // the watchdog expired: HangFault
    kBootstrapTimeout,  // its communicators were not ready in time: BootstrapFault
    kRunTimeout,        // past run_timeout_s: fail the job
    kWaitTimeout,       // elastic, and it waited past wait_timeout_s for devices: fail it
  };
  Due Check(const Job& job, TimePoint now) const;

  // The generation hung: `stopped` are the ranks its agents see stopped (SIGSTOP), the first of
  // which is named; none: every rank is silent (a deadlock).
  Fault HangFault(const Job& job, const std::vector<int>& stopped, TimePoint now) const;
  // The bootstrap deadline passed: the fault names the ranks that never came.
  Fault BootstrapFault(const Job& job, TimePoint now) const;

  struct Closure {
    // The job restarts: it is now kRestarting (deciding where to resume, then waiting for
    // devices). Otherwise the coordinator fails it with `error`.
    bool restart = false;
    std::string error;
    // A restart after a fault: its cause's FaultKindName (for the restart metric); empty after
    // a grow.
    std::string restart_cause;
    // The rank whose device the cause points at: its actor died or hung by itself (not a lost
    // node, not an error it reported, not a peer's broken socket). -1: none. Placements avoid
    // that device until its node registers again (scheduler.h, AvoidDevice).
    int blamed_rank = -1;
  };
  // The aborted generation is over: its record gets its cause (the root of its faults), its
  // consequences and abort time; actors that never exited are marked lost; the phase leaves
  // kAborting. The coordinator frees its devices and store keys.
  Closure Close(Job& job, TimePoint now, int64_t unix_ms) const;

 private:
  Duration abort_grace_;
};

}  // namespace shardline::coordinator
