// A job's state as the coordinator tracks it: its spec, its current generation, every actor of
// that generation and every communicator group. Pure data; the Coordinator drives the transitions.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "checkpoint/commit.h"
#include "checkpoint/resume.h"
#include "coordinator/membership.h"
#include "coordinator/supervisor.h"
#include "placement/job_spec.h"

namespace shardline::coordinator {

enum class JobState { kPending, kRunning, kSucceeded, kFailed, kCancelled };
// Where a running job's current generation is.
// kAborting: a fault ended it; its actors are being killed and its faults gathered, to name the
// cause once every actor is gone. kRestarting: an elastic job between generations (deciding
// where to resume, waiting for devices).
enum class Phase { kNone, kSpawning, kBootstrapping, kRunning, kAborting, kRestarting };
enum class ActorState { kSpawning, kRegistered, kBootstrapping, kReady, kRunning, kSucceeded,
                        kFailed, kLost };

std::string_view JobStateName(JobState state);
std::string_view PhaseName(Phase phase);
std::string_view ActorStateName(ActorState state);
bool IsFinal(JobState state);
// A path from a spec resolved as ParseJobSpec resolves it (relative to `base`), lexically normal;
// "DIR/step-00000010/" is "DIR/step-00000010". Empty stays empty.
std::string ResolveUnder(const std::string& base, const std::string& path);
// `dir` as an absolute, lexically normal path: a relative one is taken from the current
// directory.
std::string AbsoluteDir(const std::string& dir);

struct ActorRecord {
  int rank = 0;
  std::string node_id;
  DeviceInfo device;
  ActorState state = ActorState::kSpawning;
  std::string detail;  // why it failed, how it exited
  std::string peer;    // ROUTER routing id once registered
  uint32_t pid = 0;
  std::string address;
  std::string metrics_address;
  bool exited = false;
};

struct GroupRecord {
  std::string kind;  // world | tp | pp | dp
  std::string id;
  std::vector<int> ranks;
  std::set<int> joined;  // ranks that started joining (CommJoin)
  std::set<int> ready;   // ranks that reported CommReady
  double bootstrap_seconds = 0;
};

struct CollectiveResultRecord {
  std::string op;
  uint64_t bytes = 0;
  uint32_t ranks = 0;
  double seconds = 0;
  double algorithm_gbps = 0;
  double bus_gbps = 0;
  bool ok = false;
  std::string detail;
};

// One logged step of a train job as its ranks' StepReports come in: the loss of the last
// pipeline stage (the other stages report NaN), the timings of the slowest rank.
// Bytes one rank sent plus received over the network per step, by the kind of group that moved
// them (StepReport.networkBytesPerStep).
struct GroupBytes {
  double world = 0;
  double tp = 0;
  double pp = 0;
  double dp = 0;
  double Total() const { return world + tp + pp + dp; }
};

struct StepAggregate {
  std::set<int> ranks;
  double loss = std::numeric_limits<double>::quiet_NaN();
  bool loss_from_last_rank = false;
  double slowest_seconds = -1;  // compute + comm + bubble of the slowest rank so far
  double tokens_per_second = 0;
  double compute_seconds = 0;
  double comm_seconds = 0;
  double bubble_seconds = 0;
  std::optional<GroupBytes> network_bytes;  // of the rank that moved the most so far
};

// A train job's progress, as `shardline status` shows it.
struct TrainRecord {
  int64_t step = 0;  // the latest step any rank reported; 0 before the first report
  int64_t logged_step = 0;  // the latest step of log_interval reported (what progress lines show)
  double loss = std::numeric_limits<double>::quiet_NaN();
  double tokens_per_second = 0;
  double compute_seconds = 0;
  double comm_seconds = 0;
  double bubble_seconds = 0;
  std::optional<GroupBytes> network_bytes_per_step;  // unset until a rank has measured it
  // The rate behind the ETA: the first and the latest reported step of this generation.
  int64_t first_step = -1;
  TimePoint first_report;
  TimePoint last_report;
  std::map<int64_t, StepAggregate> recent;  // the last few logged steps, by step
  // Checkpoint shards reported but not yet committed, by step.
  std::map<int64_t, checkpoint::StepAssembly> saving;
  std::string saving_dir;              // the checkpoint dir, absolute; empty: no checkpoints
  int64_t last_committed_step = -1;    // survives generations: a new one resumes from it
  bool committed_here = false;         // this job committed a step (a restart resumes from it)
  // The token stream the ranks train on, as their ShardSaved reports say (for the manifests).
  checkpoint::DataIdentity data;

