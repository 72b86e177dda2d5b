// The coordinator daemon: one ROUTER socket served by one event-loop thread. This class is the
// loop and the wire: it decodes each message, hands it to the part that owns its concern and
// sends what that part decides. The parts do no I/O of their own (time is passed in):
//   membership.h         nodes, their devices, heartbeats, re-registration
//   scheduler.h          which devices a job gets (fixed, elastic, planned), growing, prediction
//   bootstrap_tracker.h  communicator groups joining and ready, the missing ranks at a deadline
//   progress.h           step reports folded into a train job's progress, recovery times
//   checkpoint_tracker.h shards saved per step, the commit (through a checkpoint::FileSystem)
//   generation_supervisor.h  faults, aborts, hangs, deadlines, closing and restarting
//   kv_store.h           the bootstrap key-value store
//   calibration.h        measured speeds, the planner's cluster spec
//   status_view.h        the status reply and the gauges
//   job_history.h        a job as its state-dir record, and back
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
#include "coordinator/generation_supervisor.h"
#include "coordinator/job.h"
#include "coordinator/job_history.h"
#include "coordinator/kv_store.h"
#include "coordinator/membership.h"
#include "coordinator/scheduler.h"
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
  // CURVE keys and allowlist (protocol/curve.h); `insecure` binds a plain socket.
  protocol::CurveSetup curve;
};

class Coordinator {
 public:
  // Binds the socket and the metrics endpoint and loads the job history from the state dir.
  // Errors name what could not be opened (a port in use, an unwritable state dir).
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options,
                                                             const Clock* clock);
  ~Coordinator();

  // Serves until `stop` is set; then aborts running generations and returns. Whenever
  // `reload_allowlist` is set (SIGHUP), reads the allowlist file again and clears the flag.
  absl::Status Run(const std::atomic<bool>& stop, std::atomic<bool>* reload_allowlist = nullptr);

  const std::string& endpoint() const { return channel_->endpoint(); }
  std::string metrics_address() const { return metrics_server_->address(); }

 private:
  Coordinator(CoordinatorOptions options, const Clock* clock,
              std::unique_ptr<monitoring::MetricsServer> metrics_server);
  // Counts the refusals of the channel and its ZAP handler (from the handler's thread too).
  class AuthCounter final : public protocol::AuthObserver {
   public:
    explicit AuthCounter(monitoring::CoordinatorMetrics& metrics) : metrics_(metrics) {}
    void OnAuthRefused(std::string_view reason) override { metrics_.OnAuthRefused(reason); }

   private:
    monitoring::CoordinatorMetrics& metrics_;
  };
  // Under CURVE: whether the key that sent a message (Frame::user_id) may send it. A client key
  // submits, cancels and reads; a node key does the rest (its agent's and actors' messages). The
  // allowlist is looked up per message, so that a key removed by a reload loses its rights at
  // once, not only at its next connection.
  absl::Status Authorize(const std::string& user_id, wire::Envelope::Payload::Which payload);
  // An actor's message (of a payload that names a job, generation and rank, or a key-value
  // request under job/) must carry that rank's token of that generation (Job::actor_tokens): so
  // an actor reports only for its own rank and touches only its own job's namespace, whoever
  // holds the node key it connected with.
  absl::Status CheckActorToken(const protocol::Message& message);
  // Under CURVE: a node id belongs to the node key that registered it first (node_keys_), so
  // one host's key cannot take over, heartbeat for or report the actors of another host's node.
  // A node id whose key has left the allowlist may be registered by another key (how an
  // operator hands a node id over: remove the old key, SIGHUP).
  absl::Status CheckNodeKey(const std::string& user_id, const protocol::Message& message);
  static std::string NewActorToken();
  void ReloadAllowlist();

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
  // "the nodes advertised host-1 10.0.0.2 (the interface eth0 routes to ...), ...": for errors
  // of a generation's bootstrap.
  std::string DescribeAdvertisedAddresses(const Job& job);
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
  void TryStartPendingJobs();
  // A train job's start: where it resumes from (checkpoint::PlanResume on the background thread,
  // then OnStartDecided on the loop), before its first generation; a failed check fails the job.
  void DecideStart(Job& job);
  void OnStartDecided(const std::string& job_id,
                      const absl::StatusOr<checkpoint::ResumePlan>& plan);
  void StartGeneration(Job& job, const Placement& placement);
  // Ends the job in a final state: aborts its actors, frees its devices, records `error`.
  void EndJob(Job& job, JobState state, const std::string& error);

  // ---- supervision (the rules are generation_supervisor.h's; this is their wiring) ----
  // A fault of the job's current generation: the first one aborts the generation (kAborting);
  // every one is kept, so that once all its actors are gone the cause is named (CloseGeneration).
  void OnFault(Job& job, Fault fault);
  // A fault of `kind` by `rank` (-1: none) with the job's current step and the time filled in.
  Fault MakeFault(const Job& job, FaultKind kind, int rank, const std::string& node,
                  std::string detail) const;
  // Tells the agents of the generation's live actors to kill them.
  // `job_ended`: no generation follows, and every node drops the job's memory steps.
  void SendAbort(const Job& job, const std::string& reason, bool job_ended = false);
  // A train job's memory tier for the generation placed on `placement`: whether it resumes from a
  // memory step (ChooseMemoryResume), the ranks' buddies, and the group files move over.
  void PrepareMemoryTier(Job& job, const Placement& placement, std::vector<GroupRecord>& groups);
  // What each job's generation needs now (GenerationSupervisor::Check), acted on.
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
  void OnNodesDead(const std::vector<std::string>& node_ids);
  // Marks the node's unfinished actors lost and fails their jobs, saying `reason`.
  void FailJobsOnNode(const std::string& node_id, const std::string& reason);

  // ---- persistence and metrics ----
  absl::Status LoadHistory();
  void Persist(const Job& job);
  void UpdateGauges();

  CoordinatorOptions options_;
  const Clock* clock_;
  TimePoint started_;
  std::unique_ptr<monitoring::MetricsServer> metrics_server_;
  monitoring::WireMetrics wire_metrics_;
  monitoring::CoordinatorMetrics metrics_;
  AuthCounter auth_counter_{metrics_};
  std::shared_ptr<protocol::Allowlist> allowlist_;  // null under --insecure
  // Destroyed explicitly first (~Coordinator): the ZAP handler's thread counts through
  // auth_counter_ until the channel unregisters its domain.
  std::unique_ptr<protocol::Channel> channel_;
  Membership membership_;
  std::map<std::string, std::string> node_keys_;  // node id -> the CURVE key it registered with
  KvStore kv_;
  CalibrationBook calibration_;
  Scheduler scheduler_;            // reads membership_ and calibration_
  GenerationSupervisor supervisor_;
  JobHistory history_;
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
