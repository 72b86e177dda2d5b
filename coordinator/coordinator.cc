#include "coordinator/coordinator.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <kj/exception.h>

#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "checkpoint/checksum.h"
#include "checkpoint/layout.h"
#include "checkpoint/resume.h"
#include "placement/checkpoint_state.h"
#include "nlohmann/json.hpp"
#include "coordinator/supervisor.h"
#include "placement/byte_size.h"
#include "placement/parallel_layout.h"
#include "placement/plan_request.h"
#include "placement/planner.h"
#include "spdlog/spdlog.h"

namespace shardline::coordinator {
namespace {

using protocol::Str;
using Payload = wire::Envelope::Payload;

constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr auto kGaugeInterval = std::chrono::milliseconds(250);
constexpr std::chrono::milliseconds kMaxKvWait = std::chrono::minutes(10);
// Logged steps of a train job whose StepReports are still being gathered from the ranks; a
// report of an older step is too late to change what `status` shows.
constexpr size_t kRecentSteps = 8;
// Sizes and offsets from the wire stay below this, so sums of two never overflow an int64.
constexpr uint64_t kMaxDimension = uint64_t{1} << 62;

std::string Text(absl::string_view s) { return ToString(s); }

capnp::Text::Reader CapText(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

void FillDevice(wire::Device::Builder out, const DeviceInfo& device) {
  out.setKind(device.kind == DeviceInfo::Kind::kCuda ? wire::DeviceKind::CUDA
                                                     : wire::DeviceKind::CPU);
  out.setIndex(static_cast<uint32_t>(device.index));
  out.setMemoryBytes(device.memory_bytes);
  out.setName(CapText(device.name));
}

DeviceInfo ReadDevice(wire::Device::Reader in) {
  DeviceInfo device;
  device.kind = in.getKind() == wire::DeviceKind::CUDA ? DeviceInfo::Kind::kCuda
                                                       : DeviceInfo::Kind::kCpu;
  device.index = static_cast<int>(in.getIndex());
  device.memory_bytes = in.getMemoryBytes();
  device.name = Str(in.getName());
  return device;
}

double SecondsBetween(TimePoint a, TimePoint b) { return Seconds(b - a); }


std::string FormatSeconds(double s) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << s << " s";
  return out.str();
}

// A path from the spec resolved as ParseJobSpec resolves it (relative to `base`), lexically normal.
std::string ResolveUnder(const std::string& base, const std::string& path) {
  if (path.empty()) return path;
  const std::filesystem::path p(path);
  std::filesystem::path resolved =
      (p.is_absolute() ? p : std::filesystem::path(base) / p).lexically_normal();
  // "DIR/step-00000010/" is the same folder as "DIR/step-00000010".
  if (!resolved.has_filename() && resolved.has_relative_path()) resolved = resolved.parent_path();
  return resolved.string();
}

// `dir` as an absolute, lexically normal path: relative ones are taken from the coordinator's
// current directory. Empty stays empty.
std::string AbsoluteDir(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path here = std::filesystem::current_path(ec);
  return ResolveUnder(ec ? std::string("/") : here.string(), dir);
}

placement::PathBase PathBaseOf(const Job& job) { return {job.spec_dir, job.work_dir}; }

DeviceInfo::Kind DeviceKindOf(const placement::JobSpec& spec) {
  return spec.devices == placement::DeviceKind::kCuda ? DeviceInfo::Kind::kCuda
                                                      : DeviceInfo::Kind::kCpu;
}

// Devices of `kind` on the alive nodes: all of them, and those no job holds.
struct DeviceCount {
  int alive = 0;
  int free = 0;
};
DeviceCount CountDevices(const Membership& membership, DeviceInfo::Kind kind) {
  DeviceCount count;
  for (const auto& [node_id, node] : membership.nodes()) {
    if (!node.alive) continue;
    for (const DeviceInfo& device : node.devices) {
      if (device.kind != kind) continue;
      ++count.alive;
      count.free += device.busy_job.empty() ? 1 : 0;
    }
  }
  return count;
}

// Why an elastic job below its min_actors waits: "waiting for 2 more cpu devices: 2 free of 2
// alive, min 4".
std::string WaitingForMore(const std::string& kind, int free, int alive, int min_actors) {
  const int more = std::max(1, min_actors - free);
  return "waiting for " + std::to_string(more) + " more " + kind + " device" +
         (more == 1 ? "" : "s") + ": " + std::to_string(free) + " free of " +
         std::to_string(alive) + " alive, min " + std::to_string(min_actors);
}

// The most devices a `parallel: auto` job may plan on (0: any).
int AutoMaxActors(const placement::JobSpec& spec) {
  return spec.elastic.enabled ? spec.elastic.max_actors : spec.actors;
}

// A `parallel: auto` job plans afresh at its next start: back to the spec's own (unplanned) form.
void ForgetAutoPlan(Job& job) {
  const int64_t micro_batch = job.spec.parallel.micro_batch;  // the spec's, which a plan keeps
  job.spec.parallel = placement::ParallelSpec();
  job.spec.parallel.micro_batch = micro_batch;
  job.spec.actors = job.auto_max_actors;
  job.plan.planned = false;
  job.plan.failed_on.clear();
}

// The hang watchdog's floor of a job's generations.
Duration WatchdogFloor(const Job& job) {
  return job.Elastic() ? Duration(job.spec.elastic.progress_timeout)
                       : Duration(placement::ElasticSpec().progress_timeout);
}

// A generation of the job history (Persist writes them); throws on a malformed entry, which
// LoadHistory reports.
GenerationRecord GenerationFromJson(const nlohmann::json& entry) {
  GenerationRecord g;
  g.generation = entry.at("generation").get<uint32_t>();
  g.started_unix_ms = entry.value("started_unix_ms", int64_t{0});
  g.ended_unix_ms = entry.value("ended_unix_ms", int64_t{0});
  g.plan = entry.value("plan", "");
  g.world = entry.value("world", 0);
  g.resumed_step = entry.value("resumed_step", int64_t{0});
  g.last_step = entry.value("last_step", int64_t{0});
  g.ending = ParseEnding(entry.value("ending", "failed")).value_or(Ending::kFailed);
  g.consequences = entry.value("consequences", std::vector<std::string>{});
  g.steps_lost = entry.value("steps_lost", int64_t{0});
  g.recovery_seconds = entry.value("recovery_seconds", -1.0);
  g.detection_seconds = entry.value("detection_seconds", -1.0);
  g.abort_seconds = entry.value("abort_seconds", -1.0);
  if (entry.contains("cause")) {
    const auto& cause = entry["cause"];
    Fault fault;
    fault.kind = ParseFaultKind(cause.value("kind", "")).value_or(FaultKind::kActorError);
    fault.unix_ms = cause.value("unix_ms", int64_t{0});
    fault.rank = cause.value("rank", -1);
    fault.node = cause.value("node", "");
    fault.step = cause.value("step", int64_t{-1});
    fault.detail = cause.value("detail", "");
    g.cause = fault;
  }
  return g;
}

// A train job's layout for logs and errors: "tp 2 x pp 2 x dp 2, zero 1".
std::string PlanSummary(const placement::JobSpec& spec) {
  const auto& p = spec.parallel;
  return "tp " + std::to_string(p.tp) + " x pp " + std::to_string(p.pp) + " x dp " +
         std::to_string(p.dp) + ", zero " + std::to_string(p.zero);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options,
                                                                 const Clock* clock) {
  if (options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError("heartbeat timeout (" +
                                      std::to_string(options.heartbeat_timeout.count()) +
                                      " ms) must exceed the heartbeat interval (" +
                                      std::to_string(options.heartbeat_interval.count()) + " ms)");
  }
  if (!options.state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(options.state_dir) / "jobs", ec);
    if (ec) {
      return absl::InvalidArgumentError("state dir " + options.state_dir +
                                        " cannot be created: " + ec.message());
    }
  }
  // One coordinator per state dir: a second one would supervise the same jobs twice.
  int lock_fd = -1;
  if (!options.state_dir.empty()) {
    const std::string lock_path = (std::filesystem::path(options.state_dir) / "lock").string();
    lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd < 0) {
      return absl::InvalidArgumentError("state dir " + options.state_dir + ": cannot open " +
                                        lock_path + ": " + strerror(errno));
    }
    if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
      std::string holder(32, '\0');
      const ssize_t n = ::pread(lock_fd, holder.data(), holder.size() - 1, 0);
      holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
      ::close(lock_fd);
      return absl::FailedPreconditionError(
          "state dir " + options.state_dir + " is in use by another coordinator" +
          (holder.empty() ? std::string() : " (pid " + holder + ")") +
          "; stop it first, or give this one another --state-dir");
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(lock_fd, 0) != 0 ||
        ::pwrite(lock_fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      spdlog::warn("could not write the pid into {}", lock_path);
    }
  }
  auto close_lock = [&lock_fd] {
    if (lock_fd >= 0) ::close(lock_fd);
    lock_fd = -1;
  };
  auto channel = protocol::Channel::Bind(options.listen);
  if (!channel.ok()) {
    close_lock();
    return channel.status();
  }
  auto metrics_server = monitoring::MetricsServer::Start(options.metrics_address);
  if (!metrics_server.ok()) {
    close_lock();
    return metrics_server.status();
  }
  auto coordinator = std::unique_ptr<Coordinator>(new Coordinator(
      std::move(options), clock, std::move(*channel), std::move(*metrics_server)));
  coordinator->state_dir_lock_fd_ = lock_fd;  // closed by the destructor from here on
  RETURN_IF_ERROR(coordinator->LoadHistory());
  return coordinator;
}

Coordinator::Coordinator(CoordinatorOptions options, const Clock* clock,
                         std::unique_ptr<protocol::Channel> channel,
                         std::unique_ptr<monitoring::MetricsServer> metrics_server)
    : options_(std::move(options)),
      clock_(clock),
      started_(clock->Now()),
      channel_(std::move(channel)),
      metrics_server_(std::move(metrics_server)),
      wire_metrics_(metrics_server_->registry(), {{"component", "coordinator"}}),
      metrics_(metrics_server_->registry(), {{"component", "coordinator"}}),
      membership_(options_.heartbeat_timeout) {
  std::random_device random;
  char id[17];
  snprintf(id, sizeof(id), "%08x%08x", random(), random());
  instance_id_ = id;
}

Coordinator::~Coordinator() {
  if (state_dir_lock_fd_ >= 0) ::close(state_dir_lock_fd_);
}