  // Where the job starts, decided once before its first generation (checkpoint::PlanResume, on
  // the coordinator's background thread: it reads and hashes the candidate steps).
  enum class Start { kUndecided, kDeciding, kDecided };
  Start start = Start::kUndecided;
  std::string resume_manifest;  // the step every rank resumes from; empty: fresh
  int64_t resumed_step = 0;     // its step
  std::string resumed_from;     // "disk", "survivors", "memory replica"; empty: fresh
  std::string resume_note;      // why a newer memory step was not used
  std::vector<checkpoint::SkippedStep> skipped;  // newer steps that failed verification

  // The memory tier (checkpoint.memory_interval; checkpoint/memory_step.h). Memory shards
  // reported but not yet committed, by step, and the newest committed memory step: its manifest
  // and which nodes hold each file. In the coordinator's memory only: after a coordinator restart
  // a job resumes from disk.
  struct MemoryAssembly {
    checkpoint::StepAssembly shards;
    std::map<std::string, std::vector<std::string>> holders;    // by file: nodes, writer's first
    std::map<int64_t, std::vector<std::string>> replica_nodes;  // by rank: nodes holding copies
  };
  std::map<int64_t, MemoryAssembly> memory_saving;
  struct MemoryStep {
    checkpoint::Manifest manifest;
    uint32_t generation = 0;  // whose ranks wrote it (its folder in the stores)
    std::map<std::string, std::vector<std::string>> holders;  // by file
  };
  std::optional<MemoryStep> memory_step;
  // The current generation resumes from a memory step: Assignment.memoryResume; empty: the
  // resume_manifest (or fresh).
  std::string memory_resume;
  // Each rank's memory buddy (Assignment.memoryBuddies); empty without replicas.
  std::vector<uint32_t> memory_buddies;
  // Taken over from the job history by a restarted coordinator: the memory steps the job had
  // are unknown (a generation that resumes from disk says why).
  bool memory_forgotten = false;
};

// A train job's plan: for `parallel: auto`, what the planner chose when the job started (the
// layout itself is applied to Job::spec.parallel); for every train job, the planner's price of
// the layout it runs (Coordinator::PredictLayout).
struct PlanRecord {
  bool planned = false;      // `parallel: auto`, and the planner chose the layout
  // The planner's prediction for the layout the job runs (planned, or fixed by its spec; 0 when
  // there is none, e.g. a fixed layout the memory model says does not fit).
  double step_seconds = 0;   // predicted time of one step
  int64_t memory_bytes = 0;  // predicted peak of the fullest rank
  std::string summary;       // one line: devices used, mapping, MFU
  // The sets of free devices on which no plan fit but may once busy devices free: the same
  // devices are not planned again (the verdict would be the same).
  std::set<std::string> failed_on;
  // The ranks of the current generation whose start-up calibration arrived; once all have, the
  // prediction is made again with what they measured (Job::PredictionCalibrated).
  std::set<int> calibrated_ranks;
};

// A serve job's service as its leader last reported it (protocol ServingStatus), for status.
// Cleared when a generation starts: a restarted service is ready again only once its new leader
// says so.
struct ServingRecord {
  bool reported = false;  // the current generation's leader has reported
  std::string url;        // empty until it listens
  std::string model;
  bool ready = false;
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t tokens_generated = 0;
  int64_t kv_blocks = 0;
  int64_t kv_blocks_used = 0;
  int64_t preemptions = 0;
};

struct Job {
  std::string id;
  placement::JobSpec spec;
  std::string spec_yaml;
  // Where the spec's relative paths resolve (SubmitJob's specDir and workDir), absolute.
  std::string spec_dir;
  std::string work_dir;
  std::string backend;  // resolved: gloo | nccl
  JobState state = JobState::kPending;
  Phase phase = Phase::kNone;
  std::string error;
  std::string waiting_reason;  // why a pending job has not started
  uint32_t generation = 0;
  int64_t submitted_unix_ms = 0;
  int64_t finished_unix_ms = 0;
  TimePoint generation_started;
  TimePoint bootstrap_deadline;
  TimePoint run_deadline;
  std::vector<ActorRecord> actors;  // index = rank
  std::vector<GroupRecord> groups;
  std::vector<CollectiveResultRecord> results;
  TrainRecord train;  // kind train only
  ServingRecord serving;  // kind serve only
  // kind serve: the checkpoint's shape, read at submit (model::ModelConfig of its config), for the
  // memory each rank needs (placement/serve_memory.h); layers 0 when unknown (a job the coordinator
  // took over after a restart), and then only the ranks check what fits.
  model::ModelConfig serve_model;
  // kind serve: the address its leader listens on, HOST:PORT — the spec's `listen`, and once a
  // generation has listened on port 0, the port it got (a restart keeps the address).
  std::string serve_listen;
  // `parallel: auto` only: the spec's `actors` (the most devices the plan may use; 0: any), kept
  // because applying the plan sets spec.actors to the plan's world.
  int auto_max_actors = 0;
  PlanRecord plan;

