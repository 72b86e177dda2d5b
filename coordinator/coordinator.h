// The coordinator daemon: membership, jobs and their generations, communicator bootstrap and
// its key-value store, all served from one ROUTER socket by one event-loop thread.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "checkpoint/resume.h"
#include "coordinator/background_work.h"
#include "coordinator/calibration.h"
#include "coordinator/job.h"
#include "coordinator/kv_store.h"
#include "coordinator/membership.h"
#include "monitoring/metrics.h"
#include "monitoring/metrics_server.h"
#include "protocol/channel.h"
#include "protocol/envelope.h"

namespace shardline::coordinator {

struct CoordinatorOptions {
  std::string listen = "tcp://127.0.0.1:5555";  // port 0 picks a free one
  std::string metrics_address = "127.0.0.1:0";  // empty: no metrics endpoint
  std::string state_dir;                         // empty: nothing persisted
  std::string cluster_id = "shardline";
  // A node is lost after heartbeat_timeout without a heartbeat: with these defaults a dead node
  // is detected within 1.5 s plus one event-loop turn (under 2 s on a LAN).
  std::chrono::milliseconds heartbeat_interval{300};
  std::chrono::milliseconds heartbeat_timeout{1500};
  // An aborted generation's actors that have not exited this long after the abort (their agent
  // gone silent too) are given up as lost, and the supervisor goes on without them.
  std::chrono::milliseconds abort_grace{3000};
};

class Coordinator {
 public:
  // Binds the socket and the metrics endpoint and loads the job history from the state dir.
  // Errors name what could not be opened (a port in use, an unwritable state dir).
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options,
                                                             const Clock* clock);
  ~Coordinator();

  // Serves until `stop` is set; then aborts running generations and returns.
  absl::Status Run(const std::atomic<bool>& stop);

  const std::string& endpoint() const { return channel_->endpoint(); }
  std::string metrics_address() const { return metrics_server_->address(); }

 private:
  Coordinator(CoordinatorOptions options, const Clock* clock,
              std::unique_ptr<protocol::Channel> channel,
              std::unique_ptr<monitoring::MetricsServer> metrics_server);

  // ---- the wire ----
  void HandleFrame(protocol::Frame& frame);
  void Dispatch(const std::string& peer, const protocol::Message& message);
  void Send(const std::string& peer, protocol::Outgoing& message);
  void ReplyError(const std::string& peer, uint64_t request_id, const absl::Status& status);
  void ReplyAck(const std::string& peer, uint64_t request_id);
  std::unique_ptr<protocol::Outgoing> NewMessage(uint64_t request_id);

  // ---- handlers (one per request payload) ----
  absl::Status OnRegisterNode(const std::string& peer, uint64_t request_id,
                              wire::RegisterNode::Reader request);
  absl::Status OnHeartbeat(const std::string& peer, uint64_t request_id,
                           wire::Heartbeat::Reader request);
  absl::Status OnSubmitJob(const std::string& peer, uint64_t request_id,
                           wire::SubmitJob::Reader request);
  absl::Status OnStatusRequest(const std::string& peer, uint64_t request_id,
                               wire::StatusRequest::Reader request);
  absl::Status OnCancelJob(const std::string& peer, uint64_t request_id,
                           wire::CancelJob::Reader request);
  absl::Status OnActorExited(const std::string& peer, uint64_t request_id,
                             wire::ActorExited::Reader report);
  absl::Status OnRegisterActor(const std::string& peer, uint64_t request_id,
                               wire::RegisterActor::Reader request);
  absl::Status OnKvRequest(const std::string& peer, uint64_t request_id, const std::string& sender,
                           wire::KvRequest::Reader request);
  absl::Status OnCommJoin(const std::string& peer, uint64_t request_id,
                          wire::CommJoin::Reader report);
  absl::Status OnCommReady(const std::string& peer, uint64_t request_id,
                           wire::CommReady::Reader report);
  absl::Status OnCommFailed(const std::string& peer, uint64_t request_id,
                            wire::CommFailed::Reader report);
  absl::Status OnStepReport(const std::string& peer, uint64_t request_id,
                            wire::StepReport::Reader report);
  absl::Status OnActorDone(const std::string& peer, uint64_t request_id,
                           wire::ActorDone::Reader report);
  absl::Status OnShardSaved(const std::string& peer, uint64_t request_id,
                            wire::ShardSaved::Reader report);
  absl::Status OnCalibration(const std::string& peer, uint64_t request_id,
                             wire::Calibration::Reader report);

