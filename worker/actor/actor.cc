#include "worker/actor/actor.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "kernels/cpu/blas.h"
#include "monitoring/metrics.h"
#include "monitoring/metrics_server.h"
#include "placement/job_spec.h"
#include "protocol/address_rule.h"
#include "protocol/rpc_client.h"
#include "spdlog/spdlog.h"
#include "worker/actor/calibration.h"
#include "worker/actor/comm_check.h"
#include "worker/actor/coordinator_store.h"
#include "worker/actor/layout_wire.h"
#include "worker/actor/report_queue.h"
#include "worker/comm/communicator.h"
#include "worker/comm/cpu_communicator.h"
#include "worker/model/data/tokenizer.h"
#include "worker/serving/batching_engine.h"
#include "worker/serving/chat_format.h"
#include "worker/serving/http_server.h"
#include "worker/serving/serving_rank.h"
#include "worker/training/sharded_trainer.h"
#include "worker/wire_observer.h"

namespace shardline::actor {
namespace {

using protocol::Str;
using namespace std::chrono_literals;

constexpr auto kRegisterTimeout = 30s;
constexpr auto kReportTimeout = 10s;
// The actor's own bootstrap timeouts run this much past the coordinator's deadline: when a peer
// is missing, the coordinator (which knows who) gives the verdict, not a rank that only timed out.
constexpr auto kBootstrapSlack = 5s;
// A serving rank's collectives: a follower waits this long for the leader's next step (an idle
// leader sends a heartbeat every second), and the first step waits for every rank's load. A dead
// peer is seen at once (shm's pidfds, the agent's exit report), not after this.
constexpr auto kServingCommTimeout = 120s;
// How often a serve job's leader reports its service to the coordinator, and looks for its
// agent's SIGTERM.
constexpr auto kServingReportInterval = 1s;
constexpr auto kServingSignalPoll = 10ms;

// Set by SIGTERM in a serve job's leader: its agent tears its generation down, with a grace to
// answer the open requests first (ActorSpawn.stopGraceMs). A lock-free atomic: async-signal-safe.
std::atomic<bool> serving_terminated{false};
static_assert(std::atomic<bool>::is_always_lock_free);
extern "C" void OnServingSigterm(int) { serving_terminated.store(true); }

// This rank's network bytes (sent plus received) by group kind since it started, which the step
// reports turn into bytes per step. Added to by the observers on the threads that issue
// operations, read by the training thread.
class NetworkTally {
 public:
  using Totals = std::array<uint64_t, monitoring::kGroupKinds.size()>;  // kGroupKinds' order

  void Add(std::string_view kind, uint64_t bytes) {
    const auto found =
        std::find(monitoring::kGroupKinds.begin(), monitoring::kGroupKinds.end(), kind);
    if (found == monitoring::kGroupKinds.end()) return;  // no kind a step report has
    bytes_[static_cast<size_t>(found - monitoring::kGroupKinds.begin())].fetch_add(
        bytes, std::memory_order_relaxed);
  }
  Totals Snapshot() const {
    Totals totals{};
    for (size_t i = 0; i < totals.size(); ++i) {
      totals[i] = bytes_[i].load(std::memory_order_relaxed);
    }
    return totals;
  }

 private:
  std::array<std::atomic<uint64_t>, monitoring::kGroupKinds.size()> bytes_{};
};

// One per communicator: the group's kind labels its network bytes.
class MeteredCollectives final : public comm::CommObserver {
 public:
  MeteredCollectives(monitoring::ActorMetrics& metrics, NetworkTally& tally, std::string kind)
      : metrics_(metrics), tally_(tally), kind_(std::move(kind)) {}
  void OnOperation(std::string_view op, size_t bytes, double seconds, bool ok) override {
    metrics_.OnOperation(op, bytes, seconds, ok);
  }
  void OnNetworkBytes(uint64_t sent, uint64_t received) override {
    metrics_.OnNetworkBytes(kind_, sent, received);
    tally_.Add(kind_, sent + received);
  }

 private:
  monitoring::ActorMetrics& metrics_;
  NetworkTally& tally_;
  const std::string kind_;
};

// A rank's shard of a checkpoint step (disk or memory) into its ShardSaved report.
void FillSavedShard(const checkpoint::SavedShard& shard, wire::ShardSaved::Builder report) {
  report.setFile(shard.file);
  report.setFileBytes(shard.bytes);
  report.setFileXxh3(shard.xxh3);
  auto tensors = report.initTensors(static_cast<unsigned>(shard.pieces.size()));
  const auto fill = [](auto list, const std::vector<int64_t>& values) {
    for (size_t k = 0; k < values.size(); ++k) {
      list.set(static_cast<unsigned>(k), static_cast<uint64_t>(values[k]));
    }
  };
  for (size_t i = 0; i < shard.pieces.size(); ++i) {
    const checkpoint::SavedPiece& piece = shard.pieces[i];
    auto out = tensors[static_cast<unsigned>(i)];
    out.setName(piece.name);
    out.setTensor(piece.tensor);
    out.setDtype(checkpoint::DTypeName(piece.dtype));
    out.setXxh3(piece.xxh3);
    fill(out.initGlobalShape(static_cast<unsigned>(piece.global_shape.size())), piece.global_shape);
    fill(out.initOffsets(static_cast<unsigned>(piece.offsets.size())), piece.offsets);
    fill(out.initShape(static_cast<unsigned>(piece.shape.size())), piece.shape);
  }
}

// Everything one actor run holds; its methods are the steps of RunActor.
class Actor {
 public:
  Actor(const ActorOptions& options, const ActorHooks& hooks) : options_(options), hooks_(hooks) {}

