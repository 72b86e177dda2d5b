#include "monitoring/metrics.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace shardline::monitoring {
namespace {

constexpr std::string_view kOther = "other";

// Bootstrap of one communicator group: a loopback Gloo rendezvous takes a few ms, an NCCL
// bootstrap across hosts seconds, and a group stuck on a missing rank runs to the 5 min timeout.
// A restart: from well under a second (one host, a small model) to minutes (a large checkpoint).
const std::vector<double> kRecoveryBuckets = {0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 20, 30, 60, 120, 300,
                                              600};
const std::vector<double> kBootstrapBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
// One collective: a small all-reduce on NVLink takes ~10 us, a large one over TCP seconds,
// and a timed-out one 60 s.
const std::vector<double> kCollectiveBuckets = {1e-5,   2.5e-5, 5e-5, 1e-4,  2.5e-4, 5e-4, 1e-3,
                                                2.5e-3, 5e-3,   0.01, 0.025, 0.05,   0.1,  0.25,
                                                0.5,    1,      2.5,  5,     10,     30,   60};

// Families carry no constant labels of their own: prometheus-cpp refuses a second family of a
// name with other constant labels, and a coordinator and an agent sharing one process (`shardline
// up`, tests) must share one registry. The constant labels go on every series instead, which
// Prometheus cannot tell apart on the wire.
prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry,
                                                       const std::string& name,
                                                       const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}
prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry,
                                                   const std::string& name,
                                                   const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}
prometheus::Family<prometheus::Histogram>& HistogramFamily(prometheus::Registry& registry,
                                                           const std::string& name,
                                                           const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
}

// The allowed values of one label. A closed vocabulary maps strangers to `fallback`; an open one
// accepts new values up to kMaxLabelValues.
struct Vocabulary {
  std::vector<std::string> known;  // created at start, so rate() and alerts see them from 0
  bool closed = false;
  std::string fallback;

  template <size_t N>
  static Vocabulary Closed(const std::array<std::string_view, N>& values,
                           std::string_view fallback) {
    return {{values.begin(), values.end()}, true, std::string(fallback)};
  }
  template <size_t N>
  static Vocabulary Open(const std::array<std::string_view, N>& values) {
    return {{values.begin(), values.end()}, false, ""};
  }
  static Vocabulary Open() { return {}; }
};

void RequireNoClash(const Labels& constant_labels, const std::string& family,
                    const std::vector<std::string>& label_names) {
  for (const auto& name : label_names) {
    if (constant_labels.count(name) != 0) {
      throw std::invalid_argument("metrics: constant label '" + name + "' clashes with the '" +
                                  name + "' label of " + family);
    }
  }
}

prometheus::Counter& UnlabelledCounter(prometheus::Registry& registry, const std::string& name,
                                       const std::string& help, const Labels& constant_labels) {
  return CounterFamily(registry, name, help).Add(constant_labels);
}
prometheus::Gauge& UnlabelledGauge(prometheus::Registry& registry, const std::string& name,
                                   const std::string& help, const Labels& constant_labels) {
  return GaugeFamily(registry, name, help).Add(constant_labels);
}

}  // namespace

namespace detail {

// The series of one family keyed by the value of one label. Lookups are cached because
// Family::Add builds and hashes the whole label set under the family's lock on every call.
template <typename T>
class LabelCache {
 public:
  using Factory = std::function<T&(const prometheus::Labels&)>;

  LabelCache(std::string family, Labels constant_labels, std::string label_name,
             Vocabulary vocabulary, Factory factory)
      : family_(std::move(family)),
        constant_labels_(std::move(constant_labels)),
        label_name_(std::move(label_name)),
        vocabulary_(std::move(vocabulary)),
        factory_(std::move(factory)) {
    RequireNoClash(constant_labels_, family_, {label_name_});
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& value : vocabulary_.known) CreateLocked(value);
  }