absl::Status Coordinator::Run(const std::atomic<bool>& stop) {
  spdlog::info("coordinator of cluster '{}' listening on {}, metrics on {}", options_.cluster_id,
               endpoint(), metrics_server_->address());
  while (!stop.load()) {
    auto frame = channel_->Receive(kPollInterval);
    if (!frame.ok()) {
      spdlog::error("receive failed: {}", Text(frame.status().message()));
    } else if (frame->has_value()) {
      HandleFrame(**frame);
      // Drain what is queued before the periodic work, but keep that work on time under load.
      for (int i = 0; i < 256; ++i) {
        auto more = channel_->Receive(std::chrono::milliseconds(0));
        if (!more.ok() || !more->has_value()) break;
        HandleFrame(**more);
      }
    }
    const TimePoint now = clock_->Now();
    auto dead = membership_.ExpireSilentNodes(now);
    if (!dead.empty()) OnNodesDead(dead);
    for (const auto& get : kv_.ExpireParked(now)) {
      metrics_.OnKvOperation("wait_timeout");
      ReplyError(get.peer, get.request_id,
                 absl::DeadlineExceededError("key '" + get.key + "' was not set in time"));
    }
    CheckDeadlines();
    Supervise();
    background_.RunFinished();
    TryStartPendingJobs();
    if (now - last_gauge_update_ >= kGaugeInterval) {
      UpdateGauges();
      last_gauge_update_ = now;
    }
  }
  for (auto& [id, job] : jobs_) {
    if (job.state == JobState::kRunning) EndJob(job, JobState::kFailed, "coordinator shut down");
  }
  if (state_dir_lock_fd_ >= 0) {
    ::close(state_dir_lock_fd_);
    state_dir_lock_fd_ = -1;
  }
  spdlog::info("coordinator stopped");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The wire

void Coordinator::HandleFrame(protocol::Frame& frame) {
  auto decoded = protocol::Decode(frame.bytes.data(), frame.bytes.size(), options_.cluster_id);
  if (!decoded.ok()) {
    wire_metrics_.OnDecodeError(protocol::DecodeFailureName(decoded.failure));
    spdlog::debug("refused a frame: {}", Text(decoded.status.message()));
    ReplyError(frame.peer, decoded.request_id, decoded.status);
    return;
  }
  const auto& message = *decoded.message;
  wire_metrics_.OnReceived(protocol::PayloadName(message.which()));
  try {
    Dispatch(frame.peer, message);
  } catch (const kj::Exception& e) {
    // A message that passed the structural check can still hold e.g. an unterminated text.
    wire_metrics_.OnDecodeError("garbage");
    ReplyError(frame.peer, message.request_id(),
               absl::InvalidArgumentError(std::string("malformed ") +
                                          std::string(protocol::PayloadName(message.which())) +
                                          ": " + e.getDescription().cStr()));
  }
}

void Coordinator::Dispatch(const std::string& peer, const protocol::Message& message) {
  const auto payload = message.envelope().getPayload();
  const uint64_t id = message.request_id();
  absl::Status status;
  switch (payload.which()) {
    case Payload::REGISTER_NODE: status = OnRegisterNode(peer, id, payload.getRegisterNode()); break;
    case Payload::HEARTBEAT: status = OnHeartbeat(peer, id, payload.getHeartbeat()); break;
    case Payload::SUBMIT_JOB: status = OnSubmitJob(peer, id, payload.getSubmitJob()); break;
    case Payload::STATUS_REQUEST:
      status = OnStatusRequest(peer, id, payload.getStatusRequest());
      break;
    case Payload::CANCEL_JOB: status = OnCancelJob(peer, id, payload.getCancelJob()); break;
    case Payload::ACTOR_EXITED: status = OnActorExited(peer, id, payload.getActorExited()); break;
    case Payload::REGISTER_ACTOR:
      status = OnRegisterActor(peer, id, payload.getRegisterActor());
      break;
    case Payload::KV_REQUEST:
      status = OnKvRequest(peer, id, Str(message.envelope().getSender()), payload.getKvRequest());
      break;
    case Payload::COMM_JOIN: status = OnCommJoin(peer, id, payload.getCommJoin()); break;
    case Payload::COMM_READY: status = OnCommReady(peer, id, payload.getCommReady()); break;
    case Payload::COMM_FAILED: status = OnCommFailed(peer, id, payload.getCommFailed()); break;
    case Payload::STEP_REPORT: status = OnStepReport(peer, id, payload.getStepReport()); break;
    case Payload::ACTOR_DONE: status = OnActorDone(peer, id, payload.getActorDone()); break;
    case Payload::SHARD_SAVED: status = OnShardSaved(peer, id, payload.getShardSaved()); break;
    case Payload::CALIBRATION:
      status = OnCalibration(peer, id, payload.getCalibration());
      break;
    case Payload::ERROR:
    case Payload::ACK:
      return;  // peers answer our pushes; nothing waits for those answers
    default:
      wire_metrics_.OnDecodeError("unexpected");
      status = absl::InvalidArgumentError("the coordinator does not accept " +
                                          std::string(protocol::PayloadName(payload.which())) +
                                          " messages");
  }
  if (!status.ok()) {
    spdlog::warn("{} from {}: {}", protocol::PayloadName(payload.which()),
                 Str(message.envelope().getSender()), Text(status.message()));
    ReplyError(peer, id, status);
  }
}

std::unique_ptr<protocol::Outgoing> Coordinator::NewMessage(uint64_t request_id) {
  return std::make_unique<protocol::Outgoing>(options_.cluster_id, "coordinator", request_id);
}

void Coordinator::Send(const std::string& peer, protocol::Outgoing& message) {
  wire_metrics_.OnSent(protocol::PayloadName(message.envelope().getPayload().which()));
  auto status = channel_->Send(message, peer);
  if (!status.ok()) spdlog::debug("send failed: {}", Text(status.message()));
}

void Coordinator::ReplyError(const std::string& peer, uint64_t request_id,
                             const absl::Status& status) {
  auto reply = NewMessage(request_id);
  protocol::SetError(reply->payload(), status);
  Send(peer, *reply);
}

void Coordinator::ReplyAck(const std::string& peer, uint64_t request_id) {
  if (request_id == 0) return;
  auto reply = NewMessage(request_id);
  reply->payload().setAck();
  Send(peer, *reply);
}

// ---------------------------------------------------------------------------------------------
// Membership

absl::Status Coordinator::OnRegisterNode(const std::string& peer, uint64_t request_id,
                                         wire::RegisterNode::Reader request) {
  NodeInfo node;
  node.node_id = Str(request.getNodeId());
  node.instance_id = Str(request.getInstanceId());
  node.hostname = Str(request.getHostname());
  node.address = Str(request.getAddress());
  node.metrics_address = Str(request.getMetricsAddress());
  node.pid = request.getPid();
  node.peer = peer;
  for (auto device : request.getDevices()) node.devices.push_back(ReadDevice(device));
  NodeInfo replaced;
  replaced.node_id.clear();
  RETURN_IF_ERROR(membership_.Register(node, clock_->Now(), &replaced));
  // Devices a live generation holds, by label, on the entry this one replaces.
  std::map<std::string, std::string> busy;
  if (!replaced.node_id.empty() && replaced.alive) {
    for (const DeviceInfo& device : replaced.devices) {
      if (!device.busy_job.empty()) busy[DeviceLabel(device)] = device.busy_job;
    }
  }
  std::set<std::string> labels;
  for (const DeviceInfo& device : node.devices) labels.insert(DeviceLabel(device));
  std::set<std::string> old_labels;
  for (const DeviceInfo& device : replaced.devices) old_labels.insert(DeviceLabel(device));
  if (!replaced.node_id.empty() && replaced.alive && replaced.instance_id != node.instance_id) {
    // A restarted agent has lost the actors it had: jobs that ran there cannot go on.
    spdlog::warn("node {} came back as a new agent (instance {} -> {})", node.node_id,
                 replaced.instance_id, node.instance_id);
    FailJobsOnNode(node.node_id, "its agent restarted");
  } else if (!busy.empty() && labels != old_labels) {
    // Another device set is new capacity, never merged into a generation placed on the old one.
    spdlog::warn("node {} registered again with another device set", node.node_id);
    FailJobsOnNode(node.node_id, "its agent registered again with another device set");
  } else if (!busy.empty()) {
    // The same agent registering again (a lost reply): its generations keep their devices.
    for (DeviceInfo& device : membership_.Find(node.node_id)->devices) {
      auto held = busy.find(DeviceLabel(device));
      if (held != busy.end()) device.busy_job = held->second;
    }
  } else {
    spdlog::info("node {} registered from {} with {} devices", node.node_id, node.address,
                 node.devices.size());
  }
  auto reply = NewMessage(request_id);
  auto body = reply->payload().initRegisterNodeReply();
  body.setHeartbeatIntervalMs(static_cast<uint32_t>(options_.heartbeat_interval.count()));
  body.setHeartbeatTimeoutMs(static_cast<uint32_t>(options_.heartbeat_timeout.count()));
  body.setCoordinatorInstance(CapText(instance_id_));
  Send(peer, *reply);
  return absl::OkStatus();
}

absl::Status Coordinator::OnHeartbeat(const std::string& peer, uint64_t request_id,
                                      wire::Heartbeat::Reader request) {
  const std::string node_id = Str(request.getNodeId());
  RETURN_IF_ERROR(membership_.Heartbeat(node_id, Str(request.getInstanceId()), clock_->Now()));
  membership_.Find(node_id)->peer = peer;  // the agent may have reconnected
  // Which of the node's actors are stopped: the watchdog names them when a generation hangs.
  std::set<std::string>& stopped = membership_.Find(node_id)->stopped_actors;
  stopped.clear();
  for (auto ref : request.getStoppedActors()) {
    stopped.insert(ActorKey(Str(ref.getJobId()), ref.getGeneration(), ref.getRank()));
  }
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

void Coordinator::OnNodesDead(const std::vector<std::string>& node_ids) {
  for (const auto& node_id : node_ids) {
    const NodeInfo* node = membership_.Find(node_id);
    const double silent = node ? SecondsBetween(node->last_heartbeat, clock_->Now()) : 0;
    spdlog::warn("node {} is dead: no heartbeat for {}", node_id, FormatSeconds(silent));
    metrics_.OnHeartbeatMissed();
    FailJobsOnNode(node_id, "no heartbeat for " + FormatSeconds(silent));
  }
}

void Coordinator::FailJobsOnNode(const std::string& node_id, const std::string& reason) {
  for (auto& [id, job] : jobs_) {
    std::string ranks;
    for (auto& actor : job.actors) {
      // An actor whose exit was never reported went down with its node, even when its
      // generation had already ended for another reason.
      if (actor.node_id != node_id || actor.exited || actor.state == ActorState::kSucceeded ||
          actor.state == ActorState::kLost) {
        continue;
      }
      actor.state = ActorState::kLost;
      actor.detail = "node " + node_id + " lost: " + reason;
      ranks += (ranks.empty() ? "rank " : ", rank ") + std::to_string(actor.rank);
    }
    if (ranks.empty() || job.state != JobState::kRunning) continue;
    Fault fault =
        MakeFault(job, FaultKind::kNodeLost, -1, node_id, "lost " + ranks + " (" + reason + ")");
    if (const NodeInfo* node = membership_.Find(node_id)) {
      fault.unseen_seconds = SecondsBetween(node->last_heartbeat, fault.at);
    }
    OnFault(job, std::move(fault));
  }
}

// ---------------------------------------------------------------------------------------------
// Jobs

absl::Status Coordinator::OnSubmitJob(const std::string& peer, uint64_t request_id,
                                      wire::SubmitJob::Reader request) {
  const std::string yaml = Str(request.getSpecYaml());
  std::string source = Str(request.getSourceName());
  if (source.empty()) source = "job spec";
  // A client that says nothing about its folders (an older one) gets the coordinator's own.
  const std::string here = AbsoluteDir(".");
  const std::string spec_dir =
      request.getSpecDir().size() ? AbsoluteDir(Str(request.getSpecDir())) : here;
  const std::string work_dir =
      request.getWorkDir().size() ? AbsoluteDir(Str(request.getWorkDir())) : here;
  ASSIGN_OR_RETURN(placement::JobSpec spec,
                   placement::ParseJobSpec(yaml, source, placement::PathBase{spec_dir, work_dir}));
  Job job;
  job.id = spec.name + "-" + std::to_string(next_job_number_++);
  job.spec = spec;
  job.spec_yaml = yaml;
  job.spec_dir = spec_dir;
  job.work_dir = work_dir;
  if (spec.kind == placement::JobKind::kTrain) {
    job.train.saving_dir = ResolveUnder(work_dir, spec.train.checkpoint.dir);
  }
  if (spec.parallel_auto) job.auto_max_actors = AutoMaxActors(spec);
  job.backend = std::string(placement::BackendName(placement::ResolveBackend(spec)));
  job.submitted_unix_ms = UnixMillis();
  job.waiting_reason = "waiting for devices";
  if (spec.parallel_auto) {
    spdlog::info("job {} submitted: {} on {} {} devices, parallel: auto", job.id,
                 placement::JobKindName(spec.kind),
                 spec.actors > 0 ? "at most " + std::to_string(spec.actors) : "the free",
                 placement::DeviceKindName(spec.devices));
  } else {
    spdlog::info("job {} submitted: {} on {} {} actors{}", job.id,
                 placement::JobKindName(spec.kind), job.World(),
                 placement::DeviceKindName(spec.devices),
                 spec.kind == placement::JobKind::kTrain ? " (" + PlanSummary(spec) + ")" : "");
  }
  const std::string id = job.id;
  jobs_[id] = std::move(job);
  job_order_.push_back(id);
  Persist(jobs_[id]);
  auto reply = NewMessage(request_id);
  reply->payload().initSubmitJobReply().setJobId(CapText(id));
  Send(peer, *reply);
  TryStartPendingJobs();
  return absl::OkStatus();
}

absl::Status Coordinator::OnCancelJob(const std::string& peer, uint64_t request_id,
                                      wire::CancelJob::Reader request) {
  const std::string id = Str(request.getJobId());
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError("no job '" + id + "'");
  if (!IsFinal(it->second.state)) EndJob(it->second, JobState::kCancelled, "cancelled by user");
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

checkpoint::ResumeRequest Coordinator::StartRequest(const Job& job) const {
  checkpoint::ResumeRequest request = placement::ResumeRequestOf(job.spec.train.checkpoint);
  if (!job.train.committed_here || job.train.saving_dir.empty()) return request;
  // A restart goes on from the job's own newest committed step, whatever the spec resumed from.
  request.dir = job.train.saving_dir;
  request.mode = checkpoint::ResumeMode::kLatest;
  request.path.clear();
  return request;
}

void Coordinator::DecideStart(Job& job) {
  const placement::TrainSpec& spec = job.spec.train;
  const checkpoint::ResumeRequest request = StartRequest(job);
  if (request.dir.empty() && request.mode != checkpoint::ResumeMode::kPath) {
    job.train.start = TrainRecord::Start::kDecided;  // nothing to read: a fresh start
    return;
  }
  job.train.start = TrainRecord::Start::kDeciding;
  job.waiting_reason = "checking its checkpoints (" +
                       (request.mode == checkpoint::ResumeMode::kPath ? request.path : request.dir) +
                       ")";
  const checkpoint::Gpt2Config config = placement::CheckpointConfigOf(spec.model);
  const checkpoint::TrainState train = placement::CheckpointTrainStateOf(spec);
  // Verifying a step reads all of it: off the event loop. The task touches only its copies.
  background_.Post([this, id = job.id, request, config, train]() -> BackgroundWork::Finish {
    absl::StatusOr<checkpoint::ResumePlan> plan =
        checkpoint::PlanResume(checkpoint::DefaultFileSystem(), request, config, train);
    return [this, id, plan = std::move(plan)]() { OnStartDecided(id, plan); };
  });
}

void Coordinator::OnStartDecided(const std::string& job_id,
                                 const absl::StatusOr<checkpoint::ResumePlan>& plan) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  // Cancelled meanwhile, or decided already: nothing to apply.
  if (!job.WantsDevices() || job.train.start != TrainRecord::Start::kDeciding) return;
  if (!plan.ok()) {
    EndJob(job, JobState::kFailed,
           std::string(job.generations.empty() ? "cannot start: " : "cannot restart: ") +
               Text(plan.status().message()));
    return;
  }
  TrainRecord& train = job.train;
  train.start = TrainRecord::Start::kDecided;
  train.resume_manifest = plan->decision.manifest;
  train.resumed_step = plan->decision.step;
  train.skipped = plan->decision.skipped;
  for (const checkpoint::SkippedStep& skipped : train.skipped) {
    spdlog::warn("job {}: skipped checkpoint step {}: {}", job.id, skipped.step, skipped.reason);
  }
  for (const std::string& line : plan->prepared) spdlog::info("job {}: {}", job.id, line);
  if (!train.resume_manifest.empty()) {
    // Where progress stands before the first report: at the step it resumes after.
    train.step = std::max(train.step, train.resumed_step);
    train.last_committed_step = std::max(train.last_committed_step, train.resumed_step);
    spdlog::info("job {}: resumes from step {} ({})", job.id, train.resumed_step,
                 train.resume_manifest);
  }
  if (!job.generations.empty()) {
    // A restart: what the last generation trained past the step this one resumes from is lost.
    GenerationRecord& ended = job.generations.back();
    ended.steps_lost = std::max<int64_t>(0, ended.last_step - train.resumed_step);
    train.step = train.resumed_step;
    train.logged_step = train.resumed_step;
    job.waiting_reason = "restarting after generation " + std::to_string(ended.generation) +
                         ": waiting for devices";
  } else {
    job.waiting_reason = "waiting for devices";
  }
  Persist(job);
}

void Coordinator::TryStartPendingJobs() {
  for (const auto& id : job_order_) {
    Job& job = jobs_[id];
    if (!job.WantsDevices()) continue;
    if (job.spec.kind == placement::JobKind::kTrain &&
        job.train.start != TrainRecord::Start::kDecided) {
      if (job.train.start == TrainRecord::Start::kUndecided) DecideStart(job);
      // A job whose checkpoints are still being read holds no devices: later jobs may start.
      if (job.train.start != TrainRecord::Start::kDecided) continue;
    }
    if (job.spec.kind == placement::JobKind::kTrain && job.spec.parallel_auto) {
      auto planned = PlanAutoJob(job);
      if (planned) {
        StartGeneration(job, *planned);
        continue;
      }
      if (job.state == JobState::kPending) return;  // first come, first served, as below
      continue;                                      // failed: the next job may start
    }
    const DeviceInfo::Kind wanted = DeviceKindOf(job.spec);
    const std::string kind(placement::DeviceKindName(job.spec.devices));
    if (job.Elastic()) {
      // dp follows the devices: the largest layout within min..max that the free ones hold.
      const DeviceCount devices = CountDevices(membership_, wanted);
      auto layout = placement::ElasticLayout(job.spec, devices.free);
      if (!layout.ok()) {
        job.waiting_reason =
            std::string(job.phase == Phase::kRestarting
                            ? "restarting after generation " + std::to_string(job.generation) + ": "
                            : "") +
            WaitingForMore(kind, devices.free, devices.alive, job.spec.elastic.min_actors);
        return;
      }
      job.spec.parallel = *layout;
      job.spec.actors = layout->world();
    }
    // Ranks fill one node's devices before the next: neighbouring ranks (a later TP group)
    // share a node.
    std::vector<std::pair<std::string, int>> placement;
    int alive_total = 0;
    for (auto& [node_id, node] : membership_.mutable_nodes()) {
      if (!node.alive) continue;
      for (size_t d = 0; d < node.devices.size(); ++d) {
        if (node.devices[d].kind != wanted) continue;
        ++alive_total;
        if (node.devices[d].busy_job.empty() &&
            placement.size() < static_cast<size_t>(job.World())) {
          placement.emplace_back(node_id, static_cast<int>(d));
        }
      }
    }
    if (placement.size() < static_cast<size_t>(job.World())) {
      job.waiting_reason = "waiting for " + std::to_string(job.World()) + " free " + kind +
                           " devices (" + std::to_string(placement.size()) + " free of " +
                           std::to_string(alive_total) + " alive)";
      // First come, first served: a later, smaller job does not overtake.
      return;
    }
    StartGeneration(job, placement);
  }
}

std::optional<std::vector<std::pair<std::string, int>>> Coordinator::PlanAutoJob(Job& job) {
  const DeviceInfo::Kind wanted = DeviceKindOf(job.spec);
  const std::string kind(placement::DeviceKindName(job.spec.devices));
  int alive_total = 0;
  for (const auto& node : PlannableNodes(membership_, calibration_, wanted, false, nullptr)) {
    alive_total += node.devices;
  }
  // The plan is made for the devices free now, a job's `actors` capping how many it may take
  // (the first in node order, as fixed layouts fill them).
  std::map<std::string, std::vector<int>> slots;
  std::vector<PlannableNode> free_nodes =
      PlannableNodes(membership_, calibration_, wanted, true, &slots);
  int free_total = 0;
  std::string devices_key;
  for (auto node = free_nodes.begin(); node != free_nodes.end();) {
    if (job.auto_max_actors > 0 && free_total + node->devices > job.auto_max_actors) {
      node->devices = job.auto_max_actors - free_total;
      slots[node->node_id].resize(static_cast<size_t>(std::max(node->devices, 0)));
    }
    if (node->devices <= 0) {
      slots.erase(node->node_id);
      node = free_nodes.erase(node);
      continue;
    }
    free_total += node->devices;
    devices_key += node->node_id + ":" + std::to_string(node->devices) + " ";
    ++node;
  }
  if (free_total == 0) {
    job.waiting_reason = "waiting for free " + kind + " devices to plan on (0 free of " +
                         std::to_string(alive_total) + " alive)";
    return std::nullopt;
  }
  if (job.Elastic() && free_total < job.spec.elastic.min_actors) {
    job.waiting_reason =
        WaitingForMore(kind, free_total, alive_total, job.spec.elastic.min_actors);
    return std::nullopt;
  }
  // The same devices give the same verdict: a job that waits for more is not re-planned on
  // every turn of the event loop.
  if (devices_key == job.plan.failed_on) return std::nullopt;

  const std::string on = std::to_string(free_total) + " free " + kind + " device" +
                         (free_total == 1 ? "" : "s") + " of " + std::to_string(free_nodes.size()) +
                         " node" + (free_nodes.size() == 1 ? "" : "s");
  auto cluster = BuildClusterSpec(options_.cluster_id, free_nodes);
  if (!cluster.ok()) {
    EndJob(job, JobState::kFailed, "cannot plan on the " + on + ": " +
                                       Text(cluster.status().message()));
    return std::nullopt;
  }
  auto report = placement::Plan(placement::PlanRequestForJob(job.spec, *cluster));
  if (!report.ok()) {
    const std::string why = "no plan fits the " + on + ": " + Text(report.status().message());
    // Out of memory on what is free now, while other devices are busy: once they free, a plan
    // over more devices may fit, so the job waits for them (first come, first served, like a
    // fixed layout waiting for its devices). On every device it could ever get, it fails.
    const bool more_may_free =
        free_total < alive_total && (job.auto_max_actors == 0 || free_total < job.auto_max_actors);
    if (report.status().code() == absl::StatusCode::kResourceExhausted && more_may_free) {
      job.plan.failed_on = devices_key;
      job.waiting_reason = why + "; waiting for busy devices to free";
      spdlog::info("job {}: {}", job.id, job.waiting_reason);
      return std::nullopt;
    }
    EndJob(job, JobState::kFailed, why);
    return std::nullopt;
  }
  const placement::PlannedLayout& best = report->best;
  if (auto status = placement::ApplyPlannedLayout(job.spec, best.parallel); !status.ok()) {
    EndJob(job, JobState::kFailed,
           "the planner's layout cannot run: " + Text(status.message()));
    return std::nullopt;
  }
  job.plan.planned = true;  // from here on the job's world is the plan's
  // Ranks go where the plan put them: its device d of a node is that node's d-th free device.
  std::vector<std::pair<std::string, int>> placement;
  std::set<std::pair<std::string, int>> taken;
  bool honoured = best.devices.size() == static_cast<size_t>(job.World());
  for (size_t rank = 0; honoured && rank < best.devices.size(); ++rank) {
    const placement::DevicePlace& place = best.devices[rank];
    auto node = slots.find(place.node_id);
    if (node == slots.end() || place.device < 0 ||
        static_cast<size_t>(place.device) >= node->second.size()) {
      honoured = false;
      break;
    }
    const std::pair<std::string, int> slot(place.node_id, node->second[place.device]);
    honoured = taken.insert(slot).second;
    placement.push_back(slot);
  }
  if (!honoured) {
    // Not expected of the planner; the job still runs, on the free devices in node order.
    spdlog::warn("job {}: the plan's rank → device map does not match the free devices; ranks "
                 "fill the nodes in order instead",
                 job.id);
    placement.clear();
    for (const auto& [node_id, node_slots] : slots) {
      for (int slot : node_slots) {
        if (placement.size() < static_cast<size_t>(job.World())) {
          placement.emplace_back(node_id, slot);
        }
      }
    }
  }
  std::set<std::string> nodes_used;
  for (const auto& [node_id, slot] : placement) nodes_used.insert(node_id);
  std::ostringstream summary;
  summary << job.World() << " of " << free_total << " free " << kind << " devices on "
          << nodes_used.size() << " node" << (nodes_used.size() == 1 ? "" : "s") << ", "
          << best.mapping << ", " << report->feasible << " of " << report->candidates
          << " candidates fit, planned in "
          << std::to_string(static_cast<int64_t>(std::ceil(report->planning_seconds * 1e3)))
          << " ms";
  job.plan.step_seconds = best.time.total;
  job.plan.memory_bytes = best.memory.total();
  job.plan.summary = summary.str();
  job.plan.failed_on.clear();
  spdlog::info("job {}: planned {} ({}): predicted {:.4f} s per step, {} per device\n{}", job.id,
               PlanSummary(job.spec), job.plan.summary, best.time.total,
               placement::FormatApproxByteSize(static_cast<double>(best.memory.total())),
               placement::FormatPlan(*report, false));
  return placement;
}

void Coordinator::PredictLayout(Job& job) {
  const DeviceInfo::Kind wanted = DeviceKindOf(job.spec);
  std::map<std::string, int> placed;  // devices per node
  for (const ActorRecord& actor : job.actors) ++placed[actor.node_id];
  std::vector<PlannableNode> nodes;
  for (PlannableNode& node : PlannableNodes(membership_, calibration_, wanted, false, nullptr)) {
    auto it = placed.find(node.node_id);
    if (it == placed.end()) continue;
    node.devices = it->second;
    nodes.push_back(std::move(node));
  }
  auto cluster = BuildClusterSpec(options_.cluster_id, nodes);
  absl::StatusOr<placement::PlanReport> report =
      cluster.ok() ? placement::Plan(placement::PlanRequestForLayout(job.spec, *cluster))
                   : absl::StatusOr<placement::PlanReport>(cluster.status());
  if (!report.ok()) {
    // The layout is the user's (or was planned on other numbers) and the trainer is the judge of
    // whether it runs; only the prediction is missing.
    spdlog::warn("job {}: no prediction for {}: {}", job.id, PlanSummary(job.spec),
                 Text(report.status().message()));
    job.plan.step_seconds = 0;
    job.plan.memory_bytes = 0;
    return;
  }
  job.plan.step_seconds = report->best.time.total;
  job.plan.memory_bytes = report->best.memory.total();
  const placement::StepTime& t = report->best.time;
  spdlog::info("job {}: {} predicted at {:.4f} s per step (compute {:.4f}, tp {:.4f}, pp {:.4f}, "
               "bubble {:.4f}, dp {:.4f}, optimizer {:.4f}), {} per device{}",
               job.id, PlanSummary(job.spec), t.total, t.compute, t.tp, t.pp, t.bubble, t.dp,
               t.optimizer,
               placement::FormatApproxByteSize(static_cast<double>(job.plan.memory_bytes)),
               job.PredictionCalibrated() ? ", with its ranks' own calibration" : "");
}

void Coordinator::StartGeneration(Job& job,
                                  const std::vector<std::pair<std::string, int>>& placement) {
  // The communicator groups first: nothing is spawned for a layout that cannot be cut.
  std::vector<GroupRecord> groups;
  if (job.spec.kind == placement::JobKind::kTrain) {
    const auto& parallel = job.spec.parallel;
    auto grid = placement::RankGrid::Create(parallel.tp, parallel.pp, parallel.dp);
    if (grid.ok() && static_cast<size_t>(grid->world()) != placement.size()) {
      grid = absl::InternalError("the layout has " + std::to_string(grid->world()) +
                                 " ranks but " + std::to_string(placement.size()) +
                                 " devices were placed");
    }
    if (!grid.ok()) {
      EndJob(job, JobState::kFailed, "cannot lay out " + PlanSummary(job.spec) + ": " +
                                         Text(grid.status().message()));
      return;
    }
    // Every group of every kind, a group of one rank included: the actors bootstrap each group
    // they are in, and the deadline names the missing ranks group by group.
    for (auto& group : grid->AllGroups()) {
      GroupRecord record;
      record.kind = group.kind;
      record.id = group.id;
      record.ranks = std::move(group.ranks);
      groups.push_back(std::move(record));
    }
  } else {
    GroupRecord world;
    world.kind = world.id = "world";
    for (size_t rank = 0; rank < placement.size(); ++rank) {
      world.ranks.push_back(static_cast<int>(rank));
    }
    groups.push_back(std::move(world));
  }
  const TimePoint now = clock_->Now();
  job.generation += 1;
  job.state = JobState::kRunning;
  job.phase = Phase::kSpawning;
  job.waiting_reason.clear();
  job.generation_started = now;
  job.bootstrap_deadline = now + job.spec.bootstrap_timeout;
  job.run_deadline = now + job.spec.run_timeout;
  job.actors.clear();
  job.groups = std::move(groups);
  job.plan.calibrated_ranks.clear();
  job.faults.clear();
  job.error.clear();  // a restart's cause stays in its generation's record
  job.watchdog = ProgressWatchdog(WatchdogFloor(job));
  GenerationRecord record;
  record.generation = job.generation;
  record.started_unix_ms = UnixMillis();
  record.world = static_cast<int>(placement.size());
  record.plan = job.spec.kind == placement::JobKind::kTrain
                    ? PlanSummary(job.spec) + " on " + std::to_string(placement.size()) + " actors"
                    : std::to_string(placement.size()) + " actors";
  record.resumed_step = job.train.resumed_step;
  record.last_step = job.train.resumed_step;
  job.generations.push_back(std::move(record));
  // A new generation reports its steps and saves its shards afresh; what was committed stays.
  job.train.first_step = -1;
  job.train.recent.clear();
  job.train.saving.clear();
  std::map<std::string, std::vector<int>> ranks_by_node;
  for (size_t rank = 0; rank < placement.size(); ++rank) {
    const auto& [node_id, device_slot] = placement[rank];
    NodeInfo* node = membership_.Find(node_id);
    node->devices[device_slot].busy_job = job.id;
    ActorRecord actor;
    actor.rank = static_cast<int>(rank);
    actor.node_id = node_id;
    actor.device = node->devices[device_slot];
    job.actors.push_back(actor);
    ranks_by_node[node_id].push_back(static_cast<int>(rank));
  }
  if (job.spec.kind == placement::JobKind::kTrain) PredictLayout(job);
  for (const auto& [node_id, ranks] : ranks_by_node) {
    NodeInfo* node = membership_.Find(node_id);
    auto message = NewMessage(0);
    auto spawn = message->payload().initSpawnActors();
    spawn.setJobId(CapText(job.id));
    spawn.setGeneration(job.generation);
    auto list = spawn.initActors(static_cast<unsigned>(ranks.size()));
    for (size_t i = 0; i < ranks.size(); ++i) {
      list[i].setRank(static_cast<uint32_t>(ranks[i]));
      FillDevice(list[i].initDevice(), job.actors[ranks[i]].device);
    }
    Send(node->peer, *message);
  }
  spdlog::info("job {} generation {}: spawning {} actors on {} nodes", job.id, job.generation,
               placement.size(), ranks_by_node.size());
  Persist(job);
}

absl::StatusOr<ActorRecord*> Coordinator::FindActor(const std::string& job_id, uint32_t generation,
                                                    uint32_t rank) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError("no job '" + job_id + "'");
  Job& job = it->second;
  if (job.state != JobState::kRunning) {
    return absl::FailedPreconditionError("job " + job_id + " is " +
                                         std::string(JobStateName(job.state)));
  }
  if (generation != job.generation) {
    return absl::FailedPreconditionError("job " + job_id + " is at generation " +
                                         std::to_string(job.generation) + ", not " +
                                         std::to_string(generation));
  }
  if (!job.GenerationLive()) {
    // Fenced: nothing an aborted generation sends (a late save, a step) is acted on.
    return absl::FailedPreconditionError("generation " + std::to_string(generation) + " of job " +
                                         job_id + " was aborted");
  }
  if (rank >= job.actors.size()) {
    return absl::OutOfRangeError("job " + job_id + " has no rank " + std::to_string(rank) +
                                 " (world size " + std::to_string(job.actors.size()) + ")");
  }
  return &job.actors[rank];
}

absl::Status Coordinator::OnRegisterActor(const std::string& peer, uint64_t request_id,
                                          wire::RegisterActor::Reader request) {
  const std::string job_id = Str(request.getJobId());
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, request.getGeneration(), request.getRank()));
  if (Str(request.getNodeId()) != actor->node_id) {
    return absl::PermissionDeniedError("rank " + std::to_string(actor->rank) +
                                       " belongs on node " + actor->node_id + ", not " +
                                       Str(request.getNodeId()));
  }
  if (actor->state != ActorState::kSpawning) {
    return absl::AlreadyExistsError("rank " + std::to_string(actor->rank) +
                                    " is already registered");
  }
  Job& job = jobs_[job_id];
  actor->state = ActorState::kRegistered;
  actor->peer = peer;
  actor->pid = request.getPid();
  actor->address = Str(request.getAddress());
  actor->metrics_address = Str(request.getMetricsAddress());
  if (job.phase == Phase::kSpawning) job.phase = Phase::kBootstrapping;

  auto reply = NewMessage(request_id);
  auto assignment = reply->payload().initAssignment();
  assignment.setJobId(CapText(job.id));
  assignment.setGeneration(job.generation);
  assignment.setRank(static_cast<uint32_t>(actor->rank));
  assignment.setWorldSize(static_cast<uint32_t>(job.actors.size()));
  assignment.setKind(CapText(std::string(placement::JobKindName(job.spec.kind))));
  assignment.setSpecYaml(CapText(job.spec_yaml));
  assignment.setBackend(CapText(job.backend));
  FillDevice(assignment.initDevice(), actor->device);
  assignment.setStorePrefix(CapText(job.StorePrefix()));
  assignment.setSpecDir(CapText(job.spec_dir));
  assignment.setWorkDir(CapText(job.work_dir));
  if (job.spec.kind == placement::JobKind::kTrain) {
    // The layout the ranks run: for `parallel: auto` the planner's, which the spec does not say.
    const placement::ParallelSpec& parallel = job.spec.parallel;
    auto layout = assignment.initParallel();
    layout.setTp(static_cast<uint32_t>(parallel.tp));
    layout.setPp(static_cast<uint32_t>(parallel.pp));
    layout.setDp(static_cast<uint32_t>(parallel.dp));
    layout.setZero(static_cast<uint32_t>(parallel.zero));
    layout.setMicroBatch(static_cast<uint64_t>(parallel.micro_batch));
    auto stages = layout.initStageLayers(static_cast<unsigned>(parallel.stage_layers.size()));
    for (size_t i = 0; i < parallel.stage_layers.size(); ++i) {
      stages.set(static_cast<unsigned>(i), static_cast<uint32_t>(parallel.stage_layers[i]));
    }
    assignment.setResumeManifest(CapText(job.train.resume_manifest));
    assignment.setCalibrate(job.generations.size() <= 1);
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(job.bootstrap_deadline -
                                                                          clock_->Now());
  assignment.setBootstrapTimeoutMs(static_cast<uint32_t>(std::max<int64_t>(left.count(), 1)));
  auto groups = assignment.initGroups(static_cast<unsigned>(job.groups.size()));
  for (size_t g = 0; g < job.groups.size(); ++g) {
    groups[g].setKind(CapText(job.groups[g].kind));
    groups[g].setId(CapText(job.groups[g].id));
    auto ranks = groups[g].initRanks(static_cast<unsigned>(job.groups[g].ranks.size()));
    for (size_t r = 0; r < job.groups[g].ranks.size(); ++r) {
      ranks.set(static_cast<unsigned>(r), static_cast<uint32_t>(job.groups[g].ranks[r]));
    }
  }
  Send(peer, *reply);
  return absl::OkStatus();
}