  absl::Status Connect();
  absl::Status Register();
  absl::Status Bootstrap();
  // The job itself; an error here is reported as the actor's failure.
  absl::Status RunJob();
  absl::Status RunCommCheckJob();
  absl::Status RunTrainJob();
  absl::Status RunServeJob();
  // Measures this rank's GEMM and its groups' all-reduces and reports them (see calibration.h).
  absl::Status CalibrateAndReport();
  absl::Status ReportDone(const absl::Status& result);

 private:
  template <typename Fill>
  absl::Status Report(Fill fill) {
    auto message = client_->NewMessage();
    fill(message->payload());
    ASSIGN_OR_RETURN(auto reply, client_->Call(*message, kReportTimeout));
    (void)reply;
    return absl::OkStatus();
  }

  // Every report says which actor it is from: job, generation, rank.
  template <typename Builder>
  Builder Origin(Builder builder) const {
    builder.setJobId(options_.job_id);
    builder.setGeneration(options_.generation);
    builder.setRank(options_.rank);
    return builder;
  }

  const ActorOptions& options_;
  const ActorHooks& hooks_;
  std::string address_;
  std::unique_ptr<monitoring::MetricsServer> metrics_server_;
  std::unique_ptr<monitoring::WireMetrics> wire_metrics_;
  std::unique_ptr<monitoring::ActorMetrics> actor_metrics_;
  std::unique_ptr<worker::MeteredWire> wire_observer_;
  NetworkTally network_tally_;
  // One per communicator, kept for the actor's life: the communicators hold raw pointers to them.
  std::vector<std::unique_ptr<MeteredCollectives>> collective_observers_;
  std::unique_ptr<protocol::RpcClient> client_;
  // What training reports while it runs (steps, saved shards): off the training thread.
  std::unique_ptr<ReportQueue> reports_;

  // The communicators of this rank's serving groups (null: a group of one).
  serving::ServingGroups ServingGroupsOf() const;
  // Rank 0 of a serve job: the engine, the HTTP server, and a report of the service every second
  // until the engine fails (or the agent ends this process).
  absl::Status LeadServing(const training::CheckpointSource& source,
                           const model::InferenceWeights& weights,
                           const serving::BatchingEngineOptions& engine_options,
                           kernels::Backend& backend, const serving::ServingGroups& groups);
  void PostServingStatus(const serving::HttpServer* server, const serving::BatchingEngine* engine,
                         const std::string& model_name);

  // From the assignment.
  placement::JobSpec spec_;
  std::string backend_;
  std::string store_prefix_;
  std::string resume_manifest_;  // kind train: the step to resume from; empty: fresh
  std::string memory_resume_;    // kind train: the memory step to resume from instead (JSON)
  std::vector<uint32_t> memory_buddies_;  // kind train, memory_replicas: by rank
  std::string serve_listen_;     // kind serve, rank 0: where to listen; empty: the spec's
  bool calibrate_ = true;        // kind train: measure before the first step
  std::chrono::milliseconds bootstrap_timeout_{30000};
  uint32_t world_size_ = 0;
  int device_index_ = 0;
  bool cuda_device_ = false;
  struct Group {
    std::string kind, id;
    std::vector<uint32_t> ranks;
  };
  std::vector<Group> groups_;
  std::map<std::string, std::unique_ptr<comm::Communicator>> communicators_;  // by group id