  T& Get(std::string_view value) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = series_.find(value); it != series_.end()) return *it->second;
    const std::string resolved = ResolveLocked(value);
    if (auto it = series_.find(resolved); it != series_.end()) return *it->second;
    return CreateLocked(resolved);
  }

 private:
  std::string ResolveLocked(std::string_view value) {
    std::string resolved;
    if (vocabulary_.closed) {
      resolved = vocabulary_.fallback;
    } else if (series_.size() >= kMaxLabelValues) {
      resolved = std::string(kOther);
    } else {
      return std::string(value);
    }
    // Bounded so that a flood of distinct strangers cannot grow memory through the warnings.
    if (warned_.size() < kMaxLabelValues && warned_.emplace(value).second) {
      spdlog::warn("metrics: {}{{{}=\"{}\"}} is outside its vocabulary; counted as \"{}\"", family_,
                   label_name_, value, resolved);
    }
    return resolved;
  }

  T& CreateLocked(const std::string& value) {
    prometheus::Labels labels = constant_labels_;
    labels[label_name_] = value;
    T& series = factory_(labels);
    series_.emplace(value, &series);
    return series;
  }

  const std::string family_;
  const Labels constant_labels_;
  const std::string label_name_;
  const Vocabulary vocabulary_;
  const Factory factory_;
  std::mutex mutex_;
  std::map<std::string, T*, std::less<>> series_;  // owned by the registry
  std::set<std::string, std::less<>> warned_;
};

class LabeledCounters : public LabelCache<prometheus::Counter> {
 public:
  LabeledCounters(prometheus::Registry& registry, const std::string& name, const std::string& help,
                  const Labels& constant_labels, const std::string& label_name,
                  Vocabulary vocabulary)
      : LabelCache(name, constant_labels, label_name, std::move(vocabulary),
                   [&family = CounterFamily(registry, name, help)](const prometheus::Labels& labels)
                       -> prometheus::Counter& { return family.Add(labels); }) {}
};

class LabeledHistograms : public LabelCache<prometheus::Histogram> {
 public:
  LabeledHistograms(prometheus::Registry& registry, const std::string& name,
                    const std::string& help, const Labels& constant_labels,
                    const std::string& label_name, Vocabulary vocabulary,
                    const std::vector<double>& buckets)
      : LabelCache(name, constant_labels, label_name, std::move(vocabulary),
                   [&family = HistogramFamily(registry, name, help),
                    buckets](const prometheus::Labels& labels) -> prometheus::Histogram& {
                     return family.Add(labels, buckets);
                   }) {}
};

// Gauges counting things by state, set from a full snapshot at a time. A scrape that lands
// during Set may see part of the old snapshot and part of the new one; the next scrape is whole.
class SnapshotGauges {
 public:
  using Key = std::vector<std::string>;  // one value per label name, in order

  SnapshotGauges(prometheus::Registry& registry, const std::string& name, const std::string& help,
                 const Labels& constant_labels, std::vector<std::string> label_names,
                 const std::vector<Key>& known)
      : family_name_(name),
        family_(GaugeFamily(registry, name, help)),
        constant_labels_(constant_labels),
        label_names_(std::move(label_names)) {
    RequireNoClash(constant_labels_, family_name_, label_names_);
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Key& key : known) CreateLocked(key);
  }

  void Set(const std::map<Key, double>& snapshot) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<Key, double> resolved;
    for (const auto& [key, value] : snapshot) {
      if (series_.count(key) != 0 || series_.size() + resolved.size() < kMaxLabelValues) {
        resolved[key] += value;
      } else {
        Key other(label_names_.size(), std::string(kOther));
        if (warned_.size() < kMaxLabelValues && warned_.insert(key).second) {
          spdlog::warn("metrics: {} has more than {} label sets; counting the rest as \"other\"",
                       family_name_, kMaxLabelValues);
        }
        resolved[other] += value;
      }
    }
    for (const auto& [key, gauge] : series_) {
      if (resolved.count(key) == 0) gauge->Set(0);
    }
    for (const auto& [key, value] : resolved) {
      auto it = series_.find(key);
      prometheus::Gauge& gauge = it != series_.end() ? *it->second : CreateLocked(key);
      gauge.Set(value);
    }
  }

 private:
  prometheus::Gauge& CreateLocked(const Key& key) {
    prometheus::Labels labels = constant_labels_;
    for (size_t i = 0; i < label_names_.size(); ++i) labels[label_names_[i]] = key.at(i);
    prometheus::Gauge& gauge = family_.Add(labels);
    series_.emplace(key, &gauge);
    return gauge;
  }

  const std::string family_name_;
  prometheus::Family<prometheus::Gauge>& family_;
  const Labels constant_labels_;
  const std::vector<std::string> label_names_;
  std::mutex mutex_;
  std::map<Key, prometheus::Gauge*> series_;  // owned by the registry
  std::set<Key> warned_;
};