  // Each generation's actor tokens, by rank (Envelope.actorToken): random, in memory only, so a
  // coordinator restart leaves the old generations' actors unable to speak for anyone.
  std::map<uint32_t, std::vector<std::string>> actor_tokens;

  // Supervision (coordinator/supervisor.h). Every generation, oldest first; the last is the
  // current one (or the one that ended last). Kept in the job's history.
  std::vector<GenerationRecord> generations;
  FaultLog faults;             // of the current generation, from its first fault on
  TimePoint abort_started;     // kAborting: when the abort was sent
  TimePoint abort_deadline;    // kAborting: actors not gone by then are given up as lost
  Ending abort_ending = Ending::kFault;  // kAborting: a fault, or a grow to a larger layout
  ProgressWatchdog watchdog;   // armed while the generation trains
  TimePoint restart_waiting_since;  // kRestarting: when it began to wait for devices
  // A restart in progress: when the fault it recovers from was first seen, until the next
  // generation's first step (the recovery time).
  std::optional<TimePoint> recovering_since;

  // Restarts after a fault: a train job with `elastic` (on a layout for the devices there are), or
  // a serve job with `elastic` (on its own tp × pp).
  bool Elastic() const {
    return (spec.kind == placement::JobKind::kTrain || spec.kind == placement::JobKind::kServe) &&
           spec.elastic.enabled;
  }
  // Running its actors: the phases in which its generation's messages are acted on.
  bool GenerationLive() const {
    return state == JobState::kRunning && phase != Phase::kAborting && phase != Phase::kRestarting;
  }
  // Waiting to (re)start: a pending job, or an elastic one between generations.
  bool WantsDevices() const {
    return state == JobState::kPending ||
           (state == JobState::kRunning && phase == Phase::kRestarting);
  }

  // Whether the current generation's ranks measure compute and links before their first step
  // (the first generation of a train job; later ones keep its numbers).
  bool Calibrates() const {
    return spec.kind == placement::JobKind::kTrain && generations.size() <= 1;
  }
  // Whether every rank of the current generation has calibrated, so that the prediction was made
  // with their own numbers.
  bool PredictionCalibrated() const {
    return plan.calibrated_ranks.size() == static_cast<size_t>(World());
  }
  int World() const {
    if (spec.kind == placement::JobKind::kCommCheck) return spec.actors;
    // Until planned, a `parallel: auto` job wants at most its `actors` (0: as many as are free).
    if (spec.parallel_auto && !plan.planned) return auto_max_actors;
    return spec.parallel.world();
  }
  // The key prefix of this generation in the coordinator's store.
  std::string StorePrefix() const {
    return "job/" + id + "/gen/" + std::to_string(generation);
  }
};

}  // namespace shardline::coordinator