  // A serve job's leader: what its next report says.
  struct ServingReport {
    std::string url, model;
    bool ready = false;
    serving::EngineStats stats;
  };
  uint64_t serving_reports_ = 0;
};

absl::Status Actor::Connect() {
  ASSIGN_OR_RETURN(
      const protocol::AdvertisedAddress advertised,
      protocol::ChooseAdvertisedAddress(options_.advertise_address, "", options_.coordinator));
  address_ = advertised.address;
  // Loopback unless its agent was told otherwise (--actor-metrics-host): a metrics endpoint
  // tells whoever reaches it what the job is doing.
  const std::string metrics_address =
      options_.metrics_address.empty() ? "127.0.0.1:0" : options_.metrics_address;
  ASSIGN_OR_RETURN(metrics_server_, monitoring::MetricsServer::Start(metrics_address));
  const monitoring::Labels labels = {{"component", "actor"},
                                     {"job", options_.job_id},
                                     {"rank", std::to_string(options_.rank)},
                                     {"node", options_.node_id}};
  wire_metrics_ = std::make_unique<monitoring::WireMetrics>(metrics_server_->registry(), labels);
  actor_metrics_ = std::make_unique<monitoring::ActorMetrics>(metrics_server_->registry(), labels);
  wire_observer_ = std::make_unique<worker::MeteredWire>(*wire_metrics_);
  const std::string sender = "actor/" + options_.job_id + "/" +
                             std::to_string(options_.generation) + "/" +
                             std::to_string(options_.rank);
  // The actor speaks with its node's key: it runs on that node, on the agent's behalf.
  ASSIGN_OR_RETURN(const auto curve,
                   protocol::ResolveClientCurve(options_.curve, protocol::PeerRole::kNode));
  const protocol::ClientCurve* identity = curve ? &*curve : nullptr;
  // Its token proves which rank of which generation it is; read once, then out of the
  // environment of anything it might start.
  std::string token;
  if (const char* hex = std::getenv(kActorTokenEnv); hex != nullptr) {
    token = absl::HexStringToBytes(hex);
    ::unsetenv(kActorTokenEnv);
  }
  ASSIGN_OR_RETURN(client_, protocol::RpcClient::Connect(options_.coordinator, options_.cluster_id,
                                                         sender, identity, wire_observer_.get()));
  client_->set_actor_token(token);
  ASSIGN_OR_RETURN(reports_, ReportQueue::Connect(options_.coordinator, options_.cluster_id, sender,
                                                  identity, token, wire_observer_.get(),
                                                  kReportTimeout));
  return absl::OkStatus();
}

absl::Status Actor::Register() {
  auto message = client_->NewMessage();
  auto request = Origin(message->payload().initRegisterActor());
  request.setNodeId(options_.node_id);
  request.setPid(static_cast<uint32_t>(getpid()));
  request.setAddress(address_);
  request.setMetricsAddress(metrics_server_->address());
  ASSIGN_OR_RETURN(auto reply, client_->Call(*message, kRegisterTimeout));
  if (reply->which() != wire::Envelope::Payload::ASSIGNMENT) {
    return absl::InternalError("register: expected an assignment, got " +
                               std::string(protocol::PayloadName(reply->which())));
  }
  const auto assignment = reply->envelope().getPayload().getAssignment();
  placement::PathBase base;
  base.spec_dir = Str(assignment.getSpecDir());
  base.work_dir = Str(assignment.getWorkDir());
  ASSIGN_OR_RETURN(spec_,
                   placement::ParseJobSpec(Str(assignment.getSpecYaml()), "assignment", base));
  if (spec_.kind == placement::JobKind::kServe && assignment.hasParallel()) {
    // A serve job's layout: the one the coordinator planned for `parallel: auto`, else its spec's,
    // which the coordinator sends back as it placed it.
    const auto layout = assignment.getParallel();
    if (spec_.parallel_auto) {
      spec_.parallel.tp = static_cast<int>(std::min<uint32_t>(layout.getTp(), 1u << 16));
      spec_.parallel.pp = static_cast<int>(std::min<uint32_t>(layout.getPp(), 1u << 16));
      spec_.actors = spec_.parallel.world();
    } else if (layout.getTp() != static_cast<uint32_t>(spec_.parallel.tp) ||
               layout.getPp() != static_cast<uint32_t>(spec_.parallel.pp)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the assignment's layout tp ", layout.getTp(), ", pp ", layout.getPp(),
                       " is not the serve spec's tp ", spec_.parallel.tp, ", pp ",
                       spec_.parallel.pp));
    }
  } else if (spec_.kind == placement::JobKind::kTrain && assignment.hasParallel()) {
    // The coordinator's layout: for `parallel: auto` the planner's, which the spec does not say.
    absl::StatusOr<placement::ParallelSpec> parallel =
        ParallelSpecFromWire(assignment.getParallel());
    if (!parallel.ok()) return Annotate(parallel.status(), "the assignment's layout");
    if (auto status = placement::ApplyPlannedLayout(spec_, *parallel); !status.ok()) {
      return Annotate(status, "the assignment's layout");
    }
  } else if (spec_.kind == placement::JobKind::kTrain && spec_.parallel_auto) {
    return absl::InvalidArgumentError("the assignment of a `parallel: auto` job has no layout");
  }
  resume_manifest_ = Str(assignment.getResumeManifest());
  memory_resume_ = Str(assignment.getMemoryResume());
  for (uint32_t buddy : assignment.getMemoryBuddies()) {
    if (buddy >= assignment.getWorldSize()) {
      return absl::InvalidArgumentError(absl::StrCat("the assignment's memory buddy ", buddy,
                                                     " is outside the world of ",
                                                     assignment.getWorldSize()));
    }
    memory_buddies_.push_back(buddy);
  }
  if (!memory_buddies_.empty() && memory_buddies_.size() != assignment.getWorldSize()) {
    return absl::InvalidArgumentError(absl::StrCat("the assignment names ", memory_buddies_.size(),
                                                   " memory buddies for a world of ",
                                                   assignment.getWorldSize()));
  }
  serve_listen_ = Str(assignment.getServeListen());
  calibrate_ = assignment.getCalibrate();
  backend_ = Str(assignment.getBackend());
  store_prefix_ = Str(assignment.getStorePrefix());
  bootstrap_timeout_ = std::chrono::milliseconds(assignment.getBootstrapTimeoutMs());
  world_size_ = assignment.getWorldSize();
  device_index_ = static_cast<int>(assignment.getDevice().getIndex());
  cuda_device_ = assignment.getDevice().getKind() == wire::DeviceKind::CUDA;
  for (auto group : assignment.getGroups()) {
    Group g{Str(group.getKind()), Str(group.getId()), {}};
    for (auto r : group.getRanks()) g.ranks.push_back(r);
    groups_.push_back(std::move(g));
  }
  spdlog::info("rank {}/{} of job {} generation {}: {} backend, {} groups", options_.rank,
               world_size_, options_.job_id, options_.generation, backend_, groups_.size());
  return absl::OkStatus();
}