// One gauge per job, set from a snapshot of the jobs that exist now; the series of a job that
// left the snapshot are removed from the family (a finished job's last value stays in
// Prometheus' history, but is not scraped forever).
class JobGauges {
 public:
  JobGauges(prometheus::Registry& registry, const std::string& name, const std::string& help,
            const Labels& constant_labels)
      : family_name_(name),
        family_(GaugeFamily(registry, name, help)),
        constant_labels_(constant_labels) {
    RequireNoClash(constant_labels_, family_name_, {"job"});
  }

  void Set(const std::map<std::string, double>& by_job) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = series_.begin(); it != series_.end();) {
      if (by_job.count(it->first) == 0) {
        family_.Remove(it->second);
        it = series_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [job, value] : by_job) {
      auto it = series_.find(job);
      if (it == series_.end()) {
        if (series_.size() >= kMaxLabelValues) {
          if (warned_.size() < kMaxLabelValues && warned_.insert(job).second) {
            spdlog::warn("metrics: {} has more than {} jobs; job \"{}\" is not exported",
                         family_name_, kMaxLabelValues, job);
          }
          continue;
        }
        prometheus::Labels labels = constant_labels_;
        labels["job"] = job;
        it = series_.emplace(job, &family_.Add(labels)).first;
      }
      it->second->Set(value);
    }
  }

 private:
  const std::string family_name_;
  prometheus::Family<prometheus::Gauge>& family_;
  const Labels constant_labels_;
  std::mutex mutex_;
  std::map<std::string, prometheus::Gauge*> series_;  // owned by the registry
  std::set<std::string> warned_;
};

}  // namespace detail

