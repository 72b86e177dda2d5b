// Every Prometheus metric family Shardline exports, declared in this one place.
//
// Each struct below is built once per process from the registry of its MetricsServer and the
// constant labels that say who is reporting (job, rank, node, component), and offers methods in
// the caller's vocabulary; no caller touches a prometheus type beyond handing the registry in.
//
// Thread-safety: every method of every struct is safe to call concurrently from any thread
// (prometheus-cpp metrics are atomic; the label caches here take a short mutex).
// Lifetime: a struct keeps its registry alive; it is neither copyable nor movable.
// Label values: each label has a small vocabulary (the k* lists below). Values outside a closed
// vocabulary are counted under its catch-all value; an open label (message type, collective op)
// takes at most kMaxLabelValues distinct values and folds the rest into "other", so that a bug
// can never create unbounded series. Both cases log one warning per unexpected value.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/process.h"

namespace prometheus {
class Counter;
class Gauge;
class Registry;
}  // namespace prometheus

namespace shardline::monitoring {

// Constant labels carried by every series of a struct, e.g. {{"component", "agent"},
// {"node", "host-3"}}. Names must be valid Prometheus label names that do not start with "__";
// they come from our code, so an invalid one is a bug and prometheus-cpp throws
// std::invalid_argument from the constructor.
using Labels = std::map<std::string, std::string>;

// Largest number of distinct values an open label takes before folding into "other".
inline constexpr size_t kMaxLabelValues = 64;

inline constexpr std::array<std::string_view, 6> kDecodeErrorReasons = {
    "truncated", "garbage", "oversized", "version", "cluster", "unexpected"};
inline constexpr std::array<std::string_view, 2> kNodeStates = {"alive", "dead"};
inline constexpr std::array<std::string_view, 8> kActorStates = {
    "spawning", "registered", "bootstrapping", "ready", "running", "succeeded", "failed", "lost"};
inline constexpr std::array<std::string_view, 5> kJobStates = {"pending", "running", "succeeded",
                                                               "failed", "cancelled"};
inline constexpr std::array<std::string_view, 4> kKvOperations = {"set", "get", "add",
                                                                  "wait_timeout"};
// Why the coordinator refused a connection or a message (protocol/curve.h AuthObserver).
inline constexpr std::array<std::string_view, 7> kAuthRefusalReasons = {
    "no_curve", "handshake", "unknown_key", "removed_key", "role", "token", "node_key"};
inline constexpr std::array<std::string_view, 2> kGenerationOutcomes = {"completed", "aborted"};
// Why a generation ended with a fault (coordinator/supervisor.h FaultKindName).
inline constexpr std::array<std::string_view, 8> kFaultCauses = {
    "actor_exit", "actor_error", "comm_error", "node_lost", "hung", "bootstrap", "aborted",
    "coordinator_restart"};
inline constexpr std::array<std::string_view, 4> kGroupKinds = {"world", "tp", "pp", "dp"};
// Where a restarted train job's state came from: a disk step, a memory step from the nodes' own
// copies, one from a buddy's copy, or nothing committed.
inline constexpr std::array<std::string_view, 4> kResumeSources = {"disk", "survivors",
                                                                   "memory_replica", "fresh"};
inline constexpr std::array<std::string_view, 3> kActorExitOutcomes = {"success", "failure",
                                                                       "signal"};

namespace detail {
class JobGauges;
class LabeledCounters;
class LabeledHistograms;
class SnapshotGauges;
}  // namespace detail

// One running train job's progress, as the coordinator aggregates it from every rank.
struct TrainGauges {
  double step = 0;               // the latest step reported
  double loss = 0;               // of the last pipeline stage; NaN before the first report
  double tokens_per_second = 0;  // of the slowest rank
  double generation = 0;         // its current generation (1 until a restart)
  double last_committed_step = -1;  // -1: nothing committed yet
};

// Envelopes in and out of a ZeroMQ socket; used by the coordinator, the agent and the actor.
class WireMetrics {
 public:
  WireMetrics(std::shared_ptr<prometheus::Registry> registry, const Labels& constant_labels);
  ~WireMetrics();
  WireMetrics(const WireMetrics&) = delete;
  WireMetrics& operator=(const WireMetrics&) = delete;

  // `type` is the Envelope payload's name ("register", "heartbeat", ...).
  void OnReceived(std::string_view type);
  void OnSent(std::string_view type);
  // `reason` is one of kDecodeErrorReasons; anything else counts as "unexpected".
  void OnDecodeError(std::string_view reason);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<detail::LabeledCounters> received_;
  std::unique_ptr<detail::LabeledCounters> sent_;
  std::unique_ptr<detail::LabeledCounters> decode_errors_;
};

// The coordinator's view of the cluster. The Set* methods take a full snapshot, counted by
// state: a state absent from the snapshot is set to 0, so a series never keeps a stale count.
class CoordinatorMetrics {
 public:
  CoordinatorMetrics(std::shared_ptr<prometheus::Registry> registry, const Labels& constant_labels);
  ~CoordinatorMetrics();
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  void SetNodes(const std::map<std::string, int64_t>& by_state);  // kNodeStates
  // Keyed by (kind, state), e.g. {{"cuda", "assigned"}, 8}; both vocabularies are open.
  void SetDevices(const std::map<std::pair<std::string, std::string>, int64_t>& by_kind_state);
  void SetActors(const std::map<std::string, int64_t>& by_state);  // kActorStates
  void SetJobs(const std::map<std::string, int64_t>& by_state);    // kJobStates