absl::Status Actor::Bootstrap() {
  if (hooks_.before_bootstrap) hooks_.before_bootstrap(options_.rank);
  CoordinatorStore store(*client_);
  for (const auto& group : groups_) {
    const auto me = std::find(group.ranks.begin(), group.ranks.end(), options_.rank);
    if (me == group.ranks.end()) continue;
    const int index = static_cast<int>(me - group.ranks.begin());
    const int size = static_cast<int>(group.ranks.size());
    comm::PrefixStore group_store(store_prefix_ + "/" + group.id, store);
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(Report([&](auto payload) {
      auto join = Origin(payload.initCommJoin());
      join.setGroupId(group.id);
    }));
    absl::StatusOr<std::unique_ptr<comm::Communicator>> communicator;
    if (backend_ == "nccl") {
      comm::NcclOptions nccl;
      nccl.device = device_index_;
      nccl.timeout = bootstrap_timeout_ + kBootstrapSlack;
      communicator = comm::CreateNcclCommunicator(group_store, index, size, nccl);
    } else {
      comm::GlooOptions gloo;
      gloo.hostname = address_;
      gloo.timeout = std::max<std::chrono::milliseconds>(bootstrap_timeout_ + kBootstrapSlack, 30s);
      // Gloo has one timeout for the bootstrap and every operation, and so has shm. In training a
      // pipeline stage waits for its neighbour's whole forward, which on a CPU can take minutes; a
      // dead peer is noticed by the coordinator (its agent reports the exit) long before this,
      // and by shm's pidfds at once.
      if (spec_.kind == placement::JobKind::kTrain) {
        gloo.timeout = std::max<std::chrono::milliseconds>(gloo.timeout, spec_.run_timeout);
      }
      if (spec_.kind == placement::JobKind::kServe) {
        gloo.timeout = std::max<std::chrono::milliseconds>(gloo.timeout, kServingCommTimeout);
      }
      // The memory tier's group moves files between nodes only, off the training thread: plain
      // Gloo, whatever the training groups run over.
      if (backend_ == "shm" && group.kind != "memory") {
        comm::CpuCommOptions cpu;
        cpu.gloo = gloo;
        cpu.shm.timeout = gloo.timeout;
        communicator = comm::CreateCpuCommunicator(group_store, index, size, cpu);
      } else {
        communicator = comm::CreateGlooCommunicator(group_store, index, size, gloo);
      }
    }
    if (!communicator.ok()) {
      const std::string error = ToString(communicator.status().message());
      spdlog::error("group {}: {}", group.id, error);
      RETURN_IF_ERROR(Report([&](auto payload) {
        auto failed = Origin(payload.initCommFailed());
        failed.setGroupId(group.id);
        failed.setMessage(error);
      }));
      return Annotate(communicator.status(), "joining group " + group.id);
    }
    collective_observers_.push_back(
        std::make_unique<MeteredCollectives>(*actor_metrics_, network_tally_, group.kind));
    (*communicator)->set_observer(collective_observers_.back().get());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    RETURN_IF_ERROR(Report([&](auto payload) {
      auto ready = Origin(payload.initCommReady());
      ready.setGroupId(group.id);
      ready.setSeconds(seconds);
      ready.setTransport(std::string((*communicator)->backend()));
    }));
    spdlog::info("group {} ({} of {}) ready in {:.3f} s over {}", group.id, index, size, seconds,
                 (*communicator)->backend());
    communicators_[group.id] = std::move(*communicator);
  }
  return absl::OkStatus();
}

absl::Status Actor::RunJob() {
  switch (spec_.kind) {
    case placement::JobKind::kCommCheck:
      return RunCommCheckJob();
    case placement::JobKind::kTrain:
      return RunTrainJob();
    case placement::JobKind::kServe:
      return RunServeJob();
  }
  return absl::InternalError("unknown job kind");
}