namespace {

template <size_t N>
std::vector<detail::SnapshotGauges::Key> Keys(const std::array<std::string_view, N>& states) {
  std::vector<detail::SnapshotGauges::Key> keys;
  for (auto state : states) keys.push_back({std::string(state)});
  return keys;
}

std::map<detail::SnapshotGauges::Key, double> ByOneLabel(const std::map<std::string, int64_t>& in) {
  std::map<detail::SnapshotGauges::Key, double> out;
  for (const auto& [state, count] : in) out[{state}] = static_cast<double>(count);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

WireMetrics::WireMetrics(std::shared_ptr<prometheus::Registry> registry,
                         const Labels& constant_labels)
    : registry_(std::move(registry)) {
  received_ =
      std::make_unique<detail::LabeledCounters>(*registry_, "shardline_messages_received_total",
                                                "Envelopes received and decoded, by payload type.",
                                                constant_labels, "type", Vocabulary::Open());
  sent_ = std::make_unique<detail::LabeledCounters>(*registry_, "shardline_messages_sent_total",
                                                    "Envelopes sent, by payload type.",
                                                    constant_labels, "type", Vocabulary::Open());
  decode_errors_ = std::make_unique<detail::LabeledCounters>(
      *registry_, "shardline_decode_errors_total",
      "Messages dropped because they could not be decoded or did not belong here, by reason.",
      constant_labels, "reason", Vocabulary::Closed(kDecodeErrorReasons, "unexpected"));
}

WireMetrics::~WireMetrics() = default;

void WireMetrics::OnReceived(std::string_view type) { received_->Get(type).Increment(); }
void WireMetrics::OnSent(std::string_view type) { sent_->Get(type).Increment(); }
void WireMetrics::OnDecodeError(std::string_view reason) {
  decode_errors_->Get(reason).Increment();
}

// ---------------------------------------------------------------------------------------------

CoordinatorMetrics::CoordinatorMetrics(std::shared_ptr<prometheus::Registry> registry,
                                       const Labels& constant_labels)
    : registry_(std::move(registry)) {
  prometheus::Registry& r = *registry_;
  nodes_ = std::make_unique<detail::SnapshotGauges>(
      r, "shardline_nodes", "Nodes known to the coordinator, by state.", constant_labels,
      std::vector<std::string>{"state"}, Keys(kNodeStates));
  devices_ = std::make_unique<detail::SnapshotGauges>(
      r, "shardline_devices", "Devices reported by the agents, by kind and state.", constant_labels,
      std::vector<std::string>{"kind", "state"}, std::vector<detail::SnapshotGauges::Key>{});
  actors_ = std::make_unique<detail::SnapshotGauges>(
      r, "shardline_actors", "Actors of the current generations, by state.", constant_labels,
      std::vector<std::string>{"state"}, Keys(kActorStates));
  jobs_ = std::make_unique<detail::SnapshotGauges>(
      r, "shardline_jobs", "Jobs known to the coordinator, by state.", constant_labels,
      std::vector<std::string>{"state"}, Keys(kJobStates));
  heartbeats_missed_ = &UnlabelledCounter(
      r, "shardline_heartbeats_missed_total",
      "Heartbeat deadlines an agent or actor missed, as seen by the coordinator.", constant_labels);
  kv_operations_ = std::make_unique<detail::LabeledCounters>(
      r, "shardline_kv_operations_total",
      "Operations on the bootstrap key-value store, by operation.", constant_labels, "op",
      Vocabulary::Open(kKvOperations));
  auth_refusals_ = std::make_unique<detail::LabeledCounters>(
      r, "shardline_auth_refusals_total",
      "Connections and messages the coordinator refused (CURVE, allowlist, roles), by reason.",
      constant_labels, "reason", Vocabulary::Closed(kAuthRefusalReasons, "handshake"));
  generations_ = std::make_unique<detail::LabeledCounters>(
      r, "shardline_generations_total", "Job generations that ended, by outcome.", constant_labels,
      "outcome", Vocabulary::Open(kGenerationOutcomes));
  bootstrap_seconds_ = std::make_unique<detail::LabeledHistograms>(
      r, "shardline_bootstrap_seconds",
      "Time to bring up one communicator group, from assignment to the last CommReady.",
      constant_labels, "group_kind", Vocabulary::Open(kGroupKinds), kBootstrapBuckets);
  train_step_ = std::make_unique<detail::JobGauges>(
      r, "shardline_train_step", "Latest step a running train job reported, by job.",
      constant_labels);
  train_loss_ = std::make_unique<detail::JobGauges>(
      r, "shardline_train_loss",
      "Training loss of a running train job's latest reported step (its last pipeline stage), "
      "by job.",
      constant_labels);
  train_tokens_per_second_ = std::make_unique<detail::JobGauges>(
      r, "shardline_train_tokens_per_second",
      "Tokens per second of a running train job's latest reported step, as its slowest rank "
      "measured them, by job.",
      constant_labels);
  train_generation_ = std::make_unique<detail::JobGauges>(
      r, "shardline_train_generation",
      "Current generation of a running train job (it grows by one at every restart), by job.",
      constant_labels);
  train_last_committed_step_ = std::make_unique<detail::JobGauges>(
      r, "shardline_train_last_committed_step",
      "Newest checkpoint step a running train job has committed (-1: none), by job.",
      constant_labels);
  restarts_ = std::make_unique<detail::LabeledCounters>(
      r, "shardline_restarts_total",
      "Generations of elastic jobs that a fault ended and the supervisor restarted, by the "
      "fault's root cause.",
      constant_labels, "cause", Vocabulary::Open(kFaultCauses));
  steps_lost_ = std::make_unique<detail::LabeledCounters>(
      r, "shardline_steps_lost_total",
      "Steps trained past the last committed checkpoint that a restart threw away, by the "
      "fault's root cause.",
      constant_labels, "cause", Vocabulary::Open(kFaultCauses));
  recovery_seconds_ = std::make_unique<detail::LabeledHistograms>(
      r, "shardline_recovery_seconds",
      "Time from a fault to the restarted job's first new step, by the fault's root cause.",
      constant_labels, "cause", Vocabulary::Open(kFaultCauses), kRecoveryBuckets);
  resumes_ = std::make_unique<detail::LabeledCounters>(
      r, "shardline_resumes_total",
      "Restarted generations of train jobs by where their state came from: a disk step, a memory "
      "step the nodes held, a memory step's replica on another node, or nothing (fresh).",
      constant_labels, "source", Vocabulary::Open(kResumeSources));
  steps_lost_by_source_ = std::make_unique<detail::LabeledCounters>(
      r, "shardline_steps_lost_by_source_total",
      "Steps a restart threw away, by where the restarted generation's state came from.",
      constant_labels, "source", Vocabulary::Open(kResumeSources));
}

CoordinatorMetrics::~CoordinatorMetrics() = default;

void CoordinatorMetrics::OnRestart(std::string_view cause) { restarts_->Get(cause).Increment(); }
void CoordinatorMetrics::OnRecovered(std::string_view cause, double seconds, int64_t steps_lost) {
  recovery_seconds_->Get(cause).Observe(seconds);
  steps_lost_->Get(cause).Increment(static_cast<double>(std::max<int64_t>(steps_lost, 0)));
}

void CoordinatorMetrics::OnResumed(std::string_view source, int64_t steps_lost) {
  resumes_->Get(source).Increment();
  steps_lost_by_source_->Get(source).Increment(
      static_cast<double>(std::max<int64_t>(steps_lost, 0)));
}

void CoordinatorMetrics::SetNodes(const std::map<std::string, int64_t>& by_state) {
  nodes_->Set(ByOneLabel(by_state));
}
void CoordinatorMetrics::SetDevices(
    const std::map<std::pair<std::string, std::string>, int64_t>& by_kind_state) {
  std::map<detail::SnapshotGauges::Key, double> snapshot;
  for (const auto& [kind_state, count] : by_kind_state) {
    snapshot[{kind_state.first, kind_state.second}] = static_cast<double>(count);
  }
  devices_->Set(snapshot);
}
void CoordinatorMetrics::SetActors(const std::map<std::string, int64_t>& by_state) {
  actors_->Set(ByOneLabel(by_state));
}
void CoordinatorMetrics::SetJobs(const std::map<std::string, int64_t>& by_state) {
  jobs_->Set(ByOneLabel(by_state));
}
void CoordinatorMetrics::OnHeartbeatMissed() { heartbeats_missed_->Increment(); }
void CoordinatorMetrics::OnKvOperation(std::string_view op) { kv_operations_->Get(op).Increment(); }
void CoordinatorMetrics::OnAuthRefused(std::string_view reason) {
  auth_refusals_->Get(reason).Increment();
}
void CoordinatorMetrics::OnGeneration(std::string_view outcome) {
  generations_->Get(outcome).Increment();
}
void CoordinatorMetrics::ObserveBootstrap(std::string_view group_kind, double seconds) {
  bootstrap_seconds_->Get(group_kind).Observe(seconds);
}
void CoordinatorMetrics::SetTrainJobs(const std::map<std::string, TrainGauges>& by_job) {
  std::map<std::string, double> step, loss, tokens_per_second, generation, committed;
  for (const auto& [job, gauges] : by_job) {
    step[job] = gauges.step;
    loss[job] = gauges.loss;
    tokens_per_second[job] = gauges.tokens_per_second;
    generation[job] = gauges.generation;
    committed[job] = gauges.last_committed_step;
  }
  train_step_->Set(step);
  train_loss_->Set(loss);
  train_tokens_per_second_->Set(tokens_per_second);
  train_generation_->Set(generation);
  train_last_committed_step_->Set(committed);
}

// ---------------------------------------------------------------------------------------------

AgentMetrics::AgentMetrics(std::shared_ptr<prometheus::Registry> registry,
                           const Labels& constant_labels)
    : registry_(std::move(registry)) {
  prometheus::Registry& r = *registry_;
  actors_running_ = &UnlabelledGauge(r, "shardline_agent_actors_running",
                                     "Actor processes this agent runs now.", constant_labels);
  actor_exits_ = std::make_unique<detail::LabeledCounters>(
      r, "shardline_agent_actor_exits_total",
      "Actor processes that exited, by outcome (success, failure = non-zero exit, signal).",
      constant_labels, "outcome", Vocabulary::Closed(kActorExitOutcomes, "failure"));
  heartbeats_sent_ =
      &UnlabelledCounter(r, "shardline_agent_heartbeats_sent_total",
                         "Heartbeats this agent sent to the coordinator.", constant_labels);
  coordinator_lost_ = &UnlabelledCounter(
      r, "shardline_agent_coordinator_lost_total",
      "Times this agent stopped hearing from the coordinator and began reconnecting.",
      constant_labels);
}

AgentMetrics::~AgentMetrics() = default;

void AgentMetrics::SetActorsRunning(int64_t count) {
  actors_running_->Set(static_cast<double>(count));
}
void AgentMetrics::OnActorExit(std::string_view outcome) { actor_exits_->Get(outcome).Increment(); }
void AgentMetrics::OnActorExit(const ExitStatus& status) {
  OnActorExit(status.signaled ? "signal" : status.success() ? "success" : "failure");
}
void AgentMetrics::OnHeartbeatSent() { heartbeats_sent_->Increment(); }
void AgentMetrics::OnCoordinatorLost() { coordinator_lost_->Increment(); }

// ---------------------------------------------------------------------------------------------

ActorMetrics::ActorMetrics(std::shared_ptr<prometheus::Registry> registry,
                           const Labels& constant_labels)
    : registry_(std::move(registry)) {
  prometheus::Registry& r = *registry_;
  collective_bytes_ = std::make_unique<detail::LabeledCounters>(
      r, "shardline_collective_bytes_total",
      "Bytes of this rank's buffers passed to successful collectives, by operation.",
      constant_labels, "op", Vocabulary::Open());
  collective_seconds_ = std::make_unique<detail::LabeledHistograms>(
      r, "shardline_collective_seconds", "Duration of successful collectives, by operation.",
      constant_labels, "op", Vocabulary::Open(), kCollectiveBuckets);
  collective_errors_ = std::make_unique<detail::LabeledCounters>(
      r, "shardline_collective_errors_total", "Collectives that failed or timed out, by operation.",
      constant_labels, "op", Vocabulary::Open());
  // One family, two label sets: the direction is a constant label of each half.
  const std::string network_help =
      "Payload bytes this rank sent or received over the network (TCP) for its collectives, by "
      "the kind of group and direction.";
  for (auto [direction, counters] :
       {std::pair{"sent", &network_sent_}, std::pair{"received", &network_received_}}) {
    Labels labels = constant_labels;
    labels["direction"] = direction;
    *counters = std::make_unique<detail::LabeledCounters>(r, "shardline_actor_network_bytes_total",
                                                          network_help, labels, "group_kind",
                                                          Vocabulary::Closed(kGroupKinds, "other"));
  }
  step_ = &UnlabelledGauge(r, "shardline_actor_step", "Last training step this actor finished.",
                           constant_labels);
  loss_ = &UnlabelledGauge(r, "shardline_actor_loss", "Loss of the last step this actor finished.",
                           constant_labels);
}

ActorMetrics::~ActorMetrics() = default;

void ActorMetrics::OnOperation(std::string_view op, size_t bytes, double seconds, bool ok) {
  if (!ok) {
    collective_errors_->Get(op).Increment();
    return;
  }
  collective_bytes_->Get(op).Increment(static_cast<double>(bytes));
  collective_seconds_->Get(op).Observe(seconds);
}
void ActorMetrics::OnNetworkBytes(std::string_view group_kind, uint64_t sent, uint64_t received) {
  if (sent > 0) network_sent_->Get(group_kind).Increment(static_cast<double>(sent));
  if (received > 0) network_received_->Get(group_kind).Increment(static_cast<double>(received));
}
void ActorMetrics::SetStep(int64_t step) { step_->Set(static_cast<double>(step)); }
void ActorMetrics::SetLoss(double loss) { loss_->Set(loss); }

}  // namespace shardline::monitoring