  // ---- jobs ----
  // The job's actor of (generation, rank), or an error saying why the report is stale or bad.
  absl::StatusOr<ActorRecord*> FindActor(const std::string& job_id, uint32_t generation,
                                         uint32_t rank);
  struct GroupMember {
    Job* job;
    ActorRecord* actor;
    GroupRecord* group;
  };
  // The actor and its group for a report about group `group_id`; an error when the report is
  // stale or the rank is not a member.
  absl::StatusOr<GroupMember> FindGroupMember(const std::string& job_id, uint32_t generation,
                                              uint32_t rank, const std::string& group_id);
  // Folds one rank's StepReport into the train job's progress.
  void RecordStep(Job& job, int rank, wire::StepReport::Reader report);
  // Writes the manifest of `step`, whose shards every rank has saved, then `latest`; fails the
  // job (and returns why) when the shards do not make a checkpoint or it cannot be written.
  absl::Status CommitStep(Job& job, int64_t step);
  void TryStartPendingJobs();
  // A train job's start: where it resumes from (checkpoint::PlanResume on the background thread,
  // then OnStartDecided on the loop), before its first generation; a failed check fails the job.
  void DecideStart(Job& job);
  void OnStartDecided(const std::string& job_id,
                      const absl::StatusOr<checkpoint::ResumePlan>& plan);
  // A pending `parallel: auto` job: plans it on the free devices and, when a plan fits, applies
  // it to the job's spec and returns the rank → (node, device slot) placement. Otherwise nothing,
  // with the job either still pending (waiting_reason says why) or failed (the planner's verdict
  // on every device it could ever get).
  std::optional<std::vector<std::pair<std::string, int>>> PlanAutoJob(Job& job);
  // A train job with its layout (fixed by its spec, or planned) and its actors placed: the
  // planner's price of that layout on those devices — step time and memory — with what
  // calibration has measured so far, so that status can set it against what the job measures.
  // Made when the generation starts and again once all its ranks have calibrated.
  void PredictLayout(Job& job);
  void StartGeneration(Job& job, const std::vector<std::pair<std::string, int>>& placement);
  // Ends the job in a final state: aborts its actors, frees its devices, records `error`.
  void EndJob(Job& job, JobState state, const std::string& error);

  // ---- supervision (the rules are supervisor.h's; this is their wiring) ----
  // A fault of the job's current generation: the first one aborts the generation (kAborting);
  // every one is kept, so that once all its actors are gone the cause is named (CloseGeneration).
  void OnFault(Job& job, Fault fault);
  // A fault of `kind` by `rank` (-1: none) with the job's current step and the time filled in.
  Fault MakeFault(const Job& job, FaultKind kind, int rank, const std::string& node,
                  std::string detail) const;
  // Aborting phase from now (`ending`: a fault, or a grow), then SendAbort.
  void BeginAbort(Job& job, Ending ending, const std::string& reason);
  // Tells the agents of the generation's live actors to kill them.
  void SendAbort(const Job& job, const std::string& reason);
  // Aborting jobs whose actors are all gone (or past the grace), hung generations (the
  // watchdog), elastic jobs that waited too long for devices.
  void Supervise();
  // The aborted generation is over: names its cause, then restarts the job (elastic, the breaker
  // allows) or fails it.
  void CloseGeneration(Job& job);
  // After a commit: an elastic job below max_actors with free devices for a larger layout ends
  // this generation to restart on it (no fault, nothing lost).
  void MaybeGrow(Job& job);
  // The resume request of a job's start: its spec's, or after a restart of a job that committed
  // a step, the newest committed step of its own checkpoint dir.
  checkpoint::ResumeRequest StartRequest(const Job& job) const;
  void MaybeFinishJob(Job& job);
  void CheckDeadlines();
  void OnNodesDead(const std::vector<std::string>& node_ids);
  // Marks the node's unfinished actors lost and fails their jobs, saying `reason`.
  void FailJobsOnNode(const std::string& node_id, const std::string& reason);
  void FreeDevices(const Job& job);

  // ---- persistence and metrics ----
  absl::Status LoadHistory();
  void Persist(const Job& job);
  void UpdateGauges();
  void FillStatus(wire::ClusterStatus::Builder status, const std::string& job_id);
  void FillTrainProgress(wire::TrainProgress::Builder out, const Job& job);

  CoordinatorOptions options_;
  const Clock* clock_;
  TimePoint started_;
  std::unique_ptr<protocol::Channel> channel_;
  std::unique_ptr<monitoring::MetricsServer> metrics_server_;
  monitoring::WireMetrics wire_metrics_;
  monitoring::CoordinatorMetrics metrics_;
  Membership membership_;
  KvStore kv_;
  CalibrationBook calibration_;
  std::map<std::string, Job> jobs_;
  std::vector<std::string> job_order_;  // submission order: pending jobs start first-come
  uint64_t next_job_number_ = 1;
  // Random per process: agents that see it change kill the actors of the old coordinator.
  std::string instance_id_;
  int state_dir_lock_fd_ = -1;  // flock'd: one coordinator per state dir
  TimePoint last_gauge_update_;
  // Last: destroyed first, so no task outlives what its closure would touch.
  BackgroundWork background_;
};

}  // namespace shardline::coordinator