absl::Status Actor::CalibrateAndReport() {
  CalibrationOptions calibration;
  // The CPU kernels measure a CPU device only; NCCL's buffers live on the GPU, which this
  // measurement does not allocate. A GPU rank reports nothing until the GPU model runs here, and
  // the planner keeps its defaults for it.
  calibration.measure_compute = !cuda_device_;
  std::vector<CalibrationGroup> groups;
  if (backend_ != "nccl") {
    // groups_ is the Assignment's list, the same on every rank (RankGrid::AllGroups); the
    // groups this rank is not in go in too, without a communicator, for a time-shared host's
    // turns (calibration.h).
    for (const auto& group : groups_) {
      if (group.kind == "memory") continue;  // carries files, never a training collective
      auto found = communicators_.find(group.id);
      groups.push_back({group.id, group.kind,
                        found == communicators_.end() ? nullptr : found->second.get(),
                        group.ranks});
    }
  }
  if (!calibration.measure_compute && groups.empty()) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const CalibrationResult result, Calibrate(groups, calibration));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("calibration in {:.3f} s: layers {:.2f} GFLOP/s (half at {:.0f}), optimizer "
               "{:.2f} GB/s, {} groups; {} ranks of {} threads on {} CPUs here{}",
               seconds, result.compute.flops / 1e9, result.compute.half_dim,
               result.optimizer_bytes_per_second / 1e9, result.groups.size(), result.host.ranks,
               result.host.threads, result.host.cpus,
               result.host.cpu_share() < 1 ? " (time-shared: measured in turns)" : "");
  if (calibration.measure_compute) spdlog::info("  CPU BLAS: {}", kernels::cpu::BlasDescription());
  for (const auto& group : result.groups) {
    spdlog::info("  group {} ({} ranks): all-reduce bus {:.3f} GB/s, latency {:.1f} us loaded, "
                 "{:.1f} us idle",
                 group.id, group.ranks, group.bus_bytes_per_second / 1e9,
                 group.latency_seconds * 1e6, group.idle_latency_seconds * 1e6);
  }
  // Measurements inform later plans; a report the coordinator missed costs no training.
  auto status = Report([&](auto payload) {
    auto report = Origin(payload.initCalibration());
    report.setNodeId(options_.node_id);
    auto device = report.initDevice();
    device.setKind(cuda_device_ ? wire::DeviceKind::CUDA : wire::DeviceKind::CPU);
    device.setIndex(static_cast<uint32_t>(device_index_));
    report.setComputeFlops(result.compute.flops);
    report.setComputeHalfDim(result.compute.half_dim);
    report.setOptimizerBytesPerSecond(result.optimizer_bytes_per_second);
    auto list = report.initGroups(static_cast<unsigned>(result.groups.size()));
    for (size_t i = 0; i < result.groups.size(); ++i) {
      const GroupBandwidth& group = result.groups[i];
      auto out = list[static_cast<unsigned>(i)];
      out.setGroupId(group.id);
      out.setKind(group.kind);
      out.setRanks(static_cast<uint32_t>(group.ranks));
      out.setBusBytesPerSecond(group.bus_bytes_per_second);
      out.setLatencySeconds(group.latency_seconds);
    }
  });
  if (!status.ok()) spdlog::warn("calibration report: {}", ToString(status.message()));
  return absl::OkStatus();
}