absl::Status Coordinator::OnKvRequest(const std::string& peer, uint64_t request_id,
                                      const std::string& sender,
                                      wire::KvRequest::Reader request) {
  const std::string key = Str(request.getKey());
  if (key.empty()) return absl::InvalidArgumentError("kv: empty key");
  // An actor's keys live under its generation's prefix while that generation runs: an aborted
  // generation's late writes and waits are refused (fencing).
  if (sender.rfind("actor/", 0) == 0) {
    const std::vector<std::string> parts = absl::StrSplit(sender, '/');
    auto job = parts.size() == 4 ? jobs_.find(parts[1]) : jobs_.end();
    if (job == jobs_.end() || !job->second.GenerationLive() ||
        std::to_string(job->second.generation) != parts[2]) {
      return absl::FailedPreconditionError("kv: " + sender + " is not an actor of a running "
                                           "generation");
    }
    if (key.rfind(job->second.StorePrefix() + "/", 0) != 0) {
      return absl::PermissionDeniedError("kv: key '" + key + "' is outside " +
                                         job->second.StorePrefix());
    }
  }
  switch (request.getOp()) {
    case wire::KvOp::SET: {
      metrics_.OnKvOperation("set");
      for (const auto& waiting : kv_.Set(key, Str(request.getValue()))) {
        auto reply = NewMessage(waiting.request_id);
        reply->payload().initKvReply().setValue(protocol::AsData(*kv_.Get(key)));
        Send(waiting.peer, *reply);
      }
      ReplyAck(peer, request_id);
      return absl::OkStatus();
    }
    case wire::KvOp::GET: {
      metrics_.OnKvOperation("get");
      if (auto value = kv_.Get(key)) {
        auto reply = NewMessage(request_id);
        reply->payload().initKvReply().setValue(protocol::AsData(*value));
        Send(peer, *reply);
      } else {
        // A peer cannot park a request for longer than any bootstrap may take.
        const auto wait = std::min(std::chrono::milliseconds(request.getWaitMs()), kMaxKvWait);
        kv_.Park({key, peer, request_id, sender, clock_->Now() + wait});
      }
      return absl::OkStatus();
    }
    case wire::KvOp::ADD: {
      metrics_.OnKvOperation("add");
      ASSIGN_OR_RETURN(int64_t value, kv_.Add(key, request.getDelta()));
      auto reply = NewMessage(request_id);
      reply->payload().initKvReply().setNumber(value);
      Send(peer, *reply);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("kv: unknown operation " +
                                    std::to_string(static_cast<int>(request.getOp())));
}

absl::StatusOr<Coordinator::GroupMember> Coordinator::FindGroupMember(const std::string& job_id,
                                                                     uint32_t generation,
                                                                     uint32_t rank,
                                                                     const std::string& group_id) {
  ASSIGN_OR_RETURN(ActorRecord * actor, FindActor(job_id, generation, rank));
  Job& job = jobs_[job_id];
  auto group = std::find_if(job.groups.begin(), job.groups.end(),
                            [&](const GroupRecord& g) { return g.id == group_id; });
  if (group == job.groups.end()) {
    return absl::NotFoundError("job " + job_id + " has no group '" + group_id + "'");
  }
  if (std::find(group->ranks.begin(), group->ranks.end(), actor->rank) == group->ranks.end()) {
    return absl::PermissionDeniedError("rank " + std::to_string(rank) + " is not a member of group " +
                                       group_id);
  }
  return GroupMember{&job, actor, &*group};
}

absl::Status Coordinator::OnCommJoin(const std::string& peer, uint64_t request_id,
                                     wire::CommJoin::Reader report) {
  ASSIGN_OR_RETURN(GroupMember member,
                   FindGroupMember(Str(report.getJobId()), report.getGeneration(),
                                   report.getRank(), Str(report.getGroupId())));
  member.group->joined.insert(member.actor->rank);
  if (member.actor->state == ActorState::kRegistered) {
    member.actor->state = ActorState::kBootstrapping;
  }
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

absl::Status Coordinator::OnCommReady(const std::string& peer, uint64_t request_id,
                                      wire::CommReady::Reader report) {
  ASSIGN_OR_RETURN(GroupMember member,
                   FindGroupMember(Str(report.getJobId()), report.getGeneration(),
                                   report.getRank(), Str(report.getGroupId())));
  Job& job = *member.job;
  ActorRecord* actor = member.actor;
  GroupRecord* group = member.group;
  group->ready.insert(actor->rank);
  if (group->ready.size() == group->ranks.size()) {
    group->bootstrap_seconds = SecondsBetween(job.generation_started, clock_->Now());
    metrics_.ObserveBootstrap(group->kind, group->bootstrap_seconds);
    spdlog::info("job {} generation {}: group {} ready in {:.3f} s", job.id, job.generation,
                 group->id, group->bootstrap_seconds);
  }
  // An actor is ready once every group it belongs to is.
  bool actor_ready = true;
  for (const auto& g : job.groups) {
    if (std::find(g.ranks.begin(), g.ranks.end(), actor->rank) != g.ranks.end() &&
        !g.ready.count(actor->rank)) {
      actor_ready = false;
    }
  }
  if (actor_ready && actor->state == ActorState::kBootstrapping) {
    actor->state = ActorState::kRunning;
  }
  const bool all_ready = std::all_of(job.groups.begin(), job.groups.end(), [](const auto& g) {
    return g.ready.size() == g.ranks.size();
  });
  if (all_ready && job.phase != Phase::kRunning) {
    job.phase = Phase::kRunning;
    if (job.spec.kind == placement::JobKind::kTrain) job.watchdog.Arm(clock_->Now());
    spdlog::info("job {} generation {}: all communicators ready", job.id, job.generation);
  }
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

absl::Status Coordinator::OnCommFailed(const std::string& peer, uint64_t request_id,
                                       wire::CommFailed::Reader report) {
  const std::string job_id = Str(report.getJobId());
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, report.getGeneration(), report.getRank()));
  actor->state = ActorState::kFailed;
  actor->detail = Str(report.getMessage());
  ReplyAck(peer, request_id);
  Job& job = jobs_[job_id];
  OnFault(job, MakeFault(job, FaultKind::kCommError, actor->rank, actor->node_id,
                         "could not join group " + Str(report.getGroupId()) + ": " +
                             actor->detail));
  return absl::OkStatus();
}

absl::Status Coordinator::OnStepReport(const std::string& peer, uint64_t request_id,
                                       wire::StepReport::Reader report) {
  const std::string job_id = Str(report.getJobId());
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, report.getGeneration(), report.getRank()));
  Job& job = jobs_[job_id];
  if (job.spec.kind == placement::JobKind::kTrain) RecordStep(job, actor->rank, report);
  for (auto r : report.getResults()) {
    CollectiveResultRecord result;
    result.op = Str(r.getOp());
    result.bytes = r.getBytes();
    result.ranks = r.getRanks();
    result.seconds = r.getSeconds();
    result.algorithm_gbps = r.getAlgorithmGBps();
    result.bus_gbps = r.getBusGBps();
    result.ok = r.getOk();
    result.detail = Str(r.getDetail());
    job.results.push_back(std::move(result));
  }
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

void Coordinator::RecordStep(Job& job, int rank, wire::StepReport::Reader report) {
  TrainRecord& progress = job.train;
  const auto step = static_cast<int64_t>(std::min<uint64_t>(report.getStep(), kMaxDimension));
  if (progress.recent.size() >= kRecentSteps && step < progress.recent.begin()->first) return;
  StepAggregate& aggregate = progress.recent[step];
  aggregate.ranks.insert(rank);
  // Only the last pipeline stage computes the loss; the others report NaN. Rank world-1 is on
  // it; another rank's loss stands in until that one's arrives.
  const bool last_rank = rank == job.World() - 1;
  if (!std::isnan(report.getLoss()) && (last_rank || !aggregate.loss_from_last_rank)) {
    aggregate.loss = report.getLoss();
    aggregate.loss_from_last_rank = last_rank;
  }
  // A step takes as long as its slowest rank: show that rank's split and throughput.
  const double seconds = report.getComputeSeconds() + report.getCommSeconds() +
                         report.getBubbleSeconds();
  if (seconds > aggregate.slowest_seconds) {
    aggregate.slowest_seconds = seconds;
    aggregate.tokens_per_second = report.getTokensPerSecond();
    aggregate.compute_seconds = report.getComputeSeconds();
    aggregate.comm_seconds = report.getCommSeconds();
    aggregate.bubble_seconds = report.getBubbleSeconds();
  }
  while (progress.recent.size() > kRecentSteps) progress.recent.erase(progress.recent.begin());
  const TimePoint now = clock_->Now();
  job.watchdog.OnStep(step, now);
  if (!job.generations.empty()) {
    GenerationRecord& current = job.generations.back();
    current.last_step = std::max(current.last_step, step);
  }
  if (job.recovering_since && job.generations.size() >= 2) {
    // The restarted job's first new step: the recovery is over.
    GenerationRecord& ended = job.generations[job.generations.size() - 2];
    ended.recovery_seconds = SecondsBetween(*job.recovering_since, now);
    job.recovering_since.reset();
    const std::string cause(ended.cause ? FaultKindName(ended.cause->kind) : "other");
    metrics_.OnRecovered(cause, ended.recovery_seconds, ended.steps_lost);
    spdlog::info("job {} generation {}: first step {} {:.3f} s after the fault ({} steps lost)",
                 job.id, job.generation, step, ended.recovery_seconds, ended.steps_lost);
    Persist(job);
  }
  if (step < progress.step && progress.first_step >= 0) return;
  if (progress.first_step < 0) {
    progress.first_step = step;
    progress.first_report = now;
  }
  if (step > progress.step || progress.first_step == step) {
    progress.last_report = now;  // when the step was first seen: the rate behind the ETA
  }
  progress.step = step;
  if (report.getLogged()) progress.logged_step = std::max(progress.logged_step, step);
  if (!std::isnan(aggregate.loss)) progress.loss = aggregate.loss;
  progress.tokens_per_second = aggregate.tokens_per_second;
  progress.compute_seconds = aggregate.compute_seconds;
  progress.comm_seconds = aggregate.comm_seconds;
  progress.bubble_seconds = aggregate.bubble_seconds;
}

absl::Status Coordinator::OnShardSaved(const std::string& peer, uint64_t request_id,
                                       wire::ShardSaved::Reader report) {
  const std::string job_id = Str(report.getJobId());
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, report.getGeneration(), report.getRank()));
  Job& job = jobs_[job_id];
  TrainRecord& train = job.train;
  const std::string where = "job " + job_id + ", rank " + std::to_string(actor->rank) + ", step " +
                            std::to_string(report.getStep());
  if (job.spec.kind != placement::JobKind::kTrain) {
    return absl::FailedPreconditionError(where + ": a " +
                                         std::string(placement::JobKindName(job.spec.kind)) +
                                         " job saves no checkpoints");
  }
  if (train.saving_dir.empty()) {
    return absl::FailedPreconditionError(where + ": the job's spec has no checkpoint.dir");
  }
  if (report.getStep() > static_cast<uint64_t>(job.spec.train.steps)) {
    return absl::InvalidArgumentError(where + ": the job has only " +
                                      std::to_string(job.spec.train.steps) + " steps");
  }
  const auto step = static_cast<int64_t>(report.getStep());
  if (step <= train.last_committed_step) {
    return absl::FailedPreconditionError(where + ": step " +
                                         std::to_string(train.last_committed_step) +
                                         " is already committed; only later steps can be saved");
  }
  // The coordinator writes into the folder the spec names, never one a message chose.
  const std::string expected_dir = checkpoint::StepDir(train.saving_dir, step);
  if (const std::string dir = ResolveUnder(job.work_dir, Str(report.getDir())); dir != expected_dir) {
    return absl::InvalidArgumentError(where + ": saved into " + dir + ", but the step's folder is " +
                                      expected_dir);
  }
  checkpoint::SavedShard shard;
  shard.rank = actor->rank;
  shard.file = Str(report.getFile());
  shard.bytes = report.getFileBytes();
  shard.xxh3 = report.getFileXxh3();
  for (auto tensor : report.getTensors()) {
    checkpoint::SavedPiece piece;
    piece.name = Str(tensor.getName());
    piece.tensor = tensor.getTensor().size() ? Str(tensor.getTensor()) : piece.name;
    const std::string dtype = Str(tensor.getDtype());
    const std::optional<checkpoint::SafetensorsDType> parsed = checkpoint::ParseDType(dtype);
    if (!parsed) {
      return absl::InvalidArgumentError(where + ": tensor '" + piece.name + "': unknown dtype \"" +
                                        dtype + "\"");
    }
    piece.dtype = *parsed;
    piece.xxh3 = tensor.getXxh3();
    const auto read = [&](capnp::List<uint64_t>::Reader in, std::vector<int64_t>& out,
                          const char* what) -> absl::Status {
      for (uint64_t v : in) {
        if (v >= kMaxDimension) {
          return absl::InvalidArgumentError(where + ": tensor '" + piece.name + "': " + what +
                                            " value " + std::to_string(v) + " is too large");
        }
        out.push_back(static_cast<int64_t>(v));
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(read(tensor.getGlobalShape(), piece.global_shape, "global shape"));
    RETURN_IF_ERROR(read(tensor.getOffsets(), piece.offsets, "offset"));
    RETURN_IF_ERROR(read(tensor.getShape(), piece.shape, "shape"));
    shard.pieces.push_back(std::move(piece));
  }
  checkpoint::DataIdentity data = train.data;
  data.tokens = static_cast<int64_t>(std::min<uint64_t>(report.getDataTokens(), kMaxDimension));
  data.xxh3 = report.getDataXxh3();
  if (train.data.tokens != 0 && (data.tokens != train.data.tokens || data.xxh3 != train.data.xxh3)) {
    // The ranks do not train on the same data: no step of this job is one model's state.
    const std::string error = where + ": the rank trains on " + std::to_string(data.tokens) +
                              " tokens (checksum " + checkpoint::ChecksumHex(data.xxh3) +
                              "), other ranks on " + std::to_string(train.data.tokens) +
                              " (checksum " + checkpoint::ChecksumHex(train.data.xxh3) + ")";
    EndJob(job, JobState::kFailed, error);
    return absl::FailedPreconditionError(error);
  }
  checkpoint::StepAssembly& assembly = train.saving[step];
  if (auto status = assembly.Add(std::move(shard)); !status.ok()) {
    if (assembly.size() == 0) train.saving.erase(step);
    return Annotate(status, "job " + job_id + ", step " + std::to_string(step));
  }
  train.data = data;
  if (assembly.size() < job.actors.size()) {
    ReplyAck(peer, request_id);
    return absl::OkStatus();
  }
  // Every rank saved the step: commit it.
  RETURN_IF_ERROR(CommitStep(job, step));
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

absl::Status Coordinator::OnCalibration(const std::string& peer, uint64_t request_id,
                                        wire::Calibration::Reader report) {
  const std::string job_id = Str(report.getJobId());
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, report.getGeneration(), report.getRank()));
  Job& job = jobs_[job_id];
  const std::string where = "job " + job_id + ", rank " + std::to_string(actor->rank);
  if (Str(report.getNodeId()) != actor->node_id) {
    return absl::PermissionDeniedError(where + " runs on node " + actor->node_id + ", not " +
                                       Str(report.getNodeId()));
  }
  const auto valid = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!valid(report.getComputeFlops()) || !valid(report.getComputeHalfDim()) ||
      !valid(report.getOptimizerBytesPerSecond())) {
    return absl::InvalidArgumentError(
        where + ": the layer and optimizer rates must be finite and ≥ 0, got " +
        std::to_string(report.getComputeFlops()) + " FLOP/s, half at " +
        std::to_string(report.getComputeHalfDim()) + ", optimizer " +
        std::to_string(report.getOptimizerBytesPerSecond()) + " B/s");
  }
  // Check the whole report before recording any of it.
  std::vector<std::pair<const GroupRecord*, wire::GroupBandwidth::Reader>> groups;
  for (auto measured : report.getGroups()) {
    const std::string group_id = Str(measured.getGroupId());
    auto group = std::find_if(job.groups.begin(), job.groups.end(),
                              [&](const GroupRecord& g) { return g.id == group_id; });
    if (group == job.groups.end() ||
        std::find(group->ranks.begin(), group->ranks.end(), actor->rank) == group->ranks.end()) {
      return absl::InvalidArgumentError(where + " is not a member of a group '" + group_id + "'");
    }
    if (!valid(measured.getBusBytesPerSecond()) || !valid(measured.getLatencySeconds())) {
      return absl::InvalidArgumentError(where + ", group " + group_id +
                                        ": bandwidth and latency must be finite and ≥ 0");
    }
    groups.emplace_back(&*group, measured);
  }
  const int64_t now = UnixMillis();
  // The coordinator's own record says which device and which nodes were measured, not the report.
  calibration_.RecordCompute(actor->node_id, DeviceLabel(actor->device),
                             ComputeRate{report.getComputeFlops(), report.getComputeHalfDim(),
                                         report.getOptimizerBytesPerSecond()},
                             job_id, now);
  const std::string source = job_id + "/" + std::to_string(job.generation);
  for (const auto& [group, measured] : groups) {
    std::vector<std::string> rank_nodes;
    for (int rank : group->ranks) rank_nodes.push_back(job.actors[rank].node_id);
    calibration_.RecordGroup(rank_nodes, measured.getBusBytesPerSecond(),
                             measured.getLatencySeconds(), source, job_id, now);
  }
  spdlog::debug("{}: calibration {:.3g} FLOP/s, {} groups", where, report.getComputeFlops(),
                groups.size());
  // Once every rank has measured, the job's own numbers price its layout.
  const bool first_from_rank = job.plan.calibrated_ranks.insert(actor->rank).second;
  if (first_from_rank && job.PredictionCalibrated()) PredictLayout(job);
  ReplyAck(peer, request_id);
  return absl::OkStatus();
}