  void OnHeartbeatMissed();
  void OnKvOperation(std::string_view op);      // kKvOperations
  // Thread-safe: the ZAP handler's thread counts too.
  void OnAuthRefused(std::string_view reason);  // kAuthRefusalReasons
  void OnGeneration(std::string_view outcome);  // kGenerationOutcomes, open
  // Time from the first member's Assignment to the group's last CommReady.
  void ObserveBootstrap(std::string_view group_kind, double seconds);  // kGroupKinds
  // The running train jobs, by job id (label `job`), as a full snapshot: the series of a job
  // absent from it are removed, so only running jobs are exported and the label stays bounded.
  // Past kMaxLabelValues jobs, the rest are left out (with a warning): a sum of other jobs'
  // steps or losses would mean nothing.
  void SetTrainJobs(const std::map<std::string, TrainGauges>& by_job);
  // A generation ended with a fault of kind `cause` (kFaultCauses) and the job restarts.
  void OnRestart(std::string_view cause);
  // A restarted job's first new step came `seconds` after the fault; `steps_lost` steps trained
  // past its last committed step were lost.
  void OnRecovered(std::string_view cause, double seconds, int64_t steps_lost);
  // The same recovery by where its state came from (kResumeSources).
  void OnResumed(std::string_view source, int64_t steps_lost);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<detail::SnapshotGauges> nodes_;
  std::unique_ptr<detail::SnapshotGauges> devices_;
  std::unique_ptr<detail::SnapshotGauges> actors_;
  std::unique_ptr<detail::SnapshotGauges> jobs_;
  prometheus::Counter* heartbeats_missed_;  // owned by the registry
  std::unique_ptr<detail::LabeledCounters> kv_operations_;
  std::unique_ptr<detail::LabeledCounters> auth_refusals_;
  std::unique_ptr<detail::LabeledCounters> generations_;
  std::unique_ptr<detail::LabeledHistograms> bootstrap_seconds_;
  std::unique_ptr<detail::JobGauges> train_step_;
  std::unique_ptr<detail::JobGauges> train_loss_;
  std::unique_ptr<detail::JobGauges> train_tokens_per_second_;
  std::unique_ptr<detail::JobGauges> train_generation_;
  std::unique_ptr<detail::JobGauges> train_last_committed_step_;
  std::unique_ptr<detail::LabeledCounters> restarts_;
  std::unique_ptr<detail::LabeledCounters> steps_lost_;
  std::unique_ptr<detail::LabeledHistograms> recovery_seconds_;
  std::unique_ptr<detail::LabeledCounters> resumes_;
  std::unique_ptr<detail::LabeledCounters> steps_lost_by_source_;
};

// One node agent.
class AgentMetrics {
 public:
  AgentMetrics(std::shared_ptr<prometheus::Registry> registry, const Labels& constant_labels);
  ~AgentMetrics();
  AgentMetrics(const AgentMetrics&) = delete;
  AgentMetrics& operator=(const AgentMetrics&) = delete;

  void SetActorsRunning(int64_t count);
  void OnActorExit(std::string_view outcome);  // kActorExitOutcomes; else counts as "failure"
  void OnActorExit(const ExitStatus& status);  // success, signal, or failure (non-zero code)
  void OnHeartbeatSent();
  void OnCoordinatorLost();

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge* actors_running_;  // the unlabelled series are owned by the registry
  std::unique_ptr<detail::LabeledCounters> actor_exits_;
  prometheus::Counter* heartbeats_sent_;
  prometheus::Counter* coordinator_lost_;
};

// One actor (one rank): its collectives and, for training jobs, its progress.
class ActorMetrics {
 public:
  ActorMetrics(std::shared_ptr<prometheus::Registry> registry, const Labels& constant_labels);
  ~ActorMetrics();
  ActorMetrics(const ActorMetrics&) = delete;
  ActorMetrics& operator=(const ActorMetrics&) = delete;

  // One collective call: `op` is "allreduce", "allgather", "reduce_scatter", "broadcast",
  // "send", "recv", ...; `bytes` is this rank's buffer size. A failed call counts only as an
  // error: its bytes never moved and its time (often a timeout) would skew the latency buckets.
  void OnOperation(std::string_view op, size_t bytes, double seconds, bool ok);
  // Payload bytes this rank sent and received over the network (TCP: Gloo, and the Gloo hop of
  // the hierarchical shm+gloo communicator; not shared memory) for a group of kind `group_kind`
  // (kGroupKinds; anything else counts as "other"), as comm::CommObserver::OnNetworkBytes gives
  // them: shardline_actor_network_bytes_total{group_kind, direction="sent"|"received"}.
  void OnNetworkBytes(std::string_view group_kind, uint64_t sent, uint64_t received);
  void SetStep(int64_t step);
  void SetLoss(double loss);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<detail::LabeledCounters> collective_bytes_;
  std::unique_ptr<detail::LabeledHistograms> collective_seconds_;
  std::unique_ptr<detail::LabeledCounters> collective_errors_;
  std::unique_ptr<detail::LabeledCounters> network_sent_;      // by group kind
  std::unique_ptr<detail::LabeledCounters> network_received_;  // by group kind
  prometheus::Gauge* step_;  // owned by the registry
  prometheus::Gauge* loss_;
};

}  // namespace shardline::monitoring