absl::Status Actor::RunTrainJob() {
  // Before the first step, while every rank is idle: the same collectives on every rank.
  if (calibrate_) RETURN_IF_ERROR(CalibrateAndReport());
  training::ShardedTrainOptions options;
  options.spec = spec_;
  options.rank = static_cast<int>(options_.rank);
  // Groups of one need no communicator: the engine takes null for them.
  for (const auto& group : groups_) {
    auto found = communicators_.find(group.id);
    if (found == communicators_.end() || found->second->size() == 1) continue;
    comm::Communicator* communicator = found->second.get();
    if (group.kind == "world") options.groups.world = communicator;
    if (group.kind == "tp") options.groups.tp = communicator;
    if (group.kind == "pp") options.groups.pp = communicator;
    if (group.kind == "dp") options.groups.dp = communicator;
    if (group.kind == "replica") options.groups.replica = communicator;
  }
  options.backend = kernels::BackendOptions{
      .device = cuda_device_ ? kernels::Device::kCuda : kernels::Device::kCpu,
      .device_index = device_index_,
      .bf16_gemms = cuda_device_};
  options.resume_manifest = resume_manifest_;
  options.memory.store = options_.memory_store;
  options.memory.job_id = options_.job_id;
  options.memory.generation = options_.generation;
  options.memory.interval = spec_.train.checkpoint.memory_interval;
  options.memory.buddies = memory_buddies_;
  options.memory.resume = memory_resume_;
  for (const auto& group : groups_) {
    auto found = communicators_.find(group.id);
    if (group.kind == "memory" && found != communicators_.end()) {
      options.memory.transfers = found->second.get();
    }
  }
  if (options.memory.interval > 0 && options.memory.store.empty()) {
    spdlog::warn(
        "checkpoint.memory_interval: this actor has no memory store (--memory-store); "
        "it saves no memory steps");
  }
  // At least once a second: the coordinator's hang watchdog follows the interval of reports.
  options.progress_interval = std::chrono::seconds(1);
  // Every rank reports: the coordinator takes the loss from the last stage and the timings of the
  // slowest rank. A lost report costs a status line, not the job; none waits on the training
  // thread.
  // Network bytes per step need the steps a report covers, which a rank's first report does not
  // say (nor does it cover steps only: the start moves weights too), so they start with its
  // second.
  std::optional<std::pair<int64_t, NetworkTally::Totals>> last_network;
  options.on_progress = [&](const training::ShardedProgress& progress) {
    actor_metrics_->SetStep(progress.step);
    const NetworkTally::Totals network = network_tally_.Snapshot();
    std::optional<std::array<double, monitoring::kGroupKinds.size()>> per_step;
    if (last_network && progress.step > last_network->first) {
      const double steps = static_cast<double>(progress.step - last_network->first);
      per_step.emplace();
      for (size_t i = 0; i < network.size(); ++i) {
        (*per_step)[i] = static_cast<double>(network[i] - last_network->second[i]) / steps;
      }
    }
    last_network.emplace(progress.step, network);
    reports_->Post("step report", [this, progress,
                                   per_step](wire::Envelope::Payload::Builder payload) {
      auto report = Origin(payload.initStepReport());
      report.setStep(static_cast<uint64_t>(progress.step));
      report.setLoss(progress.loss);
      report.setTokensPerSecond(progress.tokens_per_second);
      report.setComputeSeconds(progress.compute_seconds);
      report.setCommSeconds(progress.comm_seconds);
      report.setBubbleSeconds(progress.bubble_seconds);
      report.setLogged(progress.logged);
      if (per_step) {
        static_assert(monitoring::kGroupKinds[0] == "world" && monitoring::kGroupKinds[1] == "tp" &&
                      monitoring::kGroupKinds[2] == "pp" && monitoring::kGroupKinds[3] == "dp");
        auto bytes = report.initNetworkBytesPerStep();
        bytes.setWorld((*per_step)[0]);
        bytes.setTp((*per_step)[1]);
        bytes.setPp((*per_step)[2]);
        bytes.setDp((*per_step)[3]);
      }
    });
    if (options_.rank == 0 && progress.logged) {
      spdlog::info("step {}/{} loss {:.4f} {:.0f} tokens/s (compute {:.3f} s, comm {:.3f} s, "
                   "bubble {:.3f} s per step)",
                   progress.step, progress.steps, progress.loss, progress.tokens_per_second,
                   progress.compute_seconds, progress.comm_seconds, progress.bubble_seconds);
    }
  };
  // The coordinator commits a checkpoint step only when every rank has reported it saved. Called
  // on the checkpoint writer's thread, which may wait for the reply.
  options.on_saved = [&](const training::SavedStep& saved) {
    return reports_->Call([this, &saved](wire::Envelope::Payload::Builder payload) {
      auto report = Origin(payload.initShardSaved());
      report.setStep(static_cast<uint64_t>(saved.step));
      report.setDir(checkpoint::StepDir(spec_.train.checkpoint.dir, saved.step));
      report.setDataTokens(static_cast<uint64_t>(saved.data.tokens));
      report.setDataXxh3(saved.data.xxh3);
      FillSavedShard(saved.shard, report);
    });
  };
  // A memory step: the same report, flagged, with the step's folder in the node's store
  // (relative to it) and the replicas this rank holds.
  const std::string store_prefix = options_.memory_store + "/";
  options.memory.on_saved = [&](const training::MemorySaved& saved) {
    return reports_->Call([&](wire::Envelope::Payload::Builder payload) {
      auto report = Origin(payload.initShardSaved());
      report.setStep(static_cast<uint64_t>(saved.step));
      report.setDir(saved.dir.rfind(store_prefix, 0) == 0 ? saved.dir.substr(store_prefix.size())
                                                          : saved.dir);
      report.setMemory(true);
      report.setDataTokens(static_cast<uint64_t>(saved.data.tokens));
      report.setDataXxh3(saved.data.xxh3);
      auto replicas = report.initReplicaOf(static_cast<unsigned>(saved.replica_of.size()));
      for (size_t i = 0; i < saved.replica_of.size(); ++i) {
        replicas.set(static_cast<unsigned>(i), saved.replica_of[i]);
      }
      FillSavedShard(saved.shard, report);
    });
  };
  const absl::StatusOr<training::ShardedTrainResult> trained = training::TrainSharded(options);
  // Whatever happened, what training reported goes out before the actor's verdict does.
  reports_->Flush();
  if (!trained.ok()) return trained.status();
  const training::ShardedTrainResult& result = *trained;

  spdlog::info("training done: {} steps, final loss {:.4f}, peak {} bytes", result.losses.size(),
               result.losses.empty() ? 0.0f : result.losses.back(), result.peak_bytes);
  return absl::OkStatus();
}

serving::ServingGroups Actor::ServingGroupsOf() const {
  serving::ServingGroups groups;
  for (const auto& group : groups_) {
    auto found = communicators_.find(group.id);
    if (found == communicators_.end() || found->second->size() == 1) continue;
    comm::Communicator* communicator = found->second.get();
    if (group.kind == "world") groups.world = communicator;
    if (group.kind == "tp") groups.tp = communicator;
    if (group.kind == "pp") groups.pp = communicator;
  }
  return groups;
}