absl::Status Coordinator::CommitStep(Job& job, int64_t step) {
  TrainRecord& train = job.train;
  const checkpoint::StepAssembly assembly = std::move(train.saving[step]);
  train.saving.erase(step);
  const placement::TrainSpec& spec = job.spec.train;
  const checkpoint::StepHeader header =
      placement::CheckpointStepHeader(spec, job.spec.parallel, step, job.World(), train.data);
  checkpoint::FileSystem& fs = checkpoint::DefaultFileSystem();
  auto manifest = assembly.Build(header);
  absl::Status status = manifest.status();
  if (status.ok()) status = checkpoint::CommitStep(fs, train.saving_dir, *manifest);
  if (!status.ok()) {
    // The ranks' shards do not make a checkpoint (or it cannot be written): going on would
    // train on with nothing to resume from.
    const std::string error = "checkpoint step " + std::to_string(step) +
                              " could not be committed: " + Text(status.message());
    EndJob(job, JobState::kFailed, error);
    return absl::Status(status.code(), error);
  }
  train.last_committed_step = std::max(train.last_committed_step, step);
  train.committed_here = true;
  spdlog::info("job {} generation {}: committed checkpoint step {} of {} ranks in {}", job.id,
               job.generation, step, assembly.size(), train.saving_dir);
  // Retention keeps the step this generation resumed from while it runs.
  const int64_t protect[] = {train.resumed_step};
  auto removed = checkpoint::ApplyRetention(fs, train.saving_dir, spec.checkpoint.keep, protect);
  if (!removed.ok()) {
    spdlog::warn("job {}: pruning old checkpoint steps: {}", job.id, Text(removed.status().message()));
  } else {
    for (const std::string& folder : *removed) spdlog::info("job {}: removed {}", job.id, folder);
  }
  Persist(job);
  MaybeGrow(job);
  return absl::OkStatus();
}