void Actor::PostServingStatus(const serving::HttpServer* server,
                              const serving::BatchingEngine* engine,
                              const std::string& model_name) {
  ServingReport report;
  report.url = server != nullptr ? server->url() : "";
  report.model = model_name;
  if (engine != nullptr) {
    report.ready = engine->Ready();
    report.stats = engine->Stats();
  }
  const uint64_t sequence = ++serving_reports_;
  reports_->Post("serving report", [this, report,
                                     sequence](wire::Envelope::Payload::Builder payload) {
    auto step = Origin(payload.initStepReport());
    step.setStep(sequence);
    auto out = step.initServing();
    out.setUrl(report.url);
    out.setModel(report.model);
    out.setReady(report.ready);
    out.setTp(static_cast<uint32_t>(spec_.parallel.tp));
    out.setPp(static_cast<uint32_t>(spec_.parallel.pp));
    out.setRunning(static_cast<uint64_t>(report.stats.running));
    out.setWaiting(static_cast<uint64_t>(report.stats.waiting));
    out.setTokensGenerated(static_cast<uint64_t>(report.stats.tokens_generated));
    out.setKvBlocks(static_cast<uint64_t>(report.stats.kv_blocks));
    out.setKvBlocksUsed(static_cast<uint64_t>(report.stats.kv_blocks_used));
    out.setPreemptions(static_cast<uint64_t>(report.stats.preemptions));
  });
}

absl::Status Actor::LeadServing(const training::CheckpointSource& source,
                                const model::InferenceWeights& weights,
                                const serving::BatchingEngineOptions& engine_options,
                                kernels::Backend& backend, const serving::ServingGroups& groups) {
  const placement::ServeSpec& serve = spec_.serve;
  // The leader alone tokenizes (the other ranks see token ids only).
  const std::string tokenizer_spec = training::TokenizerSpecFor(serve.tokenizer, source.path());
  auto tokenizer = data::LoadTokenizer(tokenizer_spec);
  if (!tokenizer.ok()) return Annotate(tokenizer.status(), "the serve spec's tokenizer");
  if (absl::Status fits = data::CheckTokenizerFitsModel(**tokenizer, source.config().vocab);
      !fits.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source.path(), ": ", fits.message(),
                                                   " (the serve spec's tokenizer names another)"));
  }
  serving::HttpServerOptions http;
  const std::string listen = serve_listen_.empty() ? serve.listen : serve_listen_;
  RETURN_IF_ERROR(placement::ParseHostPort(listen, &http.host, &http.port));
  http.api_key = serve.api_key;
  if (!serve.api_key_file.empty()) {
    ASSIGN_OR_RETURN(http.api_key, serving::ReadApiKeyFile(serve.api_key_file));
  }
  http.model_name =
      serve.model_name.empty() ? serving::DefaultModelName(serve.checkpoint) : serve.model_name;
  // The model's chat template lives with its tokenizer (tokenizer_config.json).
  auto chat = serving::ChatFormatFor(tokenizer_spec);
  if (!chat.ok()) return Annotate(chat.status(), "the served model's chat template");
  http.chat = *chat;
  ASSIGN_OR_RETURN(auto engine,
                   serving::BatchingEngine::Create(weights, engine_options, backend, groups));
  auto server = serving::HttpServer::Start(http, *engine, **tokenizer);
  if (!server.ok()) return Annotate(server.status(), "listen " + listen);
  spdlog::info("serving {} at {}/v1 (tp {}, pp {}, KV cache of {} blocks of {} positions on each "
               "rank)",
               http.model_name, (*server)->url(), spec_.parallel.tp, spec_.parallel.pp,
               engine->Batching().kv_blocks, engine_options.block_size);
  // The service runs until the agent ends this process (the job cancelled, or its generation
  // aborted after a fault); a failed step ends it here, and the coordinator restarts the
  // generation when the job is elastic. The agent's SIGTERM (an abort, with a grace before its
  // SIGKILL) ends every open request with a 503 that says why, before the process goes: a
  // request the group's failure has not ended already (a rank that hangs rather than dies).
  struct sigaction on_term {};
  on_term.sa_handler = OnServingSigterm;
  sigemptyset(&on_term.sa_mask);
  sigaction(SIGTERM, &on_term, nullptr);
  auto next_report = std::chrono::steady_clock::now();
  while (true) {
    if (serving_terminated.load()) {
      engine->StopNow(absl::UnavailableError(
          "the serving job's generation was aborted by its supervisor (a rank failed or the job "
          "was cancelled); an elastic job serves again shortly"));
      (*server)->Stop();
      reports_->Flush();
      return absl::CancelledError("stopped by the agent (SIGTERM) after answering open requests");
    }
    if (std::chrono::steady_clock::now() >= next_report) {
      PostServingStatus(server->get(), engine.get(), http.model_name);
      next_report += kServingReportInterval;
    }
    if (!engine->Ready()) {
      (*server)->Stop();
      reports_->Flush();
      return absl::UnavailableError("the serving engine stopped after a failed step (a rank of "
                                    "its group failed)");
    }
    std::this_thread::sleep_for(kServingSignalPoll);
  }
}

absl::Status Actor::RunServeJob() {
  const placement::ServeSpec& serve = spec_.serve;
  const int tp = spec_.parallel.tp;
  const int pp = spec_.parallel.pp;
  ASSIGN_OR_RETURN(const placement::RankGrid grid, placement::RankGrid::Create(tp, pp, 1));
  if (static_cast<int>(options_.rank) >= grid.world()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank,
                                                   " is outside the serving group of tp ", tp,
                                                   ", pp ", pp));
  }
  const placement::RankCoords coords = grid.Coords(static_cast<int>(options_.rank));
  if (options_.rank == 0) PostServingStatus(nullptr, nullptr, "");
  ASSIGN_OR_RETURN(const std::string resolved, checkpoint::ResolveCheckpoint(serve.checkpoint));
  ASSIGN_OR_RETURN(training::CheckpointSource source,
                   training::CheckpointSource::Open(resolved, serve.hf_heads));
  const placement::ServeLimits& limits = serve.limits;
  const serving::BatchingEngineOptions engine_options{
      .max_running = limits.max_running,
      .max_tokens_per_step = limits.max_tokens_per_step,
      .block_size = limits.block_size,
      .kv_cache_bytes = limits.kv_cache_bytes,
      .max_queue = limits.max_queue};
  RETURN_IF_ERROR(serving::CheckServingLayout(source.config(), tp, pp, engine_options,
                                              "parallel.tp", "parallel.pp"));
  // On a CUDA device the engine runs there (fp32 GEMMs). The groups are host communicators (a
  // serve job's backend is shm or Gloo: its steps, residuals and sampling move host memory); the
  // forward's tensor-parallel all-reduces stage the GPU's buffers through the host group.
  kernels::CpuAllocator allocator;
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                   kernels::CreateBackend(kernels::BackendOptions{
                       .device = cuda_device_ ? kernels::Device::kCuda : kernels::Device::kCpu,
                       .device_index = device_index_,
                       .cpu_allocator = &allocator}));
  ASSIGN_OR_RETURN(auto shard, serving::LoadServingShard(source, tp, pp, coords, *backend));
  spdlog::info("rank {} (tensor-parallel index {}, stage {}) loaded its shard of {}",
               options_.rank, coords.tp, coords.pp, resolved);
  // Every rank has loaded its shard before the leader says it is ready (/health) or a follower
  // waits for steps.
  if (comm::Communicator* world = ServingGroupsOf().world; world != nullptr) {
    RETURN_IF_ERROR(Annotate(world->Barrier(), "waiting for every rank to load its shard"));
  }
  std::unique_ptr<comm::Communicator> staged_tp;
  const serving::ServingGroups groups =
      serving::GroupsForBackend(ServingGroupsOf(), *backend, staged_tp);
  if (options_.rank == 0) {
    return LeadServing(source, shard->weights(), engine_options, *backend, groups);
  }
  return serving::RunServingFollower(shard->weights(), engine_options, *backend, groups);
}

absl::Status Actor::RunCommCheckJob() {
  auto world = communicators_.find("world");
  if (world == communicators_.end()) return absl::InternalError("no world group assigned");
  std::string mismatch;
  uint64_t step = 0;
  auto on_op_done = [&](const std::vector<CommCheckResult>& results) {
    ++step;
    actor_metrics_->SetStep(static_cast<int64_t>(step));
    if (options_.rank != 0) return;
    // Rank 0 speaks for all: the results are already agreed across ranks.
    auto status = Report([&](auto payload) {
      auto report = Origin(payload.initStepReport());
      report.setStep(step);
      auto list = report.initResults(static_cast<unsigned>(results.size()));
      for (size_t i = 0; i < results.size(); ++i) {
        list[i].setOp(results[i].op);
        list[i].setBytes(results[i].bytes);
        list[i].setRanks(static_cast<uint32_t>(results[i].ranks));
        list[i].setSeconds(results[i].seconds);
        list[i].setAlgorithmGBps(results[i].algorithm_gbps);
        list[i].setBusGBps(results[i].bus_gbps);
        list[i].setOk(results[i].ok);
        list[i].setDetail(results[i].detail);
      }
    });
    if (!status.ok()) spdlog::warn("step report: {}", ToString(status.message()));
  };
  ASSIGN_OR_RETURN(auto results,
                   RunCommCheck(*world->second, spec_.comm_check, on_op_done, &mismatch));
  if (!mismatch.empty()) return absl::DataLossError(mismatch);
  spdlog::info("comm-check done: {} results", results.size());
  return absl::OkStatus();
}

absl::Status Actor::ReportDone(const absl::Status& result) {
  return Report([&](auto payload) {
    auto done = Origin(payload.initActorDone());
    done.setOk(result.ok());
    done.setMessage(result.ok() ? "" : ToString(result.message()));
    done.setErrorCode(static_cast<uint32_t>(result.code()));
  });
}

}  // namespace

int RunActor(const ActorOptions& options, const ActorHooks& hooks) {
  Actor actor(options, hooks);
  if (auto status = actor.Connect(); !status.ok()) {
    spdlog::error("actor start: {}", ToString(status.message()));
    return 2;
  }
  if (auto status = actor.Register(); !status.ok()) {
    spdlog::error("registering with {}: {}", options.coordinator, ToString(status.message()));
    return 2;
  }
  if (auto status = actor.Bootstrap(); !status.ok()) {
    spdlog::error("bootstrap: {}", ToString(status.message()));
    return 1;
  }
  const absl::Status run = actor.RunJob();
  if (!run.ok()) spdlog::error("job: {}", ToString(run.message()));
  if (auto status = actor.ReportDone(run); !status.ok()) {
    spdlog::error("reporting the result: {}", ToString(status.message()));
    return 2;
  }
  return run.ok() ? 0 : 1;
}

}  // namespace shardline::actor