absl::Status Coordinator::OnActorDone(const std::string& peer, uint64_t request_id,
                                      wire::ActorDone::Reader report) {
  const std::string job_id = Str(report.getJobId());
  if (auto it = jobs_.find(job_id); it != jobs_.end() && it->second.phase == Phase::kAborting &&
                                    it->second.generation == report.getGeneration() &&
                                    report.getRank() < it->second.actors.size() &&
                                    !report.getOk()) {
    // A rank of an aborted generation failing: part of the cascade, kept for the record.
    Job& job = it->second;
    ActorRecord& actor = job.actors[report.getRank()];
    actor.state = ActorState::kFailed;
    actor.detail = Str(report.getMessage());
    ReplyAck(peer, request_id);
    OnFault(job, MakeFault(job, FaultKind::kAborted, actor.rank, actor.node_id,
                           "failed: " + actor.detail));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(ActorRecord * actor,
                   FindActor(job_id, report.getGeneration(), report.getRank()));
  Job& job = jobs_[job_id];
  ReplyAck(peer, request_id);
  if (report.getOk()) {
    actor->state = ActorState::kSucceeded;
    actor->detail = Str(report.getMessage());
    MaybeFinishJob(job);
  } else {
    actor->state = ActorState::kFailed;
    actor->detail = Str(report.getMessage());
    const auto code = static_cast<absl::StatusCode>(report.getErrorCode());
    const bool communicator = code == absl::StatusCode::kUnavailable ||
                              code == absl::StatusCode::kDeadlineExceeded ||
                              code == absl::StatusCode::kAborted;
    OnFault(job, MakeFault(job, communicator ? FaultKind::kCommError : FaultKind::kActorError,
                           actor->rank, actor->node_id, "failed: " + actor->detail));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::OnActorExited(const std::string& peer, uint64_t request_id,
                                        wire::ActorExited::Reader report) {
  ReplyAck(peer, request_id);
  const std::string job_id = Str(report.getJobId());
  const std::string how = Str(report.getDescription());
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.generation != report.getGeneration() ||
      report.getRank() >= it->second.actors.size()) {
    return absl::OkStatus();  // an actor of a generation already ended: nothing to do
  }
  Job& job = it->second;
  ActorRecord& actor = job.actors[report.getRank()];
  actor.exited = true;
  if (job.state != JobState::kRunning) return absl::OkStatus();
  const bool clean = !report.getSignaled() && report.getCode() == 0;
  if (actor.state == ActorState::kSucceeded && clean) return absl::OkStatus();
  // An actor that reported its own failure exits after it: that report was the fault.
  const bool reported = actor.state == ActorState::kFailed;
  actor.state = ActorState::kFailed;
  if (reported) return absl::OkStatus();
  actor.detail = "exited: " + how;
  // Only the agent knows whether it killed the actor: an exit that reaches us after the abort
  // began may still be the fault that set it off (a killed rank's peers often report first).
  const bool aborted = report.getKilledByAgent();
  OnFault(job, MakeFault(job, aborted ? FaultKind::kAborted : FaultKind::kActorExit, actor.rank,
                         actor.node_id,
                         (aborted ? "was stopped by the abort: " : "") + how +
                             (clean ? " before reporting its result" : "")));
  return absl::OkStatus();
}

void Coordinator::MaybeFinishJob(Job& job) {
  const bool all_done = std::all_of(job.actors.begin(), job.actors.end(), [](const auto& a) {
    return a.state == ActorState::kSucceeded;
  });
  if (!all_done) return;
  const bool all_ok = std::all_of(job.results.begin(), job.results.end(),
                                  [](const auto& r) { return r.ok; });
  if (all_ok) {
    EndJob(job, JobState::kSucceeded, "");
  } else {
    std::string bad;
    for (const auto& r : job.results) {
      if (!r.ok) bad += (bad.empty() ? "" : "; ") + r.op + " " + std::to_string(r.bytes) + " B: " + r.detail;
    }
    EndJob(job, JobState::kFailed, "results did not verify: " + bad);
  }
}

void Coordinator::SendAbort(const Job& job, const std::string& reason) {
  std::set<std::string> nodes;
  for (const ActorRecord& actor : job.actors) {
    if (!actor.exited && actor.state != ActorState::kLost) nodes.insert(actor.node_id);
  }
  for (const auto& node_id : nodes) {
    const NodeInfo* node = membership_.Find(node_id);
    if (!node || !node->alive) continue;
    auto message = NewMessage(0);
    auto abort = message->payload().initAbortGeneration();
    abort.setJobId(CapText(job.id));
    abort.setGeneration(job.generation);
    abort.setReason(CapText(reason));
    Send(node->peer, *message);
  }
}

void Coordinator::EndJob(Job& job, JobState state, const std::string& error) {
  if (IsFinal(job.state)) return;
  // A generation still holding actors and devices (CloseGeneration leaves kNone or kRestarting).
  const bool generation_open = job.state == JobState::kRunning && job.phase != Phase::kNone &&
                               job.phase != Phase::kRestarting;
  if (!job.generations.empty() && job.generations.back().ending == Ending::kRunning) {
    GenerationRecord& record = job.generations.back();
    record.ended_unix_ms = UnixMillis();
    record.ending = state == JobState::kSucceeded  ? Ending::kSucceeded
                    : state == JobState::kCancelled ? Ending::kCancelled
                                                    : Ending::kFailed;
  }
  job.state = state;
  job.error = error;
  job.phase = Phase::kNone;
  job.finished_unix_ms = UnixMillis();
  job.watchdog.Disarm();
  job.recovering_since.reset();
  if (generation_open) {
    metrics_.OnGeneration(state == JobState::kSucceeded ? "completed" : "aborted");
    for (auto& actor : job.actors) {
      if (actor.state != ActorState::kSucceeded && actor.state != ActorState::kFailed &&
          actor.state != ActorState::kLost) {
        actor.state = ActorState::kFailed;
        if (actor.detail.empty()) actor.detail = "aborted with its generation";
      }
    }
    SendAbort(job, state == JobState::kSucceeded ? "job succeeded" : error);
    FreeDevices(job);
    kv_.ErasePrefix("job/" + job.id + "/");
  }
  if (state == JobState::kSucceeded) {
    spdlog::info("job {} succeeded", job.id);
  } else {
    spdlog::warn("job {} {}: {}", job.id, JobStateName(state), error);
  }
  Persist(job);
}

void Coordinator::FreeDevices(const Job& job) {
  for (auto& [node_id, node] : membership_.mutable_nodes()) {
    for (auto& device : node.devices) {
      if (device.busy_job == job.id) device.busy_job.clear();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Supervision

Fault Coordinator::MakeFault(const Job& job, FaultKind kind, int rank, const std::string& node,
                             std::string detail) const {
  Fault fault;
  fault.kind = kind;
  fault.at = clock_->Now();
  fault.unix_ms = UnixMillis();
  fault.rank = rank;
  fault.node = node;
  if (job.spec.kind == placement::JobKind::kTrain) fault.step = job.train.step;
  fault.detail = std::move(detail);
  return fault;
}

void Coordinator::OnFault(Job& job, Fault fault) {
  const bool aborting = job.state == JobState::kRunning && job.phase == Phase::kAborting;
  if (!job.GenerationLive() && !aborting) return;
  const std::string what = DescribeFault(fault);
  job.faults.Add(std::move(fault));
  if (aborting) {
    spdlog::info("job {} generation {}: also {}", job.id, job.generation, what);
    return;
  }
  // The first fault: abort now, name the cause once every actor is gone (its agent's exit report
  // can arrive after its peers' reports of a broken socket).
  spdlog::warn("job {} generation {}: {}; aborting the generation", job.id, job.generation, what);
  BeginAbort(job, Ending::kFault, what);
}

void Coordinator::BeginAbort(Job& job, Ending ending, const std::string& reason) {
  const TimePoint now = clock_->Now();
  job.phase = Phase::kAborting;
  job.abort_ending = ending;
  job.abort_started = now;
  job.abort_deadline = now + options_.abort_grace;
  job.watchdog.Disarm();
  SendAbort(job, reason);
}

void Coordinator::Supervise() {
  const TimePoint now = clock_->Now();
  for (auto& [id, job] : jobs_) {
    if (job.state != JobState::kRunning) continue;
    if (job.phase == Phase::kAborting) {
      const bool all_gone =
          std::all_of(job.actors.begin(), job.actors.end(), [](const ActorRecord& actor) {
            return actor.exited || actor.state == ActorState::kLost;
          });
      if (all_gone || now >= job.abort_deadline) CloseGeneration(job);
    } else if (job.phase == Phase::kRunning && job.watchdog.Expired(now)) {
      // Alive but silent: a stopped process (its agent says which) or a deadlock.
      int rank = -1;
      std::string node, stopped;
      for (const ActorRecord& actor : job.actors) {
        const NodeInfo* host = membership_.Find(actor.node_id);
        if (host == nullptr || !host->stopped_actors.count(ActorKey(
                                   job.id, job.generation, static_cast<uint32_t>(actor.rank)))) {
          continue;
        }
        if (rank < 0) {
          rank = actor.rank;
          node = actor.node_id;
        }
        stopped += (stopped.empty() ? "" : ", ") + std::to_string(actor.rank);
      }
      const double silent = job.watchdog.SilentSeconds(now);
      const double interval = job.watchdog.report_interval_seconds();
      std::string detail =
          (rank >= 0 ? "is stopped and" : "(every rank)") + std::string(" made no progress for ") +
          FormatSeconds(silent) + " (the watchdog allows max(" +
          FormatSeconds(Seconds(WatchdogFloor(job))) +
          ", " + std::to_string(static_cast<int>(ProgressWatchdog::kStepsOfSlack)) + " x " +
          FormatSeconds(interval) + " between reports))";
      if (rank >= 0 && stopped.find(',') != std::string::npos) detail += "; stopped ranks " + stopped;
      Fault fault = MakeFault(job, FaultKind::kHung, rank, node, detail);
      fault.unseen_seconds = silent;
      OnFault(job, std::move(fault));
    } else if (job.phase == Phase::kRestarting && job.Elastic() &&
               now - job.restart_waiting_since >= job.spec.elastic.wait_timeout) {
      EndJob(job, JobState::kFailed,
             "waited " + FormatSeconds(Seconds(job.spec.elastic.wait_timeout)) +
                 " (elastic.wait_timeout_s) to restart: " + job.waiting_reason);
    }
  }
}

void Coordinator::CloseGeneration(Job& job) {
  const TimePoint now = clock_->Now();
  GenerationRecord& record = job.generations.back();
  record.ended_unix_ms = UnixMillis();
  record.last_step = std::max(record.last_step, job.train.step);
  record.abort_seconds = SecondsBetween(job.abort_started, now);
  for (ActorRecord& actor : job.actors) {
    if (actor.exited || actor.state == ActorState::kLost) continue;
    actor.state = ActorState::kLost;
    actor.detail = "had not exited " + FormatSeconds(record.abort_seconds) + " after the abort";
  }
  FreeDevices(job);
  kv_.ErasePrefix("job/" + job.id + "/");
  metrics_.OnGeneration("aborted");
  std::string error;
  if (job.abort_ending == Ending::kGrow) {
    record.ending = Ending::kGrow;
  } else {
    record.ending = Ending::kFault;
    const Fault& cause = job.faults.RootCause();
    record.cause = cause;
    record.detection_seconds = cause.unseen_seconds;
    for (const Fault& consequence : job.faults.Consequences()) {
      record.consequences.push_back(DescribeFault(consequence));
    }
    error = "generation " + std::to_string(job.generation) + ": " + DescribeFault(cause);
    if (!record.consequences.empty()) {
      error += " (then " + std::to_string(record.consequences.size()) + " consequence" +
               (record.consequences.size() == 1 ? "" : "s") + ": " + record.consequences.front() +
               (record.consequences.size() > 1 ? "; ..." : "") + ")";
    }
    spdlog::warn("job {} {}; aborted in {:.3f} s", job.id, error, record.abort_seconds);
  }
  job.faults.clear();
  job.phase = Phase::kNone;  // closed: its actors are gone and its devices free
  if (!job.Elastic()) {
    EndJob(job, JobState::kFailed, error);
    return;
  }
  if (record.ending == Ending::kFault) {
    const RestartVerdict verdict = DecideRestart(job.spec.elastic, job.generations, UnixMillis());
    if (!verdict.restart) {
      EndJob(job, JobState::kFailed, "restarts stopped: " + verdict.reason);
      return;
    }
    metrics_.OnRestart(FaultKindName(record.cause->kind));
    // Recovery runs from the first fault seen (the abort), which may precede the cause's own
    // report: a killed agent's peers see broken sockets before its node is declared lost.
    job.recovering_since = job.abort_started;
  } else {
    // A grow is a restart too, from the step just committed: its recovery is measured from now.
    job.recovering_since = now;
  }
  // Between generations: decide where to resume (the newest committed step), then wait for
  // devices for a layout within min..max (TryStartPendingJobs).
  job.phase = Phase::kRestarting;
  job.error = error;
  job.restart_waiting_since = now;
  job.train.start = TrainRecord::Start::kUndecided;
  if (job.spec.parallel_auto) ForgetAutoPlan(job);  // the planner plans on what is there now
  job.waiting_reason = "restarting after generation " + std::to_string(job.generation);
  spdlog::info("job {}: restarting after generation {} ({})", job.id, job.generation,
               record.ending == Ending::kGrow ? "to grow" : error);
  Persist(job);
  TryStartPendingJobs();
}

void Coordinator::MaybeGrow(Job& job) {
  if (!job.Elastic() || job.spec.parallel_auto || !job.GenerationLive() ||
      job.phase != Phase::kRunning || job.train.last_committed_step >= job.spec.train.steps ||
      job.World() >= job.spec.elastic.max_actors) {
    return;
  }
  const int free = CountDevices(membership_, DeviceKindOf(job.spec)).free;
  if (free == 0) return;
  auto larger = placement::ElasticLayout(job.spec, job.World() + free);
  if (!larger.ok() || larger->world() <= job.World()) return;
  const std::string reason = "growing from " + std::to_string(job.World()) + " to " +
                             std::to_string(larger->world()) + " actors after step " +
                             std::to_string(job.train.last_committed_step);
  spdlog::info("job {} generation {}: {}", job.id, job.generation, reason);
  BeginAbort(job, Ending::kGrow, reason);
}

void Coordinator::CheckDeadlines() {
  const TimePoint now = clock_->Now();
  for (auto& [id, job] : jobs_) {
    if (!job.GenerationLive()) continue;
    if (job.phase != Phase::kRunning && now >= job.bootstrap_deadline) {
      // Name the members that never came; those that came and waited are only counted.
      std::string report;
      for (const auto& group : job.groups) {
        std::string missing, waited;
        for (int rank : group.ranks) {
          if (group.ready.count(rank)) continue;
          const ActorRecord& actor = job.actors[rank];
          if (group.joined.count(rank)) {
            waited += (waited.empty() ? "" : ", ") + std::to_string(rank);
            continue;
          }
          const char* why = actor.state == ActorState::kSpawning ? "never registered"
                                                                  : "never joined";
          missing += (missing.empty() ? "" : "; ") + std::string("rank ") +
                     std::to_string(rank) + " (node " + actor.node_id + ", " +
                     DeviceLabel(actor.device) +
                     (actor.pid ? ", pid " + std::to_string(actor.pid) : std::string()) + ", " +
                     why + ")";
        }
        if (missing.empty() && waited.empty()) continue;
        report += (report.empty() ? "" : "; ") + std::string("group ") + group.id +
                  (missing.empty() ? "" : " is missing " + missing) +
                  (waited.empty() ? " did not connect"
                                  : (missing.empty() ? ": ranks " : ", while ranks ") + waited +
                                        " joined and waited");
      }
      OnFault(job, MakeFault(job, FaultKind::kBootstrap, -1, "",
                             "bootstrap timed out after " +
                                 FormatSeconds(Seconds(job.spec.bootstrap_timeout)) + ": " +
                                 report));
    } else if (now >= job.run_deadline) {
      EndJob(job, JobState::kFailed,
             "run timeout of " + FormatSeconds(Seconds(job.spec.run_timeout)) + " reached");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Status, persistence, metrics

absl::Status Coordinator::OnStatusRequest(const std::string& peer, uint64_t request_id,
                                          wire::StatusRequest::Reader request) {
  const std::string job_id = Str(request.getJobId());
  if (!job_id.empty() && !jobs_.count(job_id)) return absl::NotFoundError("no job '" + job_id + "'");
  auto reply = NewMessage(request_id);
  FillStatus(reply->payload().initClusterStatus(), job_id);
  Send(peer, *reply);
  return absl::OkStatus();
}

void Coordinator::FillStatus(wire::ClusterStatus::Builder status, const std::string& job_id) {
  const TimePoint now = clock_->Now();
  status.setClusterId(CapText(options_.cluster_id));
  status.setMetricsAddress(CapText(metrics_server_->address()));
  status.setCoordinatorUptimeMs(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now - started_).count()));
  const auto& nodes = membership_.nodes();
  auto node_list = status.initNodes(static_cast<unsigned>(nodes.size()));
  unsigned n = 0;
  for (const auto& [id, node] : nodes) {
    auto out = node_list[n++];
    out.setNodeId(CapText(node.node_id));
    out.setHostname(CapText(node.hostname));
    out.setAddress(CapText(node.address));
    out.setState(node.alive ? "alive" : "dead");
    out.setMetricsAddress(CapText(node.metrics_address));
    out.setLastHeartbeatAgoMs(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(now - node.last_heartbeat).count()));
    auto devices = out.initDevices(static_cast<unsigned>(node.devices.size()));
    uint32_t busy = 0;
    for (size_t d = 0; d < node.devices.size(); ++d) {
      FillDevice(devices[d], node.devices[d]);
      busy += node.devices[d].busy_job.empty() ? 0 : 1;
    }
    out.setActors(busy);
    if (const NodeCalibration* measured = calibration_.Find(node.node_id)) {
      auto calibration = out.initCalibration();
      const ComputeRate compute = measured->Compute();
      calibration.setComputeFlops(compute.flops);
      calibration.setComputeHalfDim(compute.half_dim);
      calibration.setOptimizerBytesPerSecond(compute.optimizer_bytes_per_second);
      calibration.setIntraBusBytesPerSecond(measured->intra.bus_bytes_per_second);
      calibration.setIntraLatencySeconds(measured->intra.latency_seconds);
      calibration.setInterBusBytesPerSecond(measured->inter.bus_bytes_per_second);
      calibration.setInterLatencySeconds(measured->inter.latency_seconds);
      calibration.setJobId(CapText(measured->job_id));
      calibration.setMeasuredUnixMs(measured->measured_unix_ms);
      // The node's devices that were measured (one it no longer reports is left out).
      std::vector<std::pair<const DeviceInfo*, ComputeRate>> rates;
      for (const DeviceInfo& device : node.devices) {
        auto it = measured->device_compute.find(DeviceLabel(device));
        if (it != measured->device_compute.end()) rates.emplace_back(&device, it->second);
      }
      auto list = calibration.initDevices(static_cast<unsigned>(rates.size()));
      for (unsigned i = 0; i < rates.size(); ++i) {
        FillDevice(list[i].initDevice(), *rates[i].first);
        list[i].setComputeFlops(rates[i].second.flops);
        list[i].setComputeHalfDim(rates[i].second.half_dim);
        list[i].setOptimizerBytesPerSecond(rates[i].second.optimizer_bytes_per_second);
      }
    }
  }
  std::vector<const Job*> selected;
  for (const auto& id : job_order_) {
    if (job_id.empty() || id == job_id) selected.push_back(&jobs_.at(id));
  }
  auto job_list = status.initJobs(static_cast<unsigned>(selected.size()));
  for (size_t j = 0; j < selected.size(); ++j) {
    const Job& job = *selected[j];
    auto out = job_list[j];
    out.setJobId(CapText(job.id));
    out.setName(CapText(job.spec.name));
    out.setKind(CapText(std::string(placement::JobKindName(job.spec.kind))));
    out.setState(CapText(std::string(JobStateName(job.state))));
    out.setGeneration(job.generation);
    out.setWorldSize(static_cast<uint32_t>(job.World()));
    out.setError(CapText(job.WantsDevices() ? job.waiting_reason : job.error));
    out.setSubmittedUnixMs(job.submitted_unix_ms);
    out.setFinishedUnixMs(job.finished_unix_ms);
    out.setPhase(CapText(std::string(PhaseName(job.phase))));
    out.setBackend(CapText(job.backend));
    auto actors = out.initActors(static_cast<unsigned>(job.actors.size()));
    for (size_t a = 0; a < job.actors.size(); ++a) {
      const ActorRecord& actor = job.actors[a];
      actors[a].setRank(static_cast<uint32_t>(actor.rank));
      actors[a].setNodeId(CapText(actor.node_id));
      FillDevice(actors[a].initDevice(), actor.device);
      actors[a].setPid(actor.pid);
      actors[a].setState(CapText(std::string(ActorStateName(actor.state))));
      actors[a].setDetail(CapText(actor.detail));
      actors[a].setMetricsAddress(CapText(actor.metrics_address));
    }
    auto results = out.initResults(static_cast<unsigned>(job.results.size()));
    for (size_t r = 0; r < job.results.size(); ++r) {
      const auto& result = job.results[r];
      results[r].setOp(CapText(result.op));
      results[r].setBytes(result.bytes);
      results[r].setRanks(result.ranks);
      results[r].setSeconds(result.seconds);
      results[r].setAlgorithmGBps(result.algorithm_gbps);
      results[r].setBusGBps(result.bus_gbps);
      results[r].setOk(result.ok);
      results[r].setDetail(CapText(result.detail));
    }
    if (job.spec.kind == placement::JobKind::kTrain) FillTrainProgress(out.initTrain(), job);
  }
}

void Coordinator::FillTrainProgress(wire::TrainProgress::Builder out, const Job& job) {
  const TrainRecord& progress = job.train;
  const placement::TrainSpec& spec = job.spec.train;
  const placement::ParallelSpec& parallel = job.spec.parallel;
  out.setStep(static_cast<uint64_t>(progress.step));
  out.setLoggedStep(static_cast<uint64_t>(progress.logged_step));
  out.setSteps(static_cast<uint64_t>(spec.steps));
  out.setLoss(progress.loss);
  out.setTokensPerSecond(progress.tokens_per_second);
  out.setComputeSeconds(progress.compute_seconds);
  out.setCommSeconds(progress.comm_seconds);
  out.setBubbleSeconds(progress.bubble_seconds);
  double eta = 0;
  const int64_t left = spec.steps - progress.step;
  if (job.state == JobState::kRunning && progress.step > 0 && left > 0) {
    if (progress.step > progress.first_step && progress.first_step >= 0) {
      // The pace of this generation so far, everything included (data, checkpoints, reports).
      eta = Seconds(progress.last_report - progress.first_report) /
            static_cast<double>(progress.step - progress.first_step) * static_cast<double>(left);
    } else if (progress.tokens_per_second > 0) {
      eta = static_cast<double>(left * spec.batch * spec.seq_len) / progress.tokens_per_second;
    }
  }
  out.setEtaSeconds(eta);
  out.setLastCommittedStep(progress.last_committed_step);
  out.setCheckpointDir(CapText(progress.saving_dir));
  // An auto job not planned yet has no layout: its fields stay 0.
  if (!job.spec.parallel_auto || job.plan.planned) {
    out.setTp(static_cast<uint32_t>(parallel.tp));
    out.setPp(static_cast<uint32_t>(parallel.pp));
    out.setDp(static_cast<uint32_t>(parallel.dp));
    out.setZero(static_cast<uint32_t>(parallel.zero));
    out.setMicroBatch(static_cast<uint64_t>(placement::MicroBatchSize(parallel, spec.batch)));
    out.setMicroBatches(static_cast<uint64_t>(placement::MicroBatchCount(parallel, spec.batch)));
  }
  out.setBatch(static_cast<uint64_t>(spec.batch));
  out.setSeqLen(static_cast<uint64_t>(spec.seq_len));
  out.setAutoPlan(job.spec.parallel_auto);
  out.setPredictedStepSeconds(job.plan.step_seconds);
  out.setPredictedMemoryBytes(static_cast<uint64_t>(std::max<int64_t>(job.plan.memory_bytes, 0)));
  out.setPlanSummary(CapText(job.plan.summary));
  out.setPredictionCalibrated(job.PredictionCalibrated() && job.plan.step_seconds > 0);
  out.setResumedFromStep(progress.resumed_step);
  auto skipped = out.initSkippedCheckpoints(static_cast<unsigned>(progress.skipped.size()));
  for (size_t i = 0; i < progress.skipped.size(); ++i) {
    skipped[static_cast<unsigned>(i)].setStep(progress.skipped[i].step);
    skipped[static_cast<unsigned>(i)].setReason(CapText(progress.skipped[i].reason));
  }
  // init_from is used only by a start that resumes nothing, once that is decided.
  if (progress.start == TrainRecord::Start::kDecided && progress.resume_manifest.empty()) {
    out.setInitializedFrom(CapText(spec.init_from));
  }
  out.setElastic(job.Elastic());
  out.setMinActors(static_cast<uint32_t>(std::max(job.spec.elastic.min_actors, 0)));
  out.setMaxActors(static_cast<uint32_t>(std::max(job.spec.elastic.max_actors, 0)));
  auto generations = out.initGenerations(static_cast<unsigned>(job.generations.size()));
  for (size_t i = 0; i < job.generations.size(); ++i) {
    const GenerationRecord& record = job.generations[i];
    auto g = generations[static_cast<unsigned>(i)];
    g.setGeneration(record.generation);
    g.setStartedUnixMs(record.started_unix_ms);
    g.setEndedUnixMs(record.ended_unix_ms);
    g.setPlan(CapText(record.plan));
    g.setResumedStep(record.resumed_step);
    g.setLastStep(record.last_step);
    g.setEnding(CapText(std::string(EndingName(record.ending))));
    if (record.cause) {
      g.setCause(CapText(DescribeFault(*record.cause)));
      g.setCauseKind(CapText(std::string(FaultKindName(record.cause->kind))));
    }
    auto consequences = g.initConsequences(static_cast<unsigned>(record.consequences.size()));
    for (size_t c = 0; c < record.consequences.size(); ++c) {
      consequences.set(static_cast<unsigned>(c), CapText(record.consequences[c]));
    }
    g.setStepsLost(record.steps_lost);
    g.setRecoverySeconds(record.recovery_seconds);
    g.setDetectionSeconds(record.detection_seconds);
    g.setAbortSeconds(record.abort_seconds);
  }
}

void Coordinator::Persist(const Job& job) {
  if (options_.state_dir.empty()) return;
  nlohmann::json record = {
      {"id", job.id},
      {"spec_yaml", job.spec_yaml},
      {"spec_dir", job.spec_dir},
      {"work_dir", job.work_dir},
      {"state", JobStateName(job.state)},
      {"error", job.error},
      {"generation", job.generation},
      {"submitted_unix_ms", job.submitted_unix_ms},
      {"finished_unix_ms", job.finished_unix_ms},
  };
  nlohmann::json results = nlohmann::json::array();
  for (const auto& r : job.results) {
    results.push_back({{"op", r.op}, {"bytes", r.bytes}, {"ranks", r.ranks},
                       {"seconds", r.seconds}, {"algorithm_gbps", r.algorithm_gbps},
                       {"bus_gbps", r.bus_gbps}, {"ok", r.ok}, {"detail", r.detail}});
  }
  record["results"] = results;
  if (job.spec.kind == placement::JobKind::kTrain) {
    // NaN has no JSON spelling: a loss not yet reported is null.
    const nlohmann::json loss =
        std::isnan(job.train.loss) ? nlohmann::json() : nlohmann::json(job.train.loss);
    nlohmann::json skipped = nlohmann::json::array();
    for (const checkpoint::SkippedStep& step : job.train.skipped) {
      skipped.push_back({{"step", step.step}, {"reason", step.reason}});
    }
    record["train"] = {{"step", job.train.step},
                       {"loss", loss},
                       {"last_committed_step", job.train.last_committed_step},
                       {"committed_here", job.train.committed_here},
                       {"resumed_step", job.train.resumed_step},
                       {"skipped_checkpoints", skipped}};
    nlohmann::json generations = nlohmann::json::array();
    for (const GenerationRecord& g : job.generations) {
      nlohmann::json entry = {{"generation", g.generation},
                              {"started_unix_ms", g.started_unix_ms},
                              {"ended_unix_ms", g.ended_unix_ms},
                              {"plan", g.plan},
                              {"world", g.world},
                              {"resumed_step", g.resumed_step},
                              {"last_step", g.last_step},
                              {"ending", EndingName(g.ending)},
                              {"consequences", g.consequences},
                              {"steps_lost", g.steps_lost},
                              {"recovery_seconds", g.recovery_seconds},
                              {"detection_seconds", g.detection_seconds},
                              {"abort_seconds", g.abort_seconds}};
      if (g.cause) {
        entry["cause"] = {{"kind", FaultKindName(g.cause->kind)}, {"unix_ms", g.cause->unix_ms},
                          {"rank", g.cause->rank},  {"node", g.cause->node},
                          {"step", g.cause->step},  {"detail", g.cause->detail}};
      }
      generations.push_back(std::move(entry));
    }
    record["generations"] = std::move(generations);
    if (job.plan.planned) {
      // The spec says only `parallel: auto`: the history keeps what the planner chose.
      const placement::ParallelSpec& p = job.spec.parallel;
      record["plan"] = {{"tp", p.tp},
                        {"pp", p.pp},
                        {"dp", p.dp},
                        {"zero", p.zero},
                        {"micro_batch", p.micro_batch},
                        {"stage_layers", p.stage_layers},
                        {"step_seconds", job.plan.step_seconds},
                        {"memory_bytes", job.plan.memory_bytes},
                        {"summary", job.plan.summary}};
    }
  }
  const auto path = std::filesystem::path(options_.state_dir) / "jobs" / (job.id + ".json");
  auto status =
      checkpoint::WriteFileAtomically(checkpoint::DefaultFileSystem(), path.string(), record.dump(2));
  if (!status.ok()) spdlog::error("persisting job {}: {}", job.id, Text(status.message()));
}

absl::Status Coordinator::LoadHistory() {
  if (options_.state_dir.empty()) return absl::OkStatus();
  const auto dir = std::filesystem::path(options_.state_dir) / "jobs";
  std::vector<Job> loaded;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    const std::string where = entry.path().string();
    try {
      std::ifstream in(entry.path());
      const auto record = nlohmann::json::parse(in);
      Job job;
      job.id = record.at("id").get<std::string>();
      job.spec_yaml = record.at("spec_yaml").get<std::string>();
      // Records from before the folders were kept resolve against the coordinator's.
      job.spec_dir = record.value("spec_dir", AbsoluteDir("."));
      job.work_dir = record.value("work_dir", AbsoluteDir("."));
      auto spec = placement::ParseJobSpec(job.spec_yaml, where, PathBaseOf(job));
      if (!spec.ok()) {
        spdlog::error("skipping {}: {}", where, Text(spec.status().message()));
        continue;
      }
      job.spec = *spec;
      job.backend = std::string(placement::BackendName(placement::ResolveBackend(job.spec)));
      if (job.spec.parallel_auto) job.auto_max_actors = AutoMaxActors(job.spec);
      if (job.spec.kind == placement::JobKind::kTrain) {
        job.train.saving_dir = ResolveUnder(job.work_dir, job.spec.train.checkpoint.dir);
        const auto train = record.value("train", nlohmann::json::object());
        job.train.step = train.value("step", int64_t{0});
        if (train.contains("loss") && train["loss"].is_number()) {
          job.train.loss = train["loss"].get<double>();
        }
        job.train.last_committed_step = train.value("last_committed_step", int64_t{-1});
        job.train.committed_here = train.value("committed_here", false);
        for (const auto& entry : record.value("generations", nlohmann::json::array())) {
          job.generations.push_back(GenerationFromJson(entry));
        }
        job.train.resumed_step = train.value("resumed_step", int64_t{0});
        for (const auto& skipped : train.value("skipped_checkpoints", nlohmann::json::array())) {
          job.train.skipped.push_back(
              {skipped.at("step").get<int64_t>(), skipped.at("reason").get<std::string>()});
        }
      }
      const std::string state = record.at("state").get<std::string>();
      if (job.spec.parallel_auto && state != "pending" && record.contains("plan")) {
        // What ran (or was about to): a job still pending plans afresh when it starts.
        const auto& plan = record["plan"];
        placement::ParallelSpec layout;
        layout.tp = plan.at("tp").get<int>();
        layout.pp = plan.at("pp").get<int>();
        layout.dp = plan.at("dp").get<int>();
        layout.zero = plan.at("zero").get<int>();
        layout.micro_batch = plan.value("micro_batch", int64_t{0});
        layout.stage_layers = plan.value("stage_layers", std::vector<int>{});
        if (auto applied = placement::ApplyPlannedLayout(job.spec, layout); applied.ok()) {
          job.plan.planned = true;
          job.plan.step_seconds = plan.value("step_seconds", 0.0);
          job.plan.memory_bytes = plan.value("memory_bytes", int64_t{0});
          job.plan.summary = plan.value("summary", "");
        } else {
          spdlog::warn("{}: the recorded plan does not apply: {}", where,
                       Text(applied.message()));
        }
      }
      job.error = record.value("error", "");
      job.generation = record.value("generation", 0u);
      job.submitted_unix_ms = record.value("submitted_unix_ms", int64_t{0});
      job.finished_unix_ms = record.value("finished_unix_ms", int64_t{0});
      for (const auto& r : record.value("results", nlohmann::json::array())) {
        job.results.push_back({r.at("op"), r.at("bytes"), r.at("ranks"), r.at("seconds"),
                               r.at("algorithm_gbps"), r.at("bus_gbps"), r.at("ok"),
                               r.value("detail", "")});
      }
      if (state == "succeeded") {
        job.state = JobState::kSucceeded;
      } else if (state == "cancelled") {
        job.state = JobState::kCancelled;
      } else if (state == "pending") {
        job.state = JobState::kPending;  // still wanted: it starts when devices come
      } else if (state == "running" && job.Elastic()) {
        // Supervision resumes: the generation that ran is over (its agents kill its actors when
        // they register with this coordinator, and its messages are fenced by generation); the
        // job restarts from its newest committed step as the next one.
        job.state = JobState::kRunning;
        job.phase = Phase::kRestarting;
        const TimePoint now = clock_->Now();
        job.restart_waiting_since = now;
        job.recovering_since = now;
        if (job.generations.empty() || job.generations.back().generation != job.generation) {
          GenerationRecord lost;
          lost.generation = job.generation;
          job.generations.push_back(lost);
        }
        GenerationRecord& ended = job.generations.back();
        if (ended.ending == Ending::kRunning) {
          ended.ending = Ending::kFault;
          ended.ended_unix_ms = UnixMillis();
          Fault fault;
          fault.kind = FaultKind::kCoordinatorRestart;
          fault.at = now;
          fault.unix_ms = ended.ended_unix_ms;
          fault.step = job.train.step;
          fault.detail = "ended: the coordinator restarted";
          ended.cause = fault;
          ended.last_step = std::max(ended.last_step, job.train.step);
        }
        job.waiting_reason = "restarting after generation " + std::to_string(job.generation) +
                             " (the coordinator restarted)";
        if (job.spec.parallel_auto) ForgetAutoPlan(job);
      } else {
        job.state = JobState::kFailed;
        if (state == "running") {
          job.error = "the coordinator restarted while generation " +
                      std::to_string(job.generation) + " was running";
          job.finished_unix_ms = UnixMillis();
        }
      }
      loaded.push_back(std::move(job));
    } catch (const std::exception& e) {
      spdlog::error("skipping unreadable job record {}: {}", where, e.what());
    }
  }
  std::sort(loaded.begin(), loaded.end(), [](const Job& a, const Job& b) {
    return a.submitted_unix_ms < b.submitted_unix_ms;
  });
  for (auto& job : loaded) {
    const auto dash = job.id.rfind('-');
    if (dash != std::string::npos) {
      next_job_number_ = std::max<uint64_t>(next_job_number_,
                                            std::strtoull(job.id.c_str() + dash + 1, nullptr, 10) + 1);
    }
    job_order_.push_back(job.id);
    const std::string id = job.id;
    jobs_[id] = std::move(job);
    Persist(jobs_[id]);
  }
  if (!loaded.empty()) spdlog::info("loaded {} jobs from {}", loaded.size(), dir.string());
  return absl::OkStatus();
}

void Coordinator::UpdateGauges() {
  std::map<std::string, int64_t> nodes, actors, jobs;
  std::map<std::pair<std::string, std::string>, int64_t> devices;
  for (const auto& [id, node] : membership_.nodes()) {
    nodes[node.alive ? "alive" : "dead"] += 1;
    for (const auto& device : node.devices) {
      const std::string kind = device.kind == DeviceInfo::Kind::kCuda ? "cuda" : "cpu";
      const std::string state = !node.alive ? "dead" : device.busy_job.empty() ? "free" : "busy";
      devices[{kind, state}] += 1;
    }
  }
  std::map<std::string, monitoring::TrainGauges> train;
  for (const auto& [id, job] : jobs_) {
    jobs[std::string(JobStateName(job.state))] += 1;
    if (job.state != JobState::kRunning) continue;
    for (const auto& actor : job.actors) actors[std::string(ActorStateName(actor.state))] += 1;
    if (job.spec.kind == placement::JobKind::kTrain) {
      train[id] = {static_cast<double>(job.train.step), job.train.loss,
                   job.train.tokens_per_second, static_cast<double>(job.generation),
                   static_cast<double>(job.train.last_committed_step)};
    }
  }
  metrics_.SetTrainJobs(train);
  metrics_.SetNodes(nodes);
  metrics_.SetDevices(devices);
  metrics_.SetActors(actors);
  metrics_.SetJobs(jobs);
}

}  // namespace shardline::coordinator
